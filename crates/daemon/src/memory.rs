//! The daemon's own memory as its allocator sees it. RSS alone cannot tell a
//! leak (memory still referenced, growing) from fragmentation (freed memory
//! the allocator keeps but cannot give back); the soak and operators need to
//! tell them apart, so the status shows both what is in use and what is held.
//!
//! Read from glibc's `mallinfo2`: the allocator keeps these counts anyway and
//! no crate exposes them safely, so this is the one small FFI call here. It
//! came with glibc 2.33 (Debian 12): a build linked against it needs that
//! glibc or later where it runs (the older `mallinfo` wraps at 4 GiB).

use serde::{Deserialize, Serialize};

/// Heap figures, in bytes, over every malloc arena.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Heap {
    /// Bytes in allocated blocks: what the process still references.
    pub in_use_bytes: u64,
    /// Bytes the allocator holds from the system (brk heaps and mmapped
    /// blocks): in use plus free blocks it kept.
    pub held_bytes: u64,
    /// Of the free bytes held, those at the top of the heaps that
    /// `malloc_trim` could return to the system.
    pub releasable_bytes: u64,
}

impl Heap {
    /// The figures now; `None` where the C library is not glibc.
    pub fn read() -> Option<Heap> {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            // SAFETY: mallinfo2 takes no argument and only reads the
            // allocator's own counters under its arena locks.
            let m = unsafe { libc::mallinfo2() };
            Some(Heap {
                in_use_bytes: (m.uordblks + m.hblkhd) as u64,
                held_bytes: (m.arena + m.hblkhd) as u64,
                releasable_bytes: m.keepcost as u64,
            })
        }
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_allocation_shows_in_use_and_goes_when_freed() {
        // Large enough that other tests' allocations in this process cannot
        // hide it; zeroed, so its pages are never touched.
        // `black_box`: with full optimisation an allocation nobody reads
        // is removed (`cargo test --release` saw 46 kB in use).
        let block = std::hint::black_box(vec![0u8; 256 << 20]);
        let during = Heap::read().expect("glibc");
        assert!(during.in_use_bytes >= 256 << 20, "{during:?}");
        assert!(during.held_bytes >= during.in_use_bytes);
        drop(block);
        let after = Heap::read().unwrap();
        assert!(
            after.in_use_bytes + (200 << 20) <= during.in_use_bytes,
            "{during:?} -> {after:?}"
        );
    }
}
