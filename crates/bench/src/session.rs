//! One run's resources: a parent cgroup with a cgroup per tenant, the fio
//! processes inside them, and the throttles the policy set. Dropping the
//! session (normal end, error, Ctrl-C) stops every process it started, by PID,
//! clears the throttles and removes the cgroups.

use crate::capacity::CapacityKnob;
use crate::{BenchError, Result};
use iofloor_core::units::Rate;
use iofloor_core::Caps;
use iofloor_host::cgroup::{self, DevId, IoController};
use iofloor_host::fio::FioJob;
use iofloor_scenario::format::{Job, Scenario};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

struct Proc {
    child: Child,
    tenant: usize,
    job: usize,
    iodepth: u32,
    region: u32,
    spawned: Instant,
    /// When its fio runtime is over (it may end by itself from then on).
    ends: Duration,
    log: PathBuf,
    name: String,
}

/// How long a stopped fio may take to drain its queue before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long reaped processes may take to leave the session's cgroups before
/// what is still there is killed.
const LEAVE_GRACE: Duration = Duration::from_secs(5);
/// How long processes replaced by new ones (a new queue depth) keep running
/// beside them: a new fio needs a few hundred ms to start its I/O on a busy
/// machine, and a gap would show the policy a tenant whose demand fell.
const HANDOVER: Duration = Duration::from_millis(500);

/// A process on its way out: told to stop at `term_at`, killed at `kill_at`.
struct Stopping {
    proc: Proc,
    term_at: Instant,
    kill_at: Instant,
    told: bool,
}

/// Where one process's completion-latency log is, and when it started:
/// seconds on the run's clock, less than 0 for the load started before the
/// clock (its I/O from before the run is not the run's).
pub(crate) struct LogInfo {
    pub path: PathBuf,
    pub tenant: usize,
    pub job: usize,
    pub started: f64,
}

pub(crate) struct Session {
    root: PathBuf,
    parent: PathBuf,
    tenants: Vec<PathBuf>,
    /// One per device the tenants use (each host's view of the shared
    /// device on the cluster bed): throttles are cleared on each.
    io: Vec<Box<dyn IoController>>,
    procs: Vec<Proc>,
    /// To be stopped or told to stop, not yet gone.
    stopping: Vec<Stopping>,
    finished: Vec<LogInfo>,
    free_regions: Vec<u32>,
    region_size: u64,
    pub start: Option<Instant>,
    spawned: u32,
    cleaned: bool,
    /// qemu-storage-daemon paths of VM tenants, removed with the session.
    vm_paths: Vec<iofloor_testbed::rig::Rig>,
    /// Loop devices made for another host's load, detached with the session.
    other_host_devices: Vec<PathBuf>,
    /// A device whose capacity the run changed: its limits as found
    /// ([`CapacityKnob::spec`]) are put back.
    capacity_to_restore: Option<CapacityKnob>,
}

/// Sends `sig` to a process this bench started, by its PID.
pub(crate) fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

impl Session {
    pub fn create(root: &Path, devs: &[DevId], scenario: &Scenario, tag: &str) -> Result<Session> {
        remove_stale_sessions(root);
        restore_stale_kernel_files();
        let parent = PathBuf::from(format!("{SESSION_PREFIX}{}-{tag}", std::process::id()));
        let io = devs
            .iter()
            .map(|dev| cgroup::controller(root, *dev))
            .collect::<std::result::Result<_, _>>()?;
        let mut s = Session {
            root: root.to_path_buf(),
            parent: parent.clone(),
            tenants: Vec::new(),
            io,
            procs: Vec::new(),
            stopping: Vec::new(),
            finished: Vec::new(),
            free_regions: Vec::new(),
            region_size: 0,
            start: None,
            spawned: 0,
            cleaned: false,
            vm_paths: Vec::new(),
            other_host_devices: Vec::new(),
            capacity_to_restore: None,
        };
        cgroup::create(root, &parent)?;
        cgroup::enable_io_for_children(root, &parent)?;
        // cgroup v1 blk-throttle is flat: every tenant is a leaf with its own
        // limits. Unmanaged load gets a cgroup too (index after the tenants'),
        // never given to the policy: outside every controlled cgroup.
        let names = scenario
            .tenants
            .iter()
            .map(|t| sanitize(&t.spec.name))
            .chain(
                scenario
                    .unmanaged
                    .iter()
                    .map(|u| format!("unmanaged-{}", sanitize(&u.name))),
            );
        for name in names {
            let rel = parent.join(name);
            cgroup::create(root, &rel)?;
            s.tenants.push(rel);
        }
        Ok(s)
    }

    /// A loop device over the rig's export, as another host attached to
    /// the same storage: its I/O passes the rig's throttle group but never
    /// this host's device counters. Detached with the session.
    pub fn add_other_host_device(&mut self, rig: &iofloor_testbed::rig::Rig) -> Result<PathBuf> {
        let out = std::process::Command::new("losetup")
            .args(["-f", "--show", "--direct-io=on"])
            .arg(&rig.mountpoint)
            .output()
            .map_err(|e| BenchError::Failed(format!("losetup: {e}")))?;
        if !out.status.success() {
            return Err(BenchError::Failed(format!(
                "losetup {}: {}",
                rig.mountpoint.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let device = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        self.other_host_devices.push(device.clone());
        Ok(device)
    }

    /// Changes the device's capacity to `factor` of what it was found
    /// with; the first change remembers what to put back.
    pub fn change_capacity(&mut self, knob: &CapacityKnob, factor: f64) -> Result<()> {
        let original = self
            .capacity_to_restore
            .get_or_insert_with(|| knob.clone())
            .spec();
        Ok(knob.set_limits(&original.scaled(factor))?)
    }

    /// Brings up a VM's QEMU path over the shared device; removed with the session.
    pub fn add_vm_path(
        &mut self,
        device: &Path,
        state_root: &Path,
    ) -> Result<&iofloor_testbed::rig::Rig> {
        let vm = iofloor_testbed::rig::Rig::up_vm_path(device, state_root)?;
        self.vm_paths.push(vm);
        Ok(self.vm_paths.last().expect("just pushed"))
    }

    pub fn set_regions(&mut self, count: u32, size: u64) {
        self.free_regions = (0..count).rev().collect();
        self.region_size = size;
    }

    pub fn tenant_cgroup(&self, i: usize) -> &Path {
        &self.tenants[i]
    }

    fn elapsed(&self) -> Duration {
        self.start.map(|s| s.elapsed()).unwrap_or_default()
    }

    /// `at` in seconds on the run's clock, negative before it started.
    fn on_clock(&self, at: Instant) -> f64 {
        match self.start {
            Some(start) if at >= start => (at - start).as_secs_f64(),
            Some(start) => -(start - at).as_secs_f64(),
            None => 0.0,
        }
    }

    /// Tells processes to stop after `delay` and returns at once;
    /// [`Self::reap`] collects them. A throttled fio drains its queue at the
    /// throttle's rate before it exits (seconds at a deep queue and a low
    /// cap), and the run's loop must not wait for that: it would miss its
    /// ticks, and the processes started in the same change would run out
    /// their time before the loop came back.
    fn stop_procs(&mut self, procs: Vec<Proc>, delay: Duration) {
        let term_at = Instant::now() + delay;
        for proc in procs {
            self.stopping.push(Stopping {
                proc,
                term_at,
                kill_at: term_at + STOP_GRACE,
                told: false,
            });
        }
        self.reap(false);
    }

    /// Tells the processes due to stop, collects the ones gone and kills the
    /// ones past their grace time. With `wait`, until none is left (and
    /// without waiting for a handover).
    fn reap(&mut self, wait: bool) {
        loop {
            let now = Instant::now();
            for mut st in std::mem::take(&mut self.stopping) {
                if !st.told && (wait || now >= st.term_at) {
                    signal(st.proc.child.id(), rustix::process::Signal::TERM);
                    st.told = true;
                    st.kill_at = st.kill_at.min(now + STOP_GRACE);
                }
                match st.proc.child.try_wait() {
                    Ok(None) if !st.told || now < st.kill_at => self.stopping.push(st),
                    Ok(Some(_)) => self.retire(st.proc),
                    _ => {
                        let _ = st.proc.child.kill();
                        let _ = st.proc.child.wait();
                        self.retire(st.proc);
                    }
                }
            }
            if !wait || self.stopping.is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn retire(&mut self, p: Proc) {
        self.free_regions.push(p.region);
        self.finished.push(LogInfo {
            path: p.log,
            tenant: p.tenant,
            job: p.job,
            started: self.on_clock(p.spawned),
        });
    }

    /// Brings a job to `numjobs` processes at `iodepth`.
    #[allow(clippy::too_many_arguments)]
    pub fn set_processes(
        &mut self,
        tenant: usize,
        job: usize,
        spec: &Job,
        numjobs: u32,
        iodepth: u32,
        runtime_s: f64,
        device: &Path,
        work: &Path,
    ) -> Result<()> {
        let mine = |p: &Proc| p.tenant == tenant && p.job == job;
        // A new depth needs new processes (fio cannot change it live); the
        // new ones start before the old ones stop, so the load has no gap.
        let mut keep = Vec::new();
        let mut stop = Vec::new();
        for p in std::mem::take(&mut self.procs) {
            if mine(&p) && p.iodepth != iodepth {
                stop.push(p);
            } else {
                keep.push(p);
            }
        }
        self.procs = keep;
        let mut count = self.procs.iter().filter(|p| mine(p)).count() as u32;
        let mut surplus = Vec::new();
        while count > numjobs {
            let idx = self
                .procs
                .iter()
                .rposition(&mine)
                .expect("a process of the job");
            surplus.push(self.procs.remove(idx));
            count -= 1;
        }
        self.stop_procs(surplus, Duration::ZERO);
        while count < numjobs {
            let region = self
                .free_regions
                .pop()
                .ok_or_else(|| BenchError::Failed("no free device region".into()))?;
            self.spawned += 1;
            let name = format!(
                "{}-j{job}-p{}",
                sanitize(&self.tenants[tenant].file_name().unwrap().to_string_lossy()),
                self.spawned
            );
            let fj = fio_job(
                spec,
                name.clone(),
                device,
                iodepth,
                runtime_s,
                work,
                region as u64 * self.region_size,
                self.region_size,
            );
            let procs = self.root.join(&self.tenants[tenant]).join("cgroup.procs");
            let child = fj.spawn_in(&procs)?;
            let log = PathBuf::from(format!(
                "{}_clat.log",
                fj.lat_log.as_ref().expect("lat log set").display()
            ));
            self.procs.push(Proc {
                child,
                tenant,
                job,
                iodepth,
                region,
                spawned: Instant::now(),
                ends: self.elapsed() + Duration::from_secs_f64(runtime_s.max(0.0)),
                log,
                name,
            });
            count += 1;
        }
        self.stop_procs(stop, HANDOVER);
        Ok(())
    }

    /// A message if a process ended before it was told to (fio died) or
    /// before its runtime was over; also collects stopped processes.
    pub fn check_processes(&mut self) -> Result<Option<String>> {
        self.reap(false);
        let now = self.elapsed();
        for p in &mut self.procs {
            if now >= p.ends {
                // Its runtime is over: fio ends by itself, as it should.
                continue;
            }
            if let Ok(Some(status)) = p.child.try_wait() {
                let err = p.child.stderr.take().map(buffered_text).unwrap_or_default();
                return Ok(Some(format!(
                    "fio process {} (pid {}) ended early with {status}: {}",
                    p.name,
                    p.child.id(),
                    err.trim()
                )));
            }
        }
        Ok(None)
    }

    /// Stops every process; returns where their latency logs are.
    pub fn stop_all(&mut self) -> Result<Vec<LogInfo>> {
        let all = std::mem::take(&mut self.procs);
        self.stop_procs(all, Duration::ZERO);
        self.reap(true);
        Ok(std::mem::take(&mut self.finished))
    }

    /// Stops processes, clears throttles, removes the cgroups.
    pub fn cleanup(&mut self) -> Result<()> {
        if self.cleaned {
            return Ok(());
        }
        self.cleaned = true;
        let all = std::mem::take(&mut self.procs);
        self.stop_procs(all, Duration::ZERO);
        self.reap(true);
        let mut first = None;
        if let Some(knob) = self.capacity_to_restore.take() {
            if let Err(e) = knob.set_limits(&knob.spec()) {
                first.get_or_insert(e);
            }
        }
        for device in std::mem::take(&mut self.other_host_devices) {
            let detached = std::process::Command::new("losetup")
                .arg("-d")
                .arg(&device)
                .status();
            if !detached.is_ok_and(|s| s.success()) {
                eprintln!("warning: could not detach {}", device.display());
            }
        }
        for vm in std::mem::take(&mut self.vm_paths) {
            if let Err(e) = vm.down() {
                first.get_or_insert(e);
            }
        }
        for (t, io) in self
            .tenants
            .iter()
            .flat_map(|t| self.io.iter().map(move |io| (t, io)))
        {
            if let Err(e) = io.set_caps(t, &Caps::NONE) {
                if !e.is_not_found() {
                    first.get_or_insert(e);
                }
            }
        }
        // Our processes are reaped, but leave the cgroups a moment later
        // (seconds in a TCG guest beside the suite's other lanes). What is
        // still there after that is a job process of a fio that died or
        // that we killed past its grace (its main process, which waits for
        // its jobs, is gone; on a slow guest one stayed for good: kept 90 s,
        // the cgroup was never removed): it goes too, it is ours. A reaped
        // fio has no job process left, so no latency log is cut short.
        let wait = Duration::from_secs(30);
        let mut removed = cgroup::remove_when_empty(&self.root, &self.parent, LEAVE_GRACE);
        if removed.is_err() {
            let killed = cgroup::kill_processes_in(&self.root, &self.parent);
            eprintln!(
                "bench: killed {killed} process(es) left in {}",
                self.parent.display()
            );
            removed = cgroup::remove_when_empty(&self.root, &self.parent, wait);
        }
        if let Err(e) = removed {
            first.get_or_insert(e);
        }
        match first {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

/// What a dead fio wrote to its stderr, without waiting for the pipe to
/// close: a fio killed by a signal leaves its job process running out its
/// time with the pipe open, and a blocking read held the bench that long
/// (41 s at noisy-4's `--time-scale 0.1`, measured) before it said why.
fn buffered_text(mut stderr: std::process::ChildStderr) -> String {
    let mut bytes = Vec::new();
    let nonblocking = rustix::fs::fcntl_getfl(&stderr)
        .and_then(|flags| rustix::fs::fcntl_setfl(&stderr, flags | rustix::fs::OFlags::NONBLOCK));
    if nonblocking.is_ok() {
        // Ends with WouldBlock once what is buffered is read; what was read
        // stays in `bytes`.
        let _ = stderr.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Err(e) = self.cleanup() {
            eprintln!("warning: cleaning up {}: {e}", self.parent.display());
        }
    }
}

/// Every session's parent cgroup is named `iofloor-bench-<pid>-<policy>`.
const SESSION_PREFIX: &str = "iofloor-bench-";

/// Removes the cgroups of benches that were killed (SIGKILL, a machine
/// restart) before they could clean up: their owner's PID is gone. Cgroups
/// that still hold processes (a killed bench's fio running out its time) are
/// left alone with a warning: they are not ours to kill.
fn remove_stale_sessions(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let owner = name
            .strip_prefix(SESSION_PREFIX)
            .and_then(|rest| rest.split('-').next());
        if !owner_gone(owner) {
            continue;
        }
        match cgroup::remove_tree(root, Path::new(&name)) {
            Ok(()) => eprintln!("bench: removed {name}, left by a bench that was killed"),
            Err(e) => eprintln!("warning: {name} was left by a bench that was killed: {e}"),
        }
    }
}

/// Where a bench keeps what puts the kernel's controller files back while
/// one is in force (`kernel-<pid>.json`), for the next bench if it is killed.
const KERNEL_JOURNALS: &str = "/run/iofloor/bench";

/// This bench's journal of the kernel's controller files.
pub(crate) fn kernel_journal() -> Result<PathBuf> {
    let dir = Path::new(KERNEL_JOURNALS);
    std::fs::create_dir_all(dir).map_err(|source| BenchError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    Ok(dir.join(format!("kernel-{}.json", std::process::id())))
}

/// Puts back the kernel's controller files that benches killed mid-run left
/// changed (io.cost on, BFQ the scheduler): their journals, whose owner's
/// PID is gone.
fn restore_stale_kernel_files() {
    let Ok(entries) = std::fs::read_dir(KERNEL_JOURNALS) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let owner = name
            .strip_prefix("kernel-")
            .and_then(|rest| rest.strip_suffix(".json"));
        if !owner_gone(owner) {
            continue;
        }
        match iofloor_host::kernel_control::restore_journal(&e.path()) {
            Ok(()) => eprintln!(
                "bench: put back the kernel's I/O controller files a killed bench left ({name})"
            ),
            Err(e) => eprintln!("warning: putting back what a killed bench left ({name}): {e}"),
        }
    }
}

/// Whether the bench whose PID (`pid`, as text) names a leftover is gone;
/// never this one, and nothing that is not a PID.
fn owner_gone(pid: Option<&str>) -> bool {
    pid.and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|owner| {
            owner != std::process::id() && !Path::new(&format!("/proc/{owner}")).exists()
        })
}

/// A cgroup directory name from a tenant name.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Builds an fio job for one process of a scenario job.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fio_job(
    job: &Job,
    name: String,
    device: &Path,
    iodepth: u32,
    runtime_s: f64,
    work: &Path,
    offset: u64,
    size: u64,
) -> FioJob {
    let (rate_bytes, rate_iops) = match job.rate {
        Some(Rate::BytesPerSec(b)) => (Some(b.round().max(1.0) as u64), None),
        Some(Rate::Iops(i)) => (None, Some(i.round().max(1.0) as u64)),
        _ => (None, None),
    };
    let mixed = matches!(job.rw.as_fio(), "rw" | "randrw");
    let mut fj = FioJob::new(
        name.clone(),
        device,
        job.rw.as_fio(),
        job.bs,
        iodepth,
        runtime_s,
        work.join(format!("{name}.json")),
    );
    fj.rwmixread = mixed.then(|| (job.read_share * 100.0).round() as u8);
    fj.rate_bytes = rate_bytes;
    fj.rate_iops = rate_iops;
    fj.rate_process = (job.rate_process != iofloor_scenario::format::RateProcess::Linear)
        .then(|| job.rate_process.as_fio());
    fj.lat_log = Some(work.join(&name));
    fj.offset = offset;
    fj.size = size;
    fj
}
