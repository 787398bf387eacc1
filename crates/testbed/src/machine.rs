//! How real tests in different test binaries share one machine when the
//! suite runs two binaries side by side (`scripts/timed-tests.py`). Most
//! real tests wait on a device of their own at a few per cent of a core
//! (the rig's bench used 6 % of the machine's CPU, measured), so two of
//! them run at once without disturbing each other. A test that needs most
//! of a core, or a quiet CPU, cannot share: a TCG guest (about a core), a
//! browser, a test that measures timing or CPU time. Such a test holds
//! [`claim_cpu`] while it runs, and no two of them run together; every
//! other test judges only what it made itself (its own devices, the
//! cgroups of its own bench's PID), so it needs no claim.
//!
//! The claim is an exclusive `flock(2)` on [`CPU_LOCK`]: the kernel drops
//! it when the holder's file is closed, also when a test process dies, so
//! a crashed test never leaves the machine claimed. Inside one binary the
//! tests still take their own mutex first (they share names and ports).

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::path::Path;
use std::time::Instant;

/// The lock file of [`claim_cpu`] (its directory made on first use).
pub const CPU_LOCK: &str = "/run/iofloor/test-locks/cpu.lock";

/// The machine's CPU as claimed by one test; released when dropped (or
/// when the process ends).
#[derive(Debug)]
pub struct CpuClaim {
    _file: File,
}

/// Waits until no other test holds the machine's CPU, then holds it. Says
/// on stderr how long it waited (the test's time then includes another
/// binary's).
pub fn claim_cpu() -> io::Result<CpuClaim> {
    claim_at(Path::new(CPU_LOCK))
}

fn claim_at(path: &Path) -> io::Result<CpuClaim> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    match file.try_lock() {
        Ok(()) => return Ok(CpuClaim { _file: file }),
        Err(TryLockError::Error(e)) => return Err(e),
        Err(TryLockError::WouldBlock) => {}
    }
    let started = Instant::now();
    file.lock()?;
    eprintln!(
        "waited {:.1} s for {}, held by a test in another binary",
        started.elapsed().as_secs_f64(),
        path.display()
    );
    Ok(CpuClaim { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A second claim waits until the first is dropped; a claim whose
    /// holder is gone is free again. (In a temporary directory, so that
    /// tests running beside this one are not disturbed.)
    #[test]
    fn a_claim_waits_for_the_one_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locks/cpu.lock");
        let first = claim_at(&path).unwrap();
        let (tx, rx) = mpsc::channel();
        let waiter_path = path.clone();
        let waiter = std::thread::spawn(move || {
            let second = claim_at(&waiter_path).unwrap();
            tx.send(()).unwrap();
            second
        });
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
        drop(first);
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        drop(waiter.join().unwrap());
        drop(claim_at(&path).unwrap());
    }
}
