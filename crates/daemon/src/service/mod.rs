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
//! The service composes owned parts, each a type in its own file: the
//! `roster` (tenants, the API's overrides, the cluster's floors, the spec a
//! tenant is controlled by), the `finder` (what the config matches now,
//! what failed to be adopted and when to try again, libvirt's connection
//! for discovery), one `DeviceLoop` per device (`devices`: its controller
//! and backends; an interval returns what it did to each tenant) and the
//! `TickClock` (`timing`). What joins them is the service's: `adoption`
//! (adopting and releasing tenants, and the limits they had before),
//! `publish` (view, metrics, sample stream, admission), `patch` (changes
//! from the API) and `reload` (SIGHUP and the API's reload). Adoption and
//! publishing still reach into a device loop's backends and state, and a
//! tenant's record is plain data: the next step is methods for those.
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
use crate::discovery::Found;
use crate::metrics::Metrics;
use crate::ownership::Ownership;
pub use crate::view::TickTiming;
use crate::view::{Reload, Status, TenantView, View};
use devices::{build_device, DeviceLoop};
use finder::Finder;
use iofloor_core::TenantSpec;
use roster::{Roster, Tenant};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use timing::{ReadTime, TickClock};
use tracing::{info, warn};

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
    pub(super) fn spec_for(&self, entry: usize, found: &Found) -> TenantSpec {
        self.roster
            .spec_for(&self.config, entry, found, self.cgroup_v2)
    }

    /// Puts a tenant's new spec in force: in the roster and its device's
    /// controller, from the next interval.
    pub(super) fn put_spec(&mut self, name: &str, spec: TenantSpec) {
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
}
