//! How long to leave alone a monitor or daemon that keeps timing out (QEMU's
//! QMP, libvirt): the control loop must not spend a timeout on it every
//! interval.

use std::time::{Duration, Instant};

/// A monitor or daemon that timed out: how often in a row, and when to ask
/// it again. Each try at one that hangs costs the caller a whole timeout,
/// and the caller is the control loop: the pause doubles from 1 s to 32 s.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hung {
    pub(crate) times: u32,
    pub(crate) until: Instant,
}

impl Hung {
    /// One more timeout after `before` (if it had timed out already).
    pub(crate) fn again(before: Option<Hung>) -> Hung {
        let times = before.map_or(1, |h| h.times + 1);
        let pause = Duration::from_secs(1 << (times - 1).min(5));
        Hung {
            times,
            until: Instant::now() + pause,
        }
    }

    pub(crate) fn paused(&self) -> bool {
        Instant::now() < self.until
    }
}
