//! Enforcement lag: from writing a throttle to its effect on a real device.
//!
//! A closed-loop fio reader runs in a fresh cgroup; its counters are sampled
//! every 10 ms; a cap well below its rate is written; the lag is the time from
//! the write until the rate over the following 100 ms is within 20 % of the
//! cap. Repeated, and the median reported. This is a measurement printed for
//! the reader, not a pass/fail timing test.

use crate::{BenchError, Result};
use iofloor_core::Caps;
use iofloor_host::cgroup::{self, DevId};
use iofloor_host::fio::FioJob;
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize)]
pub struct LagTrial {
    pub iops_before: f64,
    pub iops_after: f64,
    /// Seconds from the write to the first 100 ms at the cap; None if never within 1 s.
    pub lag_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LagResult {
    pub cap_iops: f64,
    pub trials: Vec<LagTrial>,
    pub median_lag_s: Option<f64>,
}

const SAMPLE: Duration = Duration::from_millis(10);
const WINDOW: usize = 10; // samples: 100 ms

fn sample_series(
    io: &dyn cgroup::IoController,
    cg: &Path,
    n: usize,
) -> Result<Vec<(Instant, u64)>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let c = io.read(cg)?;
        out.push((Instant::now(), c.read_ios + c.write_ios));
        std::thread::sleep(SAMPLE);
    }
    Ok(out)
}

fn rate(a: (Instant, u64), b: (Instant, u64)) -> f64 {
    (b.1 - a.1) as f64 / (b.0 - a.0).as_secs_f64().max(1e-6)
}

/// Stops a trial's fio (SIGTERM: it ends its I/O cleanly) and removes its
/// cgroup, also when the trial fails.
struct Cleanup<'a>(&'a Path, std::path::PathBuf, Option<std::process::Child>);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if let Some(mut c) = self.2.take() {
            if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
            let _ = c.wait();
        }
        let _ = cgroup::remove_when_empty(self.0, &self.1, Duration::from_secs(10));
    }
}

pub fn enforcement_lag(
    device: &Path,
    cgroup_root: &Path,
    cap_iops: f64,
    trials: u32,
    work: &Path,
) -> Result<LagResult> {
    let dev = DevId::of_block_device(device).map_err(|e| BenchError::Invalid(e.to_string()))?;
    let io =
        cgroup::controller(cgroup_root, dev).map_err(|e| BenchError::Invalid(e.to_string()))?;
    let mut results = Vec::new();
    for t in 0..trials {
        let cg = std::path::PathBuf::from(format!("iofloor-lag-{}-{t}", std::process::id()));
        cgroup::create(cgroup_root, &cg)?;
        let job = FioJob::new(
            format!("lag{t}"),
            device,
            "randread",
            4096,
            8,
            30.0,
            work.join(format!("lag{t}.json")),
        );
        let child = job.spawn_in(&cgroup_root.join(&cg).join("cgroup.procs"))?;
        let guard = Cleanup(cgroup_root, cg.clone(), Some(child));
        std::thread::sleep(Duration::from_millis(1500));
        let before = sample_series(io.as_ref(), &cg, 30)?;
        let iops_before = rate(before[0], before[before.len() - 1]);
        if iops_before < 2.0 * cap_iops {
            return Err(BenchError::Invalid(format!(
                "{} does only {iops_before:.0} IOPS uncapped; pick a --cap well below that",
                device.display()
            )));
        }
        let written = Instant::now();
        io.set_caps(
            &cg,
            &Caps {
                read_iops: Some(cap_iops),
                ..Caps::NONE
            },
        )?;
        let after = sample_series(io.as_ref(), &cg, 150)?;
        let lag_s = (0..after.len().saturating_sub(WINDOW))
            .find(|&i| rate(after[i], after[i + WINDOW]) <= cap_iops * 1.2)
            .map(|i| (after[i].0 - written).as_secs_f64())
            .filter(|l| *l <= 1.0);
        let tail = &after[after.len() - 50..];
        let iops_after = rate(tail[0], tail[tail.len() - 1]);
        io.set_caps(&cg, &Caps::NONE)?;
        drop(guard);
        results.push(LagTrial {
            iops_before,
            iops_after,
            lag_s,
        });
        // Let the device drain before the next trial.
        std::thread::sleep(Duration::from_secs(1));
    }
    let mut lags: Vec<f64> = results.iter().filter_map(|r| r.lag_s).collect();
    lags.sort_by(f64::total_cmp);
    let median_lag_s =
        (lags.len() == results.len() && !lags.is_empty()).then(|| lags[lags.len() / 2]);
    Ok(LagResult {
        cap_iops,
        trials: results,
        median_lag_s,
    })
}
