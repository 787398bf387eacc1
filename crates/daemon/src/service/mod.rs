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
//!
//! The service composes owned parts, each a type in its own file with its
//! methods beside it: the `roster` (tenants, the API's overrides, the
//! cluster's floors, the spec a tenant is controlled by), the `finder`
//! (what the config matches now, what failed to be adopted and when to try
//! again, libvirt's connection for discovery), one `DeviceLoop` per device
//! (`devices`: its controller and backends; it reaches a found tenant,
//! runs an interval and hands each tenant what it did, releases a tenant
//! with its limits put back) and the `TickClock` (`timing`). `impl
//! Service`, all of it in this file, only coordinates them: an interval,
//! adopting and releasing (with the state file), publishing, the API's
//! patches and reloads. What those need beyond the parts is in free
//! functions of their own files: `adoption` (a tenant's spec, the limits
//! kept or recorded, where a group's limit is held), `publish` (views,
//! admission), `patch` (a change checked) and `reload` (the file read
//! again, which entries still hold their tenants).
//!
mod adoption;
mod devices;
mod finder;
mod patch;
mod publish;
mod reload;
mod roster;
mod timing;

/// The control thread's nice value (needs CAP_SYS_NICE, as root has).
const CONTROL_NICE: i32 = -10;

pub use adoption::restore_leftovers;
pub use devices::cgroup_root;
pub use patch::{Patch, PatchError};
pub use reload::ReloadError;

use crate::config::Config;
use crate::discovery::{Found, FoundKind};
use crate::metrics::Metrics;
use crate::ownership::{Entry, Ownership};
pub use crate::view::TickTiming;
use crate::view::{AdmissionView, DeviceState, Reload, Status, TenantView, View};
use devices::{build_device, DeviceLoop, Reach};
use finder::{Finder, Finding};
use iofloor_core::TenantSpec;
use roster::{Roster, Tenant};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use timing::{ReadTime, TickClock};
use tracing::{debug, info, warn};

/// How long a QMP command may take before the VM counts as unavailable.
const QMP_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a libvirt call may take before its VM counts as unavailable
/// (libvirtd answers in 4–8 ms here, 115 ms under load, about 1 s just
/// after it restarted: measured).
const LIBVIRT_TIMEOUT: Duration = Duration::from_millis(1500);

pub type Reply<T> = tokio::sync::oneshot::Sender<T>;

pub enum Command {
    Patch {
        tenant: String,
        patch: Patch,
        reply: Reply<Result<TenantView, PatchError>>,
    },
    Reload {
        reply: Option<Reply<Result<String, ReloadError>>>,
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
    /// Cluster mode: what the control thread and the etcd task exchange.
    pub cluster: Option<ClusterLink>,
}

/// The shared ends of cluster mode: the agent policy's mailbox and the
/// coordination task's status (set once the agent has joined).
#[derive(Default)]
pub struct ClusterLink {
    pub mailbox: Arc<Mutex<iofloor_cluster::Mailbox>>,
    pub status: Mutex<Option<Arc<Mutex<iofloor_cluster::ClusterStatus>>>>,
    /// Reads the whole cluster from etcd for `/api/v1/cluster`.
    pub reader: Mutex<Option<iofloor_cluster::ClusterReader<iofloor_cluster::Etcd>>>,
}

pub struct Service {
    config: Config,
    cgroup_root: PathBuf,
    devices: Vec<DeviceLoop>,
    roster: Roster,
    ownership: Ownership,
    shared: Arc<Shared>,
    clock: TickClock,
    last_reload: Option<Reload>,
    finder: Finder,
    /// The cgroup hierarchy is v2: a parent's `io.max` bounds its subtree.
    cgroup_v2: bool,
}

impl Service {
    /// Builds the service: restores leftovers of a crashed run, loads cost
    /// models, takes the state file. Nothing is written to a tenant yet.
    pub fn new(config: Config, shared: Arc<Shared>) -> anyhow::Result<Service> {
        let root = cgroup_root(&config)?;
        let unrestored = restore_leftovers(&config.state_file)?;
        let devices = config
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let agent = config
                    .cluster
                    .as_ref()
                    .filter(|c| c.device == i)
                    .zip(shared.cluster.as_ref());
                build_device(&config, d, &root, agent)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut ownership = Ownership::create(&config.state_file)?;
        // Still the only record of those limits: on disk before anything
        // else, put back when their tenants are released.
        for e in unrestored {
            ownership.stage(e);
        }
        ownership.flush()?;
        *shared.token.lock().unwrap() = config.api.token.clone();
        let mut s = Service {
            config,
            cgroup_root: root,
            devices,
            roster: Roster::default(),
            ownership,
            shared,
            clock: TickClock::start(),
            last_reload: None,
            finder: Finder::default(),
            cgroup_v2: false,
        };
        s.cgroup_v2 = iofloor_host::cgroup::detect(&s.cgroup_root)
            .is_ok_and(|v| v == iofloor_host::cgroup::Version::V2);
        s.warn_flat_group_cgroups();
        s.publish(Duration::ZERO);
        Ok(s)
    }

    /// A `[[group]] cgroup` on cgroup v1, said once at start: blk-throttle
    /// is flat there (a parent's limit bounds nothing below it), so its
    /// members are capped one by one.
    fn warn_flat_group_cgroups(&self) {
        if self.cgroup_v2 {
            return;
        }
        let mut said = std::collections::BTreeSet::new();
        for t in &self.config.tenants {
            if let (Some(g), Some(_)) = (&t.group, &t.group_cgroup) {
                if said.insert(g.name.clone()) {
                    tracing::warn!(group = %g.name, "`cgroup` takes effect on cgroup v2 only (v1 blk-throttle is flat): its members are capped one by one");
                }
            }
        }
    }

    /// What the cluster agent needs from this service: the shared device's
    /// cost model, with the config's policy; `None` on a single host.
    pub fn cluster_settings(&self) -> Option<iofloor_cluster::AgentSettings> {
        let c = self.config.cluster.as_ref()?;
        let device = &self.devices[c.device];
        Some(iofloor_cluster::AgentSettings {
            cluster: c.name.clone(),
            host: c.host.clone(),
            device: c.shared_device.clone(),
            interval: self.config.interval,
            lease_ttl: c.lease_ttl,
            orphan_timeout: c.orphan_timeout,
            policy: self.config.policy,
            params: device.params().clone(),
            ctx: iofloor_core::PolicyContext {
                cost: device.cost(),
                capacity: 1.0,
            },
        })
    }

    pub fn initial_view(config: &Config) -> View {
        View {
            status: Status {
                version: env!("CARGO_PKG_VERSION").into(),
                policy: config.policy.as_str().into(),
                interval_s: config.interval.as_secs_f64(),
                uptime_s: 0.0,
                ticks: 0,
                early_ticks: 0,
                overruns: 0,
                tick: Default::default(),
                config: config.file.display().to_string(),
                devices: Vec::new(),
                last_reload: None,
                cluster: None,
                heap: None,
            },
            tenants: BTreeMap::new(),
            history: BTreeMap::new(),
            admission: Vec::new(),
            now: 0.0,
        }
    }

    /// One control interval at `now` (time since start), as [`Service::run`]
    /// does each interval: discovery, every device's controller, publishing.
    /// Returns the longest decision time. For benchmarks and tests that drive
    /// the clock themselves.
    pub fn step(&mut self, now: Duration) -> Duration {
        self.tick(ReadTime::At(now), false)
    }

    /// The spec the tenant found as `found` under config entry `entry` is
    /// controlled by ([`Roster::spec_for`]).
    fn spec_for(&self, entry: usize, found: &Found) -> TenantSpec {
        self.roster
            .spec_for(&self.config, entry, found, self.cgroup_v2)
    }

    /// Puts a tenant's new spec in force: in the roster and its device's
    /// controller, from the next interval.
    fn put_spec(&mut self, name: &str, spec: TenantSpec) {
        let Some(t) = self.roster.get_mut(name) else {
            return;
        };
        let spec = Arc::new(spec);
        self.devices[t.device].update_spec(spec.clone());
        t.spec = spec;
    }

    /// Puts the cluster's floors read by the etcd task in force on the
    /// shared device's tenants, once per change.
    fn sync_cluster_floors(&mut self) {
        let Some(link) = self.shared.cluster.as_ref() else {
            return;
        };
        {
            let m = link.mailbox.lock().unwrap_or_else(|e| e.into_inner());
            if !self.roster.take_cluster_floors(m.floors_version, &m.floors) {
                return;
            }
        }
        for name in self.roster.names() {
            let Some(t) = self.roster.get(&name) else {
                continue;
            };
            let spec = self.spec_for(t.found.entry, &t.found);
            if spec != *t.spec {
                info!(tenant = %name, floor = ?spec.floor, "floor set for the cluster in etcd");
                self.put_spec(&name, spec);
            }
        }
    }

    /// Runs until `Shutdown` (or every sender is gone), then restores every
    /// limit it set and removes the state file.
    pub fn run(mut self, commands: Receiver<Command>) -> anyhow::Result<()> {
        // The control loop is the one thread whose lateness costs floors:
        // ahead of the API's threads and other work on a busy machine. On
        // Linux the nice value is per thread (setpriority of 0 is this one).
        if let Err(e) = rustix::process::setpriority_process(None, CONTROL_NICE) {
            info!("control thread keeps its priority (nice {CONTROL_NICE} refused: {e})");
        }
        let mut next = Instant::now();
        let watch = self.config.watch_interval;
        // In cluster mode there are no looks (the hosts decide together
        // once an interval), but an allocation is applied when it arrives:
        // checked for as often as looks would be.
        let news = self.config.cluster.as_ref().and_then(|_| {
            iofloor_core::control::watch_interval(self.config.interval, None, false)
                .ok()
                .flatten()
        });
        let wake_every = watch.or(news);
        let mut next_look = wake_every.map(|w| next + w);
        loop {
            let wake = next_look.map_or(next, |look| look.min(next));
            let wait = wake.saturating_duration_since(Instant::now());
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
                    let started = Instant::now();
                    // Woken before the interval's end: only to apply news and look.
                    let early = started < next && {
                        next_look = wake_every.map(|w| started + w);
                        self.between_intervals(self.clock.now(), watch.is_some())
                    };
                    if !early && started < next {
                        continue;
                    }
                    let lateness = started.saturating_duration_since(next);
                    let decision = self.tick(ReadTime::Live, early);
                    let timing = TickTiming {
                        decision,
                        duration: started.elapsed(),
                        lateness,
                        early,
                    };
                    if early {
                        // The next interval counts from this decision.
                        next = started;
                    }
                    next += self.config.interval;
                    next_look = wake_every.map(|w| Instant::now() + w);
                    let overrun = next < Instant::now();
                    self.clock.record(&timing, overrun);
                    if overrun {
                        warn!(
                            "interval overrun: the control loop ran longer than {:?}",
                            self.config.interval
                        );
                        next = Instant::now() + self.config.interval;
                    }
                    self.shared.metrics.tick(&timing, overrun);
                }
            }
        }
        self.shutdown()
    }

    /// Gives up before the first interval (nothing adopted yet): removes
    /// the state file, as a clean stop would.
    pub fn stop_before_start(self) -> anyhow::Result<()> {
        self.shutdown()
    }

    /// Puts back every limit iofloor set; the state file goes when all did.
    fn shutdown(mut self) -> anyhow::Result<()> {
        let mut failed = 0;
        for name in self.roster.names() {
            if !self.release(&name) {
                failed += 1;
            }
        }
        // What is left has no tenant now: entries a crashed run left that
        // could not be put back then, a pod cgroup whose restore failed.
        let orphans: Vec<crate::ownership::Entry> = self.ownership.entries().cloned().collect();
        for e in orphans {
            match adoption::restore_entry(&e) {
                Ok(()) => self.ownership.forget(&e.tenant),
                Err(err) => {
                    warn!(tenant = %e.tenant, "could not restore its limits: {err}");
                    failed += 1;
                }
            }
        }
        if failed > 0 {
            self.ownership.flush()?;
            anyhow::bail!("{failed} tenants' limits could not be restored; the state file keeps them for the next start");
        }
        self.ownership.finish()?;
        info!("stopped; every limit iofloor set was restored");
        Ok(())
    }

    /// One interval: discovery, then each device's controller, then
    /// publishing. Returns the longest decision time.
    fn tick(&mut self, at: ReadTime, early: bool) -> Duration {
        self.reconcile();
        self.sync_cluster_floors();
        let dt = self.clock.begin(self.clock.time_of(at));
        let mut decision = Duration::ZERO;
        for (di, d) in self.devices.iter_mut().enumerate() {
            if d.check_presence(self.roster.on_device_mut(di)) {
                let now = self.clock.time_of(at);
                decision = decision.max(d.tick(now, early, &mut self.roster, dt));
            }
        }
        self.publish(self.clock.time_of(at));
        decision
    }

    /// Between intervals, on every present device: a cluster allocation
    /// that arrived is applied, and with `look` the device is looked at.
    /// True when one of the policies wants to decide now.
    fn between_intervals(&mut self, now: Duration, look: bool) -> bool {
        let mut early = false;
        for d in &mut self.devices {
            early |= d.between_intervals(now, look, &mut self.roster);
        }
        early
    }

    /// Finds tenants, adopts new ones, drops vanished ones.
    fn reconcile(&mut self) {
        let Finding {
            found,
            libvirt_unknown,
            runtimes_down,
        } = self
            .finder
            .find(&self.config, &self.cgroup_root, self.cgroup_v2);
        let present: HashSet<&str> = found.iter().map(|f| f.name.as_str()).collect();
        // libvirt that could not be asked says nothing of its domains: its
        // tenants stay (unavailable while it cannot be read), never dropped.
        let gone: Vec<String> = self
            .roster
            .tenants()
            .filter(|t| {
                let kept = (libvirt_unknown && matches!(t.found.kind, FoundKind::Libvirt { .. }))
                    || t.found
                        .container
                        .as_ref()
                        .is_some_and(|c| runtimes_down.contains(&c.runtime));
                !(present.contains(t.found.name.as_str()) || kept)
            })
            .map(|t| t.found.name.clone())
            .collect();
        for name in gone {
            info!(tenant = %name, "gone; dropped");
            self.release(&name);
            self.roster.forget_overrides(&name);
        }
        self.finder.forget_absent(&present);
        let mut adopted = Vec::new();
        for f in found {
            let moved = self.roster.get(&f.name).is_some_and(|t| t.found != f);
            if moved {
                self.release(&f.name);
            }
            if !self.roster.contains(&f.name) && self.finder.due(&f.name, self.clock.ticks()) {
                adopted.push(f.name.clone());
                self.adopt(f);
            }
        }
        if let Err(e) = self.ownership.flush() {
            // Their limits are not on disk: they must not be written to.
            adopted.retain(|n| self.roster.contains(n));
            for name in &adopted {
                warn!(tenant = %name, "not adopted, the state file cannot be written: {e}");
                self.abandon(name);
            }
        }
    }

    /// Adopts a found tenant: stages its current limits for the state file,
    /// which [`Service::reconcile`] writes before anything is written to it.
    fn adopt(&mut self, found: Found) {
        let entry = &self.config.tenants[found.entry];
        let device = entry.device;
        let spec = Arc::new(self.spec_for(found.entry, &found));
        let throttle_group = adoption::throttle_group(entry, &spec);
        let via = Reach {
            cgroup_root: &self.cgroup_root,
            libvirt_uri: &self.config.libvirt_uri,
            throttle_group: throttle_group.as_deref(),
        };
        let kept = adoption::kept_original(&self.ownership, &found);
        let original = match self.devices[device].reach(&found, kept, via) {
            Ok(original) => original,
            Err(e) => {
                // Gone between discovery and now, its limits unreadable, or
                // its VM's monitor or libvirt not answering: never written
                // to; tried again with the finder's backoff.
                let message = format!("cannot adopt: {e}");
                self.finder
                    .failed(&found.name, &message, self.clock.ticks());
                return;
            }
        };
        // On disk with the reconcile's flush, before the controller's next write.
        self.ownership.stage(Entry {
            tenant: found.name.clone(),
            original,
        });
        if let FoundKind::Cgroup(rel) = &found.kind {
            self.share_group_limit(device, &found, &spec, rel);
        }
        self.devices[device].start_deciding(spec.clone());
        self.finder.adopted(&found.name);
        info!(tenant = %found.name, path = %found.path(&self.cgroup_root).display(), "adopted");
        self.roster
            .insert(found.name.clone(), Tenant::new(found, spec, device));
    }

    /// A member of a pod or of a `[[group]]` with a cgroup of its own, on
    /// cgroup v2 ([`adoption::group_holder`]): its caps go to that cgroup,
    /// added up, whose limits are recorded first as a tenant's.
    fn share_group_limit(&mut self, device: usize, found: &Found, spec: &TenantSpec, rel: &Path) {
        let entry = &self.config.tenants[found.entry];
        let Some((cgroup, key)) = adoption::group_holder(entry, found, spec, rel, self.cgroup_v2)
        else {
            return;
        };
        let d = &mut self.devices[device];
        let recorded = self.ownership.get(&key).is_some()
            || match d.cgroup_original(&self.cgroup_root, &cgroup) {
                Ok(original) => {
                    self.ownership.stage(Entry {
                        tenant: key,
                        original,
                    });
                    true
                }
                Err(e) => {
                    debug!(tenant = %found.name, "group cgroup limits unreadable ({e}): caps stay on the member");
                    false
                }
            };
        if recorded {
            d.share_cgroup_limit(&found.name, cgroup);
        }
    }

    /// Stops controlling a tenant and restores its original limits; false
    /// if they could not be restored (kept in the state file).
    fn release(&mut self, name: &str) -> bool {
        let Some(t) = self.roster.remove(name) else {
            return true;
        };
        let original = self.ownership.get(name).map(|e| e.original.clone());
        let (restored, freed) = self.devices[t.device].release(name, original.as_ref());
        if let Err(e) = &restored {
            warn!(tenant = %name, "could not restore its limits: {e}");
        }
        let restored = restored.is_ok();
        let mut pod_restored = true;
        // The pod's last container: the pod's cgroup gets its limits back
        // (kept in the state file if that fails, as a tenant's are).
        if let (Some(_), Some(g)) = (freed, &t.spec.group) {
            if let Some((key, original)) = adoption::recorded_holder(&self.ownership, &g.name) {
                match adoption::restore(&key, &original, None) {
                    Ok(()) => self.ownership.forget(&key),
                    Err(err) => {
                        warn!(group = %g.name, "could not restore the pod cgroup's limits: {err}");
                        pod_restored = false;
                    }
                }
            }
        }
        if restored {
            self.ownership.forget(name);
        }
        let view = {
            let mut view = self.shared.view.lock().unwrap();
            view.history.remove(name);
            view.tenants.remove(name)
        };
        if let Some(v) = view {
            self.shared.metrics.forget_tenant(&v);
        }
        restored && pod_restored
    }

    /// Undoes an adoption whose record never reached the disk: nothing was
    /// written to the tenant, so nothing is restored.
    fn abandon(&mut self, name: &str) {
        if let Some(t) = self.roster.remove(name) {
            // Nothing was written to it: nothing to restore.
            let _ = self.devices[t.device].release(name, None);
        }
        self.ownership.forget(name);
    }

    /// Copies the state to the view, the metrics and the sample stream.
    fn publish(&mut self, now: Duration) {
        let devices: Vec<DeviceState> = self.devices.iter().map(|d| d.state().clone()).collect();
        for (di, d) in self.devices.iter().enumerate() {
            self.shared
                .metrics
                .device(d.state(), self.roster.count_on(di));
        }
        let admission = self.admission(None);
        let cluster = publish::cluster_view(&self.shared, &self.config);
        if let Some(c) = &cluster {
            self.shared.metrics.cluster(c);
        }
        let views: Vec<TenantView> = self
            .roster
            .tenants()
            .map(|t| t.view(&self.devices[t.device], &self.cgroup_root))
            .collect();
        let mut view = self.shared.view.lock().unwrap();
        view.now = now.as_secs_f64();
        self.clock.show(&mut view.status);
        view.status.policy = self.config.policy.as_str().into();
        view.status.interval_s = self.config.interval.as_secs_f64();
        view.status.devices = devices;
        view.status.last_reload = self.last_reload.clone();
        view.status.cluster = cluster;
        view.admission = admission;
        let ticked = self.clock.ticks() > 0;
        publish::show_tenants(&self.shared, &mut view, views, &self.roster, ticked);
    }

    /// Admission verdict per device, with `change` (a tenant's new spec)
    /// put in place of the current one.
    fn admission(&self, change: Option<&TenantSpec>) -> Vec<AdmissionView> {
        let usable_share = self.config.params.floor.target_utilisation;
        publish::admission(&self.devices, &self.roster, usable_share, change)
    }

    /// A floor, ceiling or weight change from the API: checked, refused if
    /// the floors would no longer fit, else in force from the next interval.
    fn patch(&mut self, name: &str, patch: Patch) -> Result<TenantView, PatchError> {
        let t = self
            .roster
            .get(name)
            .ok_or_else(|| PatchError::NotFound(format!("no tenant `{name}`")))?;
        let cluster_floor = self.roster.has_cluster_floor(name);
        let (spec, raises_floor) = patch::checked(&self.config, t, &patch, cluster_floor)?;
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
        info!(tenant = %name, floor = ?spec.floor, ceiling = ?spec.ceiling, weight = spec.weight, "changed through the API");
        self.put_spec(name, spec);
        self.roster.add_override(name, &patch);
        let t = self.roster.get(name).expect("looked up above");
        let view = t.view(&self.devices[t.device], &self.cgroup_root);
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
    fn reload(&mut self) -> Result<String, ReloadError> {
        let at = self.clock.now().as_secs_f64();
        let outcome = reload::reread(&self.config).map(|new| {
            self.take_config(new);
            // A fixed entry is tried at once, not after its backoff.
            self.finder.retry_all();
            let message = format!("reloaded {}", self.config.file.display());
            info!("{message}");
            message
        });
        if let Err(e) = &outcome {
            warn!("{e}");
        }
        self.shared.metrics.reload(outcome.is_ok());
        self.last_reload = Some(Reload {
            ok: outcome.is_ok(),
            message: match &outcome {
                Ok(m) => m.clone(),
                Err(e) => e.to_string(),
            },
            at,
        });
        self.shared.view.lock().unwrap().status.last_reload = self.last_reload.clone();
        outcome
    }

    /// Puts `new` in force: tenants whose entry is still there get its
    /// promise now; those no longer configured are released.
    fn take_config(&mut self, new: Config) {
        *self.shared.token.lock().unwrap() = new.api.token.clone();
        let old = std::mem::replace(&mut self.config, new);
        for name in self.roster.names() {
            let Some(t) = self.roster.get(&name) else {
                continue;
            };
            match reload::entry_kept(&old, &self.config, t.found.entry) {
                Some(i) => {
                    let spec = self.spec_for(i, &t.found);
                    if let Some(t) = self.roster.get_mut(&name) {
                        t.found.entry = i;
                    }
                    self.put_spec(&name, spec);
                }
                None => {
                    info!(tenant = %name, "no longer configured as it was; released");
                    self.release(&name);
                }
            }
        }
        if old.libvirt_uri != self.config.libvirt_uri {
            for d in &mut self.devices {
                d.forget_libvirt();
            }
        }
    }
}
