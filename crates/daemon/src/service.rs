//! The control thread: each interval it finds the tenants, adopts new ones
//! (recording their limits first), drops vanished ones, runs one controller
//! per device through the host backends, and publishes what happened to the
//! view, the metrics and the sample stream. Commands (a floor change, a
//! reload, shutdown) arrive on a channel and are handled between intervals,
//! at once.
//!
//! Faults are per tenant: a read or write that fails marks that tenant
//! unavailable for the interval and is logged once (again only when the
//! message changes, and once more when it recovers); the others carry on.

use crate::config::{Config, DeviceConfig, ModelSource, TenantConfig};
use crate::discovery::{discover, Found, FoundKind};
use crate::metrics::Metrics;
use crate::ownership::{Entry, Original, Ownership};
use crate::view::{
    AdmissionView, DeviceState, Point, Reload, SourceKind, Status, TenantView, UsageView, View,
};
use iofloor_core::units::Rate;
use iofloor_core::{
    admission, Caps, Controller, CostModel, DirUsage, PolicyContext, TenantSpec, Usage,
};
use iofloor_host::qmp_backend::{HybridBackend, QmpBackend, QmpTarget};
use iofloor_host::{CgroupBackend, DevId, HostError};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How long a QMP command may take before the VM counts as unavailable.
const QMP_TIMEOUT: Duration = Duration::from_millis(500);

/// A change to a tenant's promise, from the API.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Patch {
    /// `Some(None)` clears the floor.
    pub floor: Option<Option<Rate>>,
    pub ceiling: Option<Option<Rate>>,
    pub weight: Option<f64>,
}

#[derive(Debug)]
pub enum PatchError {
    NotFound(String),
    Invalid(String),
    Refused {
        message: String,
        admission: AdmissionView,
    },
}

pub type Reply<T> = tokio::sync::oneshot::Sender<T>;

pub enum Command {
    Patch {
        tenant: String,
        patch: Patch,
        reply: Reply<Result<TenantView, PatchError>>,
    },
    Reload {
        reply: Option<Reply<Result<String, String>>>,
    },
    Shutdown,
}

/// What the control thread shares with the API.
pub struct Shared {
    pub view: Mutex<View>,
    pub metrics: Metrics,
    /// One JSON tick per interval for /api/v1/samples.
    pub ticks: tokio::sync::broadcast::Sender<Arc<str>>,
    pub token: Mutex<Option<String>>,
}

struct Tenant {
    found: Found,
    spec: Arc<TenantSpec>,
    device: usize,
    overridden: bool,
    /// Caps in force (as last applied).
    caps: Caps,
    throttled_seconds: f64,
    /// Seconds of the last interval under a cap.
    throttled_for: f64,
    usage: Option<UsageView>,
    /// The last non-idle usage, to price the floor with its real mix.
    last_mix: Option<Usage>,
    floor_met: Option<bool>,
    available: bool,
    error: Option<String>,
}

struct DeviceLoop {
    config: DeviceConfig,
    cost: CostModel,
    controller: Controller,
    backend: HybridBackend,
    present: bool,
    state: DeviceState,
}

pub struct Service {
    config: Config,
    cgroup_root: PathBuf,
    devices: Vec<DeviceLoop>,
    tenants: BTreeMap<String, Tenant>,
    ownership: Ownership,
    shared: Arc<Shared>,
    started: Instant,
    ticks: u64,
    overruns: u64,
    last_reload: Option<Reload>,
    last_tick: Option<Duration>,
    /// Spec changes made through the API, kept across reloads.
    overrides: HashMap<String, Patch>,
    /// Tenants found but not adopted, with the reason already logged.
    failed_adoptions: HashMap<String, String>,
}

/// The cgroup hierarchy to use: the config's, else v2 with io at
/// /sys/fs/cgroup, else v1 blkio.
pub fn cgroup_root(config: &Config) -> anyhow::Result<PathBuf> {
    if let Some(root) = &config.cgroup_root {
        iofloor_host::cgroup::detect(root).map_err(|e| anyhow::anyhow!("`cgroup_root`: {e}"))?;
        return Ok(root.clone());
    }
    for root in [
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup/blkio",
    ] {
        if iofloor_host::cgroup::detect(Path::new(root)).is_ok() {
            return Ok(root.into());
        }
    }
    anyhow::bail!("no cgroup hierarchy with an I/O controller (v2 `io` or v1 `blkio`) found; set `cgroup_root`")
}

fn cost_model(device: &DeviceConfig, work: &Path) -> anyhow::Result<(CostModel, Option<f64>)> {
    Ok(match &device.model {
        ModelSource::Inline(m) => (*m, None),
        ModelSource::File(f) => iofloor_host::calibrate::ModelFile::load(f)
            .map_err(|e| anyhow::anyhow!("device `{}`: {e}", device.name))?,
        ModelSource::Calibrate => {
            let path = device.path.clone().ok_or_else(|| {
                anyhow::anyhow!("device `{}`: calibrate needs `path`", device.name)
            })?;
            info!(device = %device.name, "calibrating the cost model (writes to the device)");
            let c = iofloor_host::calibrate::calibrate(
                &path,
                work,
                5.0,
                &|step| info!(device = %path.display(), "{step}"),
            )
            .map_err(|e| anyhow::anyhow!("device `{}`: calibration failed: {e}", device.name))?;
            (
                CostModel::new(c.params).map_err(|e| anyhow::anyhow!("{e}"))?,
                Some(c.queue_knee),
            )
        }
    })
}

/// Whether the device is there to be controlled: its node (when given by
/// path) still is that device, and the kernel still has it with a non-zero
/// size (a hot-unplugged disk leaves /sys; a detached loop device or an
/// ejected medium stays with size 0).
fn device_present(d: &DeviceConfig) -> bool {
    if let Some(p) = &d.path {
        if DevId::of_block_device(p)
            .map(|id| id != d.id)
            .unwrap_or(true)
        {
            return false;
        }
    }
    std::fs::read_to_string(format!("/sys/dev/block/{}/size", d.id))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .is_some_and(|sectors| sectors > 0)
}

fn build_device(config: &Config, d: &DeviceConfig, root: &Path) -> anyhow::Result<DeviceLoop> {
    let work = std::env::temp_dir().join(format!("iofloor-calibrate-{}", std::process::id()));
    let (cost, knee) = cost_model(d, &work)?;
    let mut params = config.params.clone();
    if params.floor.queue_knee.is_none() {
        params.floor.queue_knee = knee;
    }
    let policy = iofloor_core::build_policy(
        config.policy,
        &params,
        PolicyContext {
            cost,
            capacity: 1.0,
        },
    );
    let io = iofloor_host::cgroup::controller(root, d.id)
        .map_err(|e| anyhow::anyhow!("device `{}`: {e}", d.name))?;
    let backend = HybridBackend {
        cgroups: CgroupBackend::new(io, Some(iofloor_host::diskstats::DiskStats::proc(d.id))),
        qmp: QmpBackend::new(QMP_TIMEOUT),
    };
    Ok(DeviceLoop {
        config: d.clone(),
        cost,
        controller: Controller::new(policy, Vec::new()),
        backend,
        present: true,
        state: DeviceState {
            device: d.id.to_string(),
            path: d
                .path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            utilisation: None,
            avg_queue: None,
            capacity_estimate: None,
        },
    })
}

/// A mix to price floors with before a tenant has done any I/O: 4 KiB
/// random, half reads, half writes.
fn assumed_mix() -> Usage {
    let half = DirUsage {
        ios: 0.5,
        bytes: 2048.0,
        seq_ios: 0.0,
    };
    Usage {
        read: half,
        write: half,
        latency_us: None,
    }
}

fn spec_of(t: &TenantConfig, name: &str, patch: Option<&Patch>) -> TenantSpec {
    let mut spec = TenantSpec {
        name: name.to_string(),
        class: t.class,
        floor: t.floor,
        ceiling: t.ceiling,
        weight: t.weight,
        latency_sensitive: t.latency_sensitive,
    };
    if let Some(p) = patch {
        apply_patch(&mut spec, p);
    }
    spec
}

fn apply_patch(spec: &mut TenantSpec, p: &Patch) {
    if let Some(f) = p.floor {
        spec.floor = f;
    }
    if let Some(c) = p.ceiling {
        spec.ceiling = c;
    }
    if let Some(w) = p.weight {
        spec.weight = w;
    }
}

/// Restores limits a previous run left behind (after a crash). Errors are
/// logged; an object that is gone has nothing to restore.
pub fn restore_leftovers(path: &Path) -> anyhow::Result<usize> {
    let Some((pid, entries)) = Ownership::leftovers(path)? else {
        return Ok(0);
    };
    if pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "iofloor" {
            anyhow::bail!(
                "{}: another iofloor (pid {pid}) is running with this state file",
                path.display()
            );
        }
    }
    let mut restored = 0;
    for e in &entries {
        match restore(&e.tenant, &e.original, None) {
            Ok(()) => restored += 1,
            Err(err) => {
                warn!(tenant = %e.tenant, "could not restore limits left by pid {pid}: {err}")
            }
        }
    }
    info!(
        "restored the limits of {restored} of {} tenants left by a previous run (pid {pid})",
        entries.len()
    );
    std::fs::remove_file(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(restored)
}

/// Puts one tenant's original limits back, through `qmp` when the daemon is
/// connected to that monitor (a QMP socket serves one client at a time).
fn restore(tenant: &str, original: &Original, qmp: Option<&mut QmpBackend>) -> anyhow::Result<()> {
    match original {
        Original::Cgroup {
            root,
            cgroup,
            device,
            caps,
        } => {
            if !root.join(cgroup).is_dir() {
                return Ok(());
            }
            let io = iofloor_host::cgroup::controller(root, *device)?;
            io.set_caps(cgroup, caps)?;
        }
        Original::Qmp {
            socket,
            drive,
            limits,
        } => {
            if !socket.exists() {
                return Ok(());
            }
            let result = match qmp {
                Some(q) if q.has_tenant(tenant) => q.set_drive_throttle(tenant, limits),
                _ => {
                    let mut q = QmpBackend::new(QMP_TIMEOUT);
                    q.add_tenant(tenant, socket, QmpTarget::Drive { id: drive.clone() });
                    q.set_drive_throttle(tenant, limits)
                }
            };
            match result {
                // A stale socket of a QEMU that is gone: its throttle went with it.
                Err(HostError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::ConnectionRefused => {}
                other => other?,
            }
        }
    }
    Ok(())
}

impl Service {
    /// Builds the service: restores leftovers of a crashed run, loads cost
    /// models, takes the state file. Nothing is written to a tenant yet.
    pub fn new(config: Config, shared: Arc<Shared>) -> anyhow::Result<Service> {
        let root = cgroup_root(&config)?;
        restore_leftovers(&config.state_file)?;
        let devices = config
            .devices
            .iter()
            .map(|d| build_device(&config, d, &root))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let ownership = Ownership::create(&config.state_file)?;
        *shared.token.lock().unwrap() = config.api.token.clone();
        let mut s = Service {
            config,
            cgroup_root: root,
            devices,
            tenants: BTreeMap::new(),
            ownership,
            shared,
            started: Instant::now(),
            ticks: 0,
            overruns: 0,
            last_reload: None,
            last_tick: None,
            overrides: HashMap::new(),
            failed_adoptions: HashMap::new(),
        };
        s.publish(Duration::ZERO);
        Ok(s)
    }

    pub fn initial_view(config: &Config) -> View {
        View {
            status: Status {
                version: env!("CARGO_PKG_VERSION").into(),
                policy: config.policy.as_str().into(),
                interval_s: config.interval.as_secs_f64(),
                uptime_s: 0.0,
                ticks: 0,
                overruns: 0,
                config: config.file.display().to_string(),
                devices: Vec::new(),
                last_reload: None,
            },
            tenants: BTreeMap::new(),
            history: BTreeMap::new(),
            admission: Vec::new(),
            now: 0.0,
        }
    }

    /// Runs until `Shutdown` (or every sender is gone), then restores every
    /// limit it set and removes the state file.
    pub fn run(mut self, commands: Receiver<Command>) -> anyhow::Result<()> {
        let mut next = Instant::now();
        loop {
            let wait = next.saturating_duration_since(Instant::now());
            match commands.recv_timeout(wait) {
                Ok(Command::Shutdown) | Err(RecvTimeoutError::Disconnected) => break,
                Ok(Command::Patch {
                    tenant,
                    patch,
                    reply,
                }) => {
                    let _ = reply.send(self.patch(&tenant, patch));
                }
                Ok(Command::Reload { reply }) => {
                    let result = self.reload();
                    if let Some(reply) = reply {
                        let _ = reply.send(result);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let decision = self.tick(self.started.elapsed());
                    next += self.config.interval;
                    let overrun = next < Instant::now();
                    if overrun {
                        self.overruns += 1;
                        warn!(
                            "interval overrun: the control loop ran longer than {:?}",
                            self.config.interval
                        );
                        next = Instant::now() + self.config.interval;
                    }
                    self.shared.metrics.tick(decision.as_secs_f64(), overrun);
                }
            }
        }
        self.shutdown()
    }

    /// Puts back every limit iofloor set; the state file goes when all did.
    fn shutdown(mut self) -> anyhow::Result<()> {
        let names: Vec<String> = self.tenants.keys().cloned().collect();
        let mut failed = 0;
        for name in names {
            if !self.release(&name) {
                failed += 1;
            }
        }
        if failed > 0 {
            anyhow::bail!("{failed} tenants' limits could not be restored; the state file keeps them for the next start");
        }
        self.ownership.finish()?;
        info!("stopped; every limit iofloor set was restored");
        Ok(())
    }

    /// Stops controlling a tenant and restores its original limits; false
    /// if they could not be restored (kept in the state file).
    fn release(&mut self, name: &str) -> bool {
        let Some(t) = self.tenants.remove(name) else {
            return true;
        };
        let d = &mut self.devices[t.device];
        d.controller.remove_tenant(name);
        let restored = match self.ownership.get(name).map(|e| e.original.clone()) {
            Some(original) => match restore(name, &original, Some(&mut d.backend.qmp)) {
                Ok(()) => true,
                Err(e) => {
                    warn!(tenant = %name, "could not restore its limits: {e}");
                    false
                }
            },
            None => true,
        };
        d.backend.qmp.remove_tenant(name);
        if let FoundKind::Cgroup(_) = t.found.kind {
            d.backend.cgroups.remove_tenant(name);
        }
        if restored {
            if let Err(e) = self.ownership.forget(name) {
                warn!("state file: {e}");
            }
        }
        let view = {
            let mut view = self.shared.view.lock().unwrap();
            view.history.remove(name);
            view.tenants.remove(name)
        };
        if let Some(v) = view {
            self.shared.metrics.forget_tenant(&v);
        }
        restored
    }

    /// Adopts a found tenant: records its current limits (on disk) before
    /// anything is written to it.
    fn adopt(&mut self, found: Found) {
        let entry = &self.config.tenants[found.entry];
        let device = entry.device;
        let spec = Arc::new(spec_of(entry, &found.name, self.overrides.get(&found.name)));
        let d = &mut self.devices[device];
        let original = match &found.kind {
            FoundKind::Cgroup(rel) => match d.backend.cgroups.controller().caps(rel) {
                Ok(caps) => Original::Cgroup {
                    root: self.cgroup_root.clone(),
                    cgroup: rel.clone(),
                    device: d.config.id,
                    caps,
                },
                Err(e) => {
                    // Gone between discovery and now, or its limits unreadable:
                    // never written to; found again next interval.
                    self.log_error(&found.name, &format!("cannot adopt: {e}"));
                    return;
                }
            },
            FoundKind::Qmp { socket, drive } => {
                d.backend.qmp.add_tenant(
                    &found.name,
                    socket,
                    QmpTarget::Drive { id: drive.clone() },
                );
                match d.backend.qmp.drive_throttle(&found.name) {
                    Ok(limits) => Original::Qmp {
                        socket: socket.clone(),
                        drive: drive.clone(),
                        limits,
                    },
                    Err(e) => {
                        d.backend.qmp.remove_tenant(&found.name);
                        self.log_error(&found.name, &format!("cannot adopt: {e}"));
                        return;
                    }
                }
            }
        };
        if let Err(e) = self.ownership.record(Entry {
            tenant: found.name.clone(),
            original,
        }) {
            warn!(tenant = %found.name, "not adopted, the state file cannot be written: {e}");
            d.backend.qmp.remove_tenant(&found.name);
            return;
        }
        if let FoundKind::Cgroup(rel) = &found.kind {
            d.backend.cgroups.add_tenant(&found.name, rel.clone());
        }
        d.controller.add_tenant(spec.clone());
        self.failed_adoptions.remove(&found.name);
        info!(tenant = %found.name, path = %found.path(&self.cgroup_root).display(), "adopted");
        self.tenants.insert(
            found.name.clone(),
            Tenant {
                overridden: self.overrides.contains_key(&found.name),
                found,
                spec,
                device,
                caps: Caps::NONE,
                throttled_seconds: 0.0,
                throttled_for: 0.0,
                usage: None,
                last_mix: None,
                floor_met: None,
                available: true,
                error: None,
            },
        );
    }

    /// Logs a tenant that cannot be adopted once, not every interval.
    fn log_error(&mut self, name: &str, message: &str) {
        match self
            .failed_adoptions
            .insert(name.to_string(), message.to_string())
        {
            None => warn!(tenant = %name, "{message}; retried each interval"),
            Some(old) if old != message => debug!(tenant = %name, "still failing: {message}"),
            Some(_) => {}
        }
    }

    /// Finds tenants, adopts new ones, drops vanished ones.
    fn reconcile(&mut self) {
        let found = discover(&self.config, &self.cgroup_root);
        let present: std::collections::HashSet<&str> =
            found.iter().map(|f| f.name.as_str()).collect();
        let gone: Vec<String> = self
            .tenants
            .keys()
            .filter(|n| !present.contains(n.as_str()))
            .cloned()
            .collect();
        for name in gone {
            info!(tenant = %name, "gone; dropped");
            self.release(&name);
        }
        self.failed_adoptions
            .retain(|n, _| present.contains(n.as_str()));
        for f in found {
            let moved = self.tenants.get(&f.name).is_some_and(|t| t.found != f);
            if moved {
                self.release(&f.name);
            }
            if !self.tenants.contains_key(&f.name) {
                self.adopt(f);
            }
        }
    }

    /// One interval: discovery, then each device's controller. Returns the
    /// longest decision time.
    fn tick(&mut self, now: Duration) -> Duration {
        self.reconcile();
        self.ticks += 1;
        let dt = self
            .last_tick
            .map(|t| now.saturating_sub(t).as_secs_f64())
            .unwrap_or(0.0);
        self.last_tick = Some(now);
        let mut decision = Duration::ZERO;
        for di in 0..self.devices.len() {
            let present = device_present(&self.devices[di].config);
            let d = &mut self.devices[di];
            if present != d.present {
                if present {
                    info!(device = %d.config.name, "device is back");
                } else {
                    warn!(device = %d.config.name, "device removed; its tenants are skipped until it returns");
                }
                d.present = present;
            }
            if !present {
                d.state.utilisation = None;
                d.state.avg_queue = None;
                for t in self.tenants.values_mut().filter(|t| t.device == di) {
                    t.available = false;
                    t.usage = None;
                    t.floor_met = None;
                    t.error = Some(format!("device {} removed", d.config.name));
                }
                continue;
            }
            let report = d.controller.tick(now, &mut d.backend);
            decision = decision.max(report.decision_time);
            d.state.utilisation = report.device.map(|s| s.utilisation);
            d.state.avg_queue = report.device.map(|s| s.avg_queue);
            d.state.capacity_estimate = d.controller.capacity_estimate();
            let contended = contended(&self.config, &d.state);
            let errors: HashMap<&str, &str> = report
                .errors
                .iter()
                .map(|(n, e)| (n.as_str(), e.as_str()))
                .collect();
            for sample in &report.samples {
                let name = sample.spec.name.as_str();
                let Some(t) = self.tenants.get_mut(name) else {
                    continue;
                };
                if !t.caps.is_unlimited() {
                    t.throttled_for = dt;
                    t.throttled_seconds += dt;
                } else {
                    t.throttled_for = 0.0;
                }
                t.caps = d.controller.caps_of(name).unwrap_or(Caps::NONE);
                t.usage = sample
                    .usage
                    .as_ref()
                    .map(|u| UsageView::new(u, d.cost.cost_rate(u)));
                if let Some(u) = sample.usage.filter(|u| !u.is_idle()) {
                    t.last_mix = Some(u);
                }
                t.floor_met = floor_met(&t.spec, t.usage.as_ref(), contended);
                match errors.get(name) {
                    Some(e) => {
                        // Once when it starts failing, not every interval.
                        match &t.error {
                            None => {
                                warn!(tenant = %name, "{e}; skipped until it recovers, retried each interval")
                            }
                            Some(old) if old != e => debug!(tenant = %name, "still failing: {e}"),
                            Some(_) => {}
                        }
                        t.error = Some(e.to_string());
                        t.available = false;
                    }
                    None => {
                        if let Some(old) = t.error.take() {
                            info!(tenant = %name, "available again (was: {old})");
                        }
                        t.available = true;
                    }
                }
            }
            for name in &report.counter_resets {
                warn!(tenant = %name, "counters went backwards (cgroup or VM recreated?); its limits are written again");
                d.controller.forget_caps(name);
            }
        }
        self.publish(now);
        decision
    }

    /// Copies the state to the view, the metrics and the sample stream.
    fn publish(&mut self, now: Duration) {
        let t_now = now.as_secs_f64();
        let devices: Vec<DeviceState> = self.devices.iter().map(|d| d.state.clone()).collect();
        for (di, d) in self.devices.iter().enumerate() {
            let n = self.tenants.values().filter(|t| t.device == di).count();
            self.shared.metrics.device(
                &d.state.device,
                d.state.utilisation,
                d.state.avg_queue,
                d.state.capacity_estimate,
                n,
            );
        }
        let admission = self.admission(None);
        let views: Vec<TenantView> = self.tenants.values().map(|t| self.tenant_view(t)).collect();
        let mut view = self.shared.view.lock().unwrap();
        view.now = t_now;
        view.status.uptime_s = self.started.elapsed().as_secs_f64();
        view.status.ticks = self.ticks;
        view.status.overruns = self.overruns;
        view.status.policy = self.config.policy.as_str().into();
        view.status.interval_s = self.config.interval.as_secs_f64();
        view.status.devices = devices;
        view.status.last_reload = self.last_reload.clone();
        view.admission = admission;
        for v in views {
            let throttled_for = self
                .tenants
                .get(&v.name)
                .map(|t| t.throttled_for)
                .unwrap_or(0.0);
            self.shared.metrics.tenant(&v, throttled_for);
            if let Some(u) = &v.usage {
                let capped = !v.caps.is_unlimited();
                view.push_point(
                    &v.name,
                    Point {
                        t: t_now,
                        iops: u.iops,
                        bytes_per_sec: u.bytes_per_sec,
                        cost: u.cost,
                        latency_us: u.latency_us,
                        capped,
                    },
                );
            }
            view.tenants.insert(v.name.clone(), v);
        }
        if self.ticks > 0 {
            let tick = serde_json::to_string(&view.tick()).expect("the view serialises");
            // No subscriber is not an error.
            let _ = self.shared.ticks.send(Arc::from(tick));
        }
    }

    fn tenant_view(&self, t: &Tenant) -> TenantView {
        let d = &self.devices[t.device];
        TenantView {
            name: t.found.name.clone(),
            class: t.spec.class,
            source: match t.found.kind {
                FoundKind::Cgroup(_) => SourceKind::Cgroup,
                FoundKind::Qmp { .. } => SourceKind::Qmp,
            },
            path: t.found.path(&self.cgroup_root).display().to_string(),
            device: d.state.device.clone(),
            floor: t.spec.floor,
            ceiling: t.spec.ceiling,
            weight: t.spec.weight,
            latency_sensitive: t.spec.latency_sensitive,
            available: t.available,
            error: t.error.clone(),
            usage: t.usage,
            caps: t.caps,
            floor_met: t.floor_met,
            throttled_seconds: t.throttled_seconds,
            overridden: t.overridden,
        }
    }

    /// Admission verdict per device, with `change` (a tenant's new spec)
    /// put in place of the current one.
    fn admission(&self, change: Option<&TenantSpec>) -> Vec<AdmissionView> {
        self.devices
            .iter()
            .enumerate()
            .map(|(di, d)| {
                let specs: Vec<(TenantSpec, Usage)> = self
                    .tenants
                    .values()
                    .filter(|t| t.device == di)
                    .map(|t| {
                        let spec = match change {
                            Some(c) if c.name == t.spec.name => c.clone(),
                            _ => (*t.spec).clone(),
                        };
                        let mix = t.last_mix.unwrap_or_else(assumed_mix);
                        (spec, mix)
                    })
                    .collect();
                let rows: Vec<(&TenantSpec, Option<Usage>)> =
                    specs.iter().map(|(s, m)| (s, Some(*m))).collect();
                let usable = self.config.params.floor.target_utilisation
                    * d.controller.capacity_estimate().unwrap_or(1.0);
                AdmissionView::new(&d.state.device, &admission::check(&d.cost, usable, &rows))
            })
            .collect()
    }

    /// A floor, ceiling or weight change from the API: checked, refused if
    /// the floors would no longer fit, else in force from the next interval.
    fn patch(&mut self, name: &str, patch: Patch) -> Result<TenantView, PatchError> {
        let t = self
            .tenants
            .get(name)
            .ok_or_else(|| PatchError::NotFound(format!("no tenant `{name}`")))?;
        let mut spec = (*t.spec).clone();
        apply_patch(&mut spec, &patch);
        spec.check_promise()
            .map_err(|e| PatchError::Invalid(e.to_string()))?;
        let raises_floor = match (t.spec.floor, spec.floor) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(old), Some(new)) => old.unit() != new.unit() || new.value() > old.value(),
        };
        if raises_floor {
            let verdicts = self.admission(Some(&spec));
            if let Some(v) = verdicts
                .into_iter()
                .nth(t.device)
                .filter(|v| v.total_floor_cost > v.usable_capacity * (1.0 + 1e-9))
            {
                return Err(PatchError::Refused {
                    message: format!("refused: the new floor does not fit: {}", v.summary),
                    admission: v,
                });
            }
        }
        let spec = Arc::new(spec);
        let t = self.tenants.get_mut(name).expect("looked up above");
        self.devices[t.device].controller.update_spec(spec.clone());
        t.spec = spec;
        t.overridden = true;
        let merged = self.overrides.entry(name.to_string()).or_default();
        if patch.floor.is_some() {
            merged.floor = patch.floor;
        }
        if patch.ceiling.is_some() {
            merged.ceiling = patch.ceiling;
        }
        if patch.weight.is_some() {
            merged.weight = patch.weight;
        }
        info!(tenant = %name, floor = ?t.spec.floor, ceiling = ?t.spec.ceiling, weight = t.spec.weight, "changed through the API");
        let view = self.tenant_view(&self.tenants[name]);
        self.shared
            .view
            .lock()
            .unwrap()
            .tenants
            .insert(name.to_string(), view.clone());
        Ok(view)
    }

    /// Reloads the config file. An invalid file, or one that changes what
    /// needs a restart, is refused and the running config stays.
    fn reload(&mut self) -> Result<String, String> {
        let at = self.started.elapsed().as_secs_f64();
        let result = Config::load(&self.config.file)
            .map_err(|e| e.to_string())
            .and_then(|new| {
                let old = &self.config;
                let mut needs_restart = Vec::new();
                if new.devices != old.devices {
                    needs_restart.push("[[device]]");
                }
                if new.cgroup_root != old.cgroup_root {
                    needs_restart.push("cgroup_root");
                }
                if new.state_file != old.state_file {
                    needs_restart.push("state_file");
                }
                if new.api.listen != old.api.listen || new.api.unix_socket != old.api.unix_socket {
                    needs_restart.push("api.listen / api.unix_socket");
                }
                if new.policy != old.policy || new.params != old.params {
                    needs_restart.push("[policy]");
                }
                if !needs_restart.is_empty() {
                    return Err(format!(
                        "changing {} needs a restart",
                        needs_restart.join(", ")
                    ));
                }
                Ok(new)
            });
        let outcome = match result {
            Ok(new) => {
                *self.shared.token.lock().unwrap() = new.api.token.clone();
                let old_entries = std::mem::replace(&mut self.config, new);
                // Tenants whose entry changed get their new promise now;
                // those no longer configured are released by discovery.
                let names: Vec<String> = self.tenants.keys().cloned().collect();
                for name in names {
                    let t = &self.tenants[&name];
                    let old_entry = &old_entries.tenants[t.found.entry];
                    match self.config.tenants.iter().position(|e| {
                        e.name == old_entry.name
                            && e.source == old_entry.source
                            && e.device == old_entry.device
                    }) {
                        Some(i) => {
                            let spec = Arc::new(spec_of(
                                &self.config.tenants[i],
                                &name,
                                self.overrides.get(&name),
                            ));
                            let t = self.tenants.get_mut(&name).expect("listed above");
                            t.found.entry = i;
                            self.devices[t.device].controller.update_spec(spec.clone());
                            t.spec = spec;
                        }
                        None => {
                            info!(tenant = %name, "no longer configured; released");
                            self.release(&name);
                        }
                    }
                }
                let message = format!("reloaded {}", self.config.file.display());
                info!("{message}");
                Ok(message)
            }
            Err(e) => {
                let message = format!("config not reloaded, the running one stays: {e}");
                warn!("{message}");
                Err(message)
            }
        };
        self.shared.metrics.reload(outcome.is_ok());
        self.last_reload = Some(Reload {
            ok: outcome.is_ok(),
            message: match &outcome {
                Ok(m) | Err(m) => m.clone(),
            },
            at,
        });
        self.shared.view.lock().unwrap().status.last_reload = self.last_reload.clone();
        outcome
    }
}

/// Whether the device is contended: busy beyond the policy's border and,
/// where the queue knee is known, queueing beyond it.
fn contended(config: &Config, state: &DeviceState) -> bool {
    let busy = state
        .utilisation
        .is_some_and(|u| u >= config.params.floor.border);
    let queued = match (config.params.floor.queue_knee, state.avg_queue) {
        (Some(knee), Some(q)) => q > knee,
        _ => true,
    };
    busy && queued
}

/// A floor is met when the tenant got at least 95 % of it, or got less
/// while the device was not contended (it asked for less). Unknown without
/// a floor or a sample. docs/metrics.md explains the choice.
pub fn floor_met(spec: &TenantSpec, usage: Option<&UsageView>, contended: bool) -> Option<bool> {
    let floor = spec.floor?;
    let u = usage?;
    Some(u.in_unit_of(floor) >= 0.95 * floor.value() || !contended)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iofloor_core::TenantClass;

    fn usage(iops: f64) -> UsageView {
        UsageView {
            read_iops: iops,
            write_iops: 0.0,
            read_bytes_per_sec: iops * 4096.0,
            write_bytes_per_sec: 0.0,
            iops,
            bytes_per_sec: iops * 4096.0,
            cost: iops / 1000.0,
            latency_us: None,
        }
    }

    #[test]
    fn a_floor_is_met_by_use_or_by_spare_capacity() {
        let spec = TenantSpec::new("t", TenantClass::Container).with_floor(Rate::Iops(100.0));
        assert_eq!(floor_met(&spec, Some(&usage(96.0)), true), Some(true));
        assert_eq!(
            floor_met(&spec, Some(&usage(90.0)), true),
            Some(false),
            "short on a contended device"
        );
        assert_eq!(
            floor_met(&spec, Some(&usage(10.0)), false),
            Some(true),
            "asked for less"
        );
        assert_eq!(floor_met(&spec, None, true), None);
        assert_eq!(
            floor_met(
                &TenantSpec::new("u", TenantClass::Vm),
                Some(&usage(1.0)),
                true
            ),
            None
        );
        let bw = TenantSpec::new("b", TenantClass::Vm).with_floor(Rate::BytesPerSec(400_000.0));
        assert_eq!(
            floor_met(&bw, Some(&usage(100.0)), true),
            Some(true),
            "409,600 B/s ≥ 95 % of 400,000"
        );
    }

    #[test]
    fn contention_needs_a_busy_device_and_a_queue_past_the_knee() {
        let text = "[[device]]\nid = \"7:0\"\nmodel = { rbps = 1e9, rseqiops = 1e3, rrandiops = 1e3, wbps = 1e9, wseqiops = 1e3, wrandiops = 1e3 }\n";
        let mut config = Config::parse(text, Path::new("/x.toml")).unwrap();
        let state = |u: f64, q: f64| DeviceState {
            device: "7:0".into(),
            path: String::new(),
            utilisation: Some(u),
            avg_queue: Some(q),
            capacity_estimate: None,
        };
        assert!(
            contended(&config, &state(0.95, 1.0)),
            "no knee: busy is contended"
        );
        assert!(!contended(&config, &state(0.5, 30.0)));
        config.params.floor.queue_knee = Some(4.0);
        assert!(
            !contended(&config, &state(1.0, 2.0)),
            "busy but short queue"
        );
        assert!(contended(&config, &state(1.0, 8.0)));
    }
}
