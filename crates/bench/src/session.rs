//! One run's resources: a parent cgroup with a cgroup per tenant, the fio
//! processes inside them, and the throttles the policy set. Dropping the
//! session (normal end, error, Ctrl-C) stops every process it started, by PID,
//! clears the throttles and removes the cgroups.

use crate::play::fio_job;
use crate::{BenchError, Result};
use iofloor_core::Caps;
use iofloor_host::cgroup::{self, DevId, IoController};
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
    started: Duration,
    log: PathBuf,
    name: String,
}

/// Where one process's completion-latency log is, and when it started.
pub(crate) struct LogInfo {
    pub path: PathBuf,
    pub tenant: usize,
    pub started: Duration,
}

pub(crate) struct Session {
    root: PathBuf,
    parent: PathBuf,
    tenants: Vec<PathBuf>,
    io: Box<dyn IoController>,
    procs: Vec<Proc>,
    finished: Vec<LogInfo>,
    free_regions: Vec<u32>,
    region_size: u64,
    pub start: Option<Instant>,
    spawned: u32,
    cleaned: bool,
    /// qemu-storage-daemon paths of VM tenants, removed with the session.
    vm_paths: Vec<iofloor_host::rig::Rig>,
    /// Loop devices made for another host's load, detached with the session.
    other_host_devices: Vec<PathBuf>,
    /// A rig whose capacity the run changes, and the limits to put back.
    rig_to_restore: Option<(iofloor_host::rig::Rig, iofloor_host::rig::RigSpec)>,
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

impl Session {
    pub fn create(root: &Path, dev: DevId, scenario: &Scenario, tag: &str) -> Result<Session> {
        let parent = PathBuf::from(format!("iofloor-bench-{}-{tag}", std::process::id()));
        let io = cgroup::controller(root, dev)?;
        let mut s = Session {
            root: root.to_path_buf(),
            parent: parent.clone(),
            tenants: Vec::new(),
            io,
            procs: Vec::new(),
            finished: Vec::new(),
            free_regions: Vec::new(),
            region_size: 0,
            start: None,
            spawned: 0,
            cleaned: false,
            vm_paths: Vec::new(),
            other_host_devices: Vec::new(),
            rig_to_restore: None,
        };
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
    pub fn add_other_host_device(&mut self, rig: &iofloor_host::rig::Rig) -> Result<PathBuf> {
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

    /// Changes the rig's capacity; the first change remembers what to put back.
    pub fn change_rig_capacity(&mut self, rig: &iofloor_host::rig::Rig, factor: f64) -> Result<()> {
        let original = match &self.rig_to_restore {
            Some((_, spec)) => *spec,
            None => {
                self.rig_to_restore = Some((rig.clone(), rig.spec));
                rig.spec
            }
        };
        let scale = |v: u64| ((v as f64 * factor).round() as u64).max(1);
        let spec = iofloor_host::rig::RigSpec {
            iops: scale(original.iops),
            bps: original.bps.map(scale),
            ..original
        };
        rig.set_limits(&spec)?;
        Ok(())
    }

    /// Brings up a VM's QEMU path over the shared device; removed with the session.
    pub fn add_vm_path(
        &mut self,
        device: &Path,
        state_root: &Path,
    ) -> Result<&iofloor_host::rig::Rig> {
        let vm = iofloor_host::rig::Rig::up_vm_path(device, state_root)?;
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

    /// Stops processes together: all are told at once, then waited for
    /// with one deadline. A throttled fio drains its queue at the throttle's
    /// rate before it exits; one after the other, eight of them held the
    /// run's loop for seconds.
    fn stop_procs(&mut self, mut procs: Vec<Proc>) {
        for p in &procs {
            signal(p.child.id(), rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !procs.is_empty() {
            let mut waiting = Vec::with_capacity(procs.len());
            for mut p in procs {
                match p.child.try_wait() {
                    Ok(None) if Instant::now() < deadline => waiting.push(p),
                    Ok(Some(_)) => self.retire(p),
                    _ => {
                        let _ = p.child.kill();
                        let _ = p.child.wait();
                        self.retire(p);
                    }
                }
            }
            procs = waiting;
            if !procs.is_empty() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    fn retire(&mut self, p: Proc) {
        self.free_regions.push(p.region);
        self.finished.push(LogInfo {
            path: p.log,
            tenant: p.tenant,
            started: p.started,
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
        self.stop_procs(surplus);
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
                started: self.elapsed(),
                log,
                name,
            });
            count += 1;
        }
        self.stop_procs(stop);
        Ok(())
    }

    /// A message if a process ended before it was told to (fio died).
    pub fn check_processes(&mut self) -> Result<Option<String>> {
        for p in &mut self.procs {
            if let Ok(Some(status)) = p.child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = p.child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
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
        self.stop_procs(all);
        Ok(std::mem::take(&mut self.finished))
    }

    /// Stops processes, clears throttles, removes the cgroups.
    pub fn cleanup(&mut self) -> Result<()> {
        if self.cleaned {
            return Ok(());
        }
        self.cleaned = true;
        let all = std::mem::take(&mut self.procs);
        self.stop_procs(all);
        let mut first = None;
        if let Some((rig, spec)) = self.rig_to_restore.take() {
            if let Err(e) = rig.set_limits(&spec) {
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
        for t in &self.tenants {
            if let Err(e) = self.io.set_caps(t, &Caps::NONE) {
                if !e.is_not_found() {
                    first.get_or_insert(e);
                }
            }
        }
        // Our processes are reaped, but leave the cgroups a moment later.
        if let Err(e) = cgroup::remove_when_empty(&self.root, &self.parent, Duration::from_secs(10))
        {
            first.get_or_insert(e);
        }
        match first {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Err(e) = self.cleanup() {
            eprintln!("warning: cleaning up {}: {e}", self.parent.display());
        }
    }
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
