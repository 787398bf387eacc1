//! Device counters from `/proc/diskstats`, as iostat reads them: time with I/O
//! in flight (for `%util`) and the weighted time in queue (for `aqu-sz`).
//!
//! Parsed by hand: the line is whitespace-separated numbers, and reading a
//! recorded file from a test needs an injectable path, which procfs's reader
//! does not offer.

use crate::cgroup::DevId;
use crate::error::{HostError, Result};
use iofloor_core::DeviceCounters;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskStat {
    pub reads: u64,
    pub sectors_read: u64,
    pub read_ms: u64,
    pub writes: u64,
    pub sectors_written: u64,
    pub write_ms: u64,
    pub in_flight: u64,
    /// Milliseconds with at least one I/O in flight.
    pub io_ticks_ms: u64,
    /// Milliseconds of I/O time weighted by the number in flight.
    pub time_in_queue_ms: u64,
}

impl DiskStat {
    /// The device's own traffic as tenant counters (for a tenant that is a
    /// whole block device, like a VM's exported disk): sectors of 512 bytes,
    /// completion time in ms. The kernel's counters wrap; products and sums
    /// saturate instead of overflowing, and the policy reads a counter that
    /// stops or goes backwards as "no sample", never as a burst.
    pub fn as_tenant_counters(&self) -> iofloor_core::Counters {
        iofloor_core::Counters {
            read_ios: self.reads,
            write_ios: self.writes,
            read_bytes: self.sectors_read.saturating_mul(512),
            write_bytes: self.sectors_written.saturating_mul(512),
            read_seq_ios: 0,
            write_seq_ios: 0,
            latency_ns_total: Some(
                self.read_ms
                    .saturating_add(self.write_ms)
                    .saturating_mul(1_000_000),
            ),
            completions: Some(self.reads.saturating_add(self.writes)),
        }
    }

    pub fn counters(&self) -> DeviceCounters {
        DeviceCounters {
            busy_ns: self.io_ticks_ms.saturating_mul(1_000_000),
            queue_ns: self.time_in_queue_ms.saturating_mul(1_000_000),
            completions: self.reads.saturating_add(self.writes),
        }
    }
}

/// Reads one device's line from a diskstats file.
pub struct DiskStats {
    path: PathBuf,
    dev: DevId,
}

impl DiskStats {
    pub fn new(path: impl Into<PathBuf>, dev: DevId) -> DiskStats {
        DiskStats {
            path: path.into(),
            dev,
        }
    }

    pub fn proc(dev: DevId) -> DiskStats {
        DiskStats::new("/proc/diskstats", dev)
    }

    pub fn read(&self) -> Result<DiskStat> {
        let text = std::fs::read_to_string(&self.path).map_err(|e| HostError::io(&self.path, e))?;
        parse(&text, self.dev, &self.path)
    }
}

/// `dev`'s line of a `/proc/diskstats` text; a text without one is an error.
pub fn parse(text: &str, dev: DevId, origin: &Path) -> Result<DiskStat> {
    for (n, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 14 {
            continue;
        }
        if f[0].parse::<u32>().ok() != Some(dev.major)
            || f[1].parse::<u32>().ok() != Some(dev.minor)
        {
            continue;
        }
        let num = |i: usize| -> Result<u64> {
            f[i].parse().map_err(|_| {
                HostError::malformed(
                    origin,
                    Some(n + 1),
                    format!("field {} `{}` is not a number", i + 1, f[i]),
                )
            })
        };
        return Ok(DiskStat {
            reads: num(3)?,
            sectors_read: num(5)?,
            read_ms: num(6)?,
            writes: num(7)?,
            sectors_written: num(9)?,
            write_ms: num(10)?,
            in_flight: num(11)?,
            io_ticks_ms: num(12)?,
            time_in_queue_ms: num(13)?,
        });
    }
    Err(HostError::malformed(
        origin,
        None,
        format!("no line for device {dev}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "   7       0 loop0 0 0 0 0 3872 0 495616 19941 0 4932 19941 0 0 0 0 0 0\n 254       0 vda 61 0 4402 28 0 0 0 0 2 50 28 0 0 0 0 0 0\n";

    #[test]
    fn reads_the_device_line() {
        let s = parse(SAMPLE, DevId { major: 7, minor: 0 }, Path::new("x")).unwrap();
        assert_eq!(s.writes, 3872);
        assert_eq!(s.as_tenant_counters().write_bytes, 495616 * 512);
        assert_eq!(
            s.as_tenant_counters().latency_ns_total,
            Some(19_941_000_000)
        );
        assert_eq!(s.io_ticks_ms, 4932);
        assert_eq!(s.time_in_queue_ms, 19941);
        assert_eq!(s.counters().queue_ns, 19_941_000_000);
        let vda = parse(
            SAMPLE,
            DevId {
                major: 254,
                minor: 0,
            },
            Path::new("x"),
        )
        .unwrap();
        assert_eq!((vda.reads, vda.in_flight), (61, 2));
        assert!(parse(SAMPLE, DevId { major: 8, minor: 0 }, Path::new("x"))
            .unwrap_err()
            .to_string()
            .contains("no line for device 8:0"));
    }
}
