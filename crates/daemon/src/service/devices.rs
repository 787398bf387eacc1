//! The devices: one controller and one set of host backends per device, its
//! presence checked each interval, and the tick that drives them.

use super::roster::{Roster, Tenant};
use super::{LIBVIRT_TIMEOUT, QMP_TIMEOUT};
use crate::config::{Config, DeviceConfig, ModelSource};
use crate::discovery::{Found, FoundKind};
use crate::ownership::Original;
use crate::view::{DeviceState, UsageView};
use iofloor_core::{Caps, Controller, CostModel, PolicyContext, TenantSpec, TickReport, Usage};
use iofloor_host::backends::libvirt::{DomainInfo, LibvirtBackend};
use iofloor_host::backends::{HybridBackend, QmpBackend, QmpTarget};
use iofloor_host::HostError;
use iofloor_host::{CgroupBackend, DevId};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

/// One device's loop: its controller, the backends that reach its tenants
/// (cgroups, QEMU monitors, libvirt), whether it is there, and what its
/// last interval showed. The service connects and disconnects tenants
/// through it; nothing else touches its controller or backends.
/// How a device reaches a found tenant beyond its own backends: the
/// cgroup hierarchy, libvirt's URI, and a VM's shared throttle group.
#[derive(Clone, Copy)]
pub(super) struct Reach<'a> {
    pub(super) cgroup_root: &'a Path,
    pub(super) libvirt_uri: &'a str,
    pub(super) throttle_group: Option<&'a str>,
}

pub(super) struct DeviceLoop {
    config: DeviceConfig,
    cost: CostModel,
    /// The policy's parameters as built (with the calibrated queue knee).
    params: iofloor_core::PolicyParams,
    controller: Controller,
    backend: HybridBackend,
    present: bool,
    state: DeviceState,
    /// Why the capacity loop last held its estimate unjudged, logged once
    /// per change.
    capacity_fault: Option<iofloor_core::capacity::Fault>,
    /// The learned capacity's disagreement with a model file was logged.
    model_disagreement_told: bool,
}

/// How far the learned capacity may stray from a model file (either way)
/// before the log says the file is wrong.
const MODEL_DISAGREEMENT: f64 = 3.0;

/// The cgroup hierarchy to use: the config's, else v2 with io at
/// /sys/fs/cgroup, else v1 blkio.
pub fn cgroup_root(config: &Config) -> anyhow::Result<PathBuf> {
    if let Some(root) = &config.cgroup_root {
        iofloor_host::cgroup::detect(root).map_err(|e| anyhow::anyhow!("`cgroup_root`: {e}"))?;
        return Ok(root.clone());
    }
    let mount = Path::new(crate::config::CGROUP_MOUNT);
    let roots = std::iter::once(mount.to_path_buf())
        .chain(crate::config::IO_HIERARCHIES.iter().map(|h| mount.join(h)));
    for root in roots {
        if iofloor_host::cgroup::detect(&root).is_ok() {
            return Ok(root);
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

/// The policy's parameters for a device: the config's, with the queue knee
/// calibration measured where the config sets none.
fn policy_params(config: &Config, calibrated_knee: Option<f64>) -> iofloor_core::PolicyParams {
    let mut params = config.params.clone();
    if params.floor.queue_knee.is_none() {
        params.floor.queue_knee = calibrated_knee;
    }
    params
}

/// Builds a device's controller. The cluster's shared device gets the agent
/// policy (`agent`): it applies what the allocator decides, or its fallback.
pub(super) fn build_device(
    config: &Config,
    d: &DeviceConfig,
    root: &Path,
    agent: Option<(&crate::config::ClusterConfig, &super::ClusterLink)>,
) -> anyhow::Result<DeviceLoop> {
    let work = std::env::temp_dir().join(format!("iofloor-calibrate-{}", std::process::id()));
    let (cost, knee) = cost_model(d, &work)?;
    let params = policy_params(config, knee);
    let policy: Box<dyn iofloor_core::Policy> = match agent {
        Some((cluster, link)) => Box::new(iofloor_cluster::AgentPolicy::new(
            cluster.host.clone(),
            cluster.shared_device.clone(),
            iofloor_cluster::AgentRule::new(cost, cluster.stale_after),
            link.mailbox.clone(),
        )),
        None => iofloor_core::build_policy(
            config.policy,
            &params,
            PolicyContext {
                cost,
                capacity: 1.0,
            },
        ),
    };
    let io = iofloor_host::cgroup::controller(root, d.id)
        .map_err(|e| anyhow::anyhow!("device `{}`: {e}", d.name))?;
    let backend = HybridBackend {
        cgroups: CgroupBackend::new(io, Some(iofloor_host::diskstats::DiskStats::proc(d.id))),
        qmp: QmpBackend::new(QMP_TIMEOUT),
        libvirt: None,
    };
    Ok(DeviceLoop {
        config: d.clone(),
        cost,
        params,
        controller: Controller::new(policy, Vec::new()),
        backend,
        present: true,
        capacity_fault: None,
        model_disagreement_told: false,
        state: DeviceState {
            device: d.id.to_string(),
            path: d
                .path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            utilisation: None,
            avg_queue: None,
            latency_us: None,
            floors_feasible: None,
            floor_shortfall: None,
            latency_threshold_us: None,
            latency_target_in_reach: None,
            capacity_estimate: None,
            contended: None,
            capacity_step: None,
            capacity_curve: Vec::new(),
        },
    })
}

/// What one interval did to one tenant of a device.
struct TenantOutcome {
    name: String,
    /// The caps in force after the interval.
    caps: Caps,
    usage: Option<Usage>,
    view: Option<UsageView>,
    /// The policy's verdict (`Policy::verdicts`), not judged again here.
    floor_met: Option<bool>,
    /// Its read or write failed this interval.
    error: Option<String>,
}

impl DeviceLoop {
    /// What the device's last interval showed.
    pub(super) fn state(&self) -> &DeviceState {
        &self.state
    }

    pub(super) fn cost(&self) -> CostModel {
        self.cost
    }

    /// The policy's parameters as built (with the calibrated queue knee).
    pub(super) fn params(&self) -> &iofloor_core::PolicyParams {
        &self.params
    }

    /// The capacity the policy learned, in cost units per second.
    pub(super) fn capacity_estimate(&self) -> Option<f64> {
        self.controller.capacity_estimate()
    }

    /// Whether the device is there (logged when that changes); one that is
    /// gone shows no queue, load or verdict, and its tenants (`tenants`)
    /// are unavailable, not idle, until it returns.
    pub(super) fn check_presence<'t>(
        &mut self,
        tenants: impl Iterator<Item = &'t mut Tenant>,
    ) -> bool {
        let present = device_present(&self.config);
        if present != self.present {
            if present {
                info!(device = %self.config.name, "device is back");
            } else {
                warn!(device = %self.config.name, "device removed; its tenants are skipped until it returns");
            }
            self.present = present;
        }
        if !present {
            self.state.utilisation = None;
            self.state.avg_queue = None;
            self.state.contended = None;
            let error = format!("device {} removed", self.config.name);
            for t in tenants {
                t.available = false;
                t.usage = None;
                t.floor_met = None;
                t.error = Some(error.clone());
            }
        }
        present
    }

    /// Between intervals, if the device is there: a cluster allocation
    /// that arrived is applied (`Controller::apply_news`; the caps each
    /// tenant got noted in `roster`), and with `look` the policy looks at
    /// the device (`Controller::look`); true when it wants to decide now.
    pub(super) fn between_intervals(
        &mut self,
        now: Duration,
        look: bool,
        roster: &mut Roster,
    ) -> bool {
        if !self.present {
            return false;
        }
        if let Some(news) = self.controller.apply_news(now, &mut self.backend) {
            for (name, caps) in news.applied {
                if let Some(t) = roster.get_mut(&name) {
                    t.caps = caps;
                }
            }
            for (name, e) in news.errors {
                // The next interval writes them again.
                warn!(tenant = %name, "applying the cluster's allocation: {e}");
            }
        }
        look && self.controller.look(now, &mut self.backend)
    }

    /// Starts deciding for a tenant whose backend is connected.
    pub(super) fn start_deciding(&mut self, spec: Arc<TenantSpec>) {
        self.controller.add_tenant(spec);
    }

    /// A tenant's new spec, in force from the next interval.
    pub(super) fn update_spec(&mut self, spec: Arc<TenantSpec>) {
        self.controller.update_spec(spec);
    }

    /// The limits a cgroup under `root` has on this device now, as they
    /// are put back on release.
    pub(super) fn cgroup_original(
        &self,
        root: &Path,
        cgroup: &Path,
    ) -> Result<Original, HostError> {
        Ok(Original::Cgroup {
            root: root.to_path_buf(),
            cgroup: cgroup.to_path_buf(),
            device: self.config.id,
            caps: self.backend.cgroups.controller().caps(cgroup)?,
        })
    }

    /// Connects a found tenant to the backend that reaches it and returns
    /// the limits to put back on release: `kept`, or those it has now. On
    /// an error nothing of it is left connected. `via.throttle_group`: a
    /// libvirt VM's disks share that QEMU throttle group.
    pub(super) fn reach(
        &mut self,
        found: &Found,
        kept: Option<Original>,
        via: Reach<'_>,
    ) -> Result<Original, HostError> {
        match &found.kind {
            FoundKind::Libvirt { domain, uuid, disk } => {
                let vm = DomainInfo {
                    name: domain.clone(),
                    uuid: uuid.clone(),
                    disks: vec![disk.clone()],
                };
                self.connect_libvirt(via.libvirt_uri, &found.name, vm, via.throttle_group, kept)
            }
            FoundKind::Qmp { socket, drive } => self.connect_qmp(&found.name, socket, drive, kept),
            FoundKind::Cgroup(rel) => {
                let original = match kept {
                    Some(kept) => kept,
                    None => self.cgroup_original(via.cgroup_root, rel)?,
                };
                self.backend.cgroups.add_tenant(&found.name, rel.clone());
                Ok(original)
            }
        }
    }

    /// A tenant whose caps go, added up with its siblings', to `holder`
    /// (a pod's own cgroup on v2).
    pub(super) fn share_cgroup_limit(&mut self, name: &str, holder: PathBuf) {
        self.backend.cgroups.share_limit(name, holder);
    }

    /// Connects a QEMU drive; returns the limits to put back on release:
    /// `kept`, or those it has now. On an error it is not left connected.
    fn connect_qmp(
        &mut self,
        name: &str,
        socket: &Path,
        drive: &str,
        kept: Option<Original>,
    ) -> Result<Original, HostError> {
        let qmp = &mut self.backend.qmp;
        qmp.add_tenant(name, socket, QmpTarget::Drive { id: drive.into() });
        if let Some(kept) = kept {
            return Ok(kept);
        }
        match qmp.drive_throttle(name) {
            Ok(limits) => Ok(Original::Qmp {
                socket: socket.to_path_buf(),
                drive: drive.into(),
                limits,
            }),
            Err(e) => {
                qmp.remove_tenant(name);
                Err(e)
            }
        }
    }

    /// Connects the one disk of `vm` through libvirt at `uri` (reached on
    /// first use), its caps in QEMU throttle group `shared` if given;
    /// returns the limits to put back as [`DeviceLoop::connect_qmp`] does.
    fn connect_libvirt(
        &mut self,
        uri: &str,
        name: &str,
        vm: DomainInfo,
        shared: Option<&str>,
        kept: Option<Original>,
    ) -> Result<Original, HostError> {
        let disk = vm.disks.concat();
        let l = match self.backend.libvirt.as_mut() {
            Some(l) => l,
            None => self
                .backend
                .libvirt
                .insert(LibvirtBackend::new(uri, LIBVIRT_TIMEOUT)?),
        };
        l.add_tenant(name, &vm, &disk, shared);
        if let Some(kept) = kept {
            return Ok(kept);
        }
        match l.io_tune(name) {
            Ok(tune) => Ok(Original::Libvirt {
                uri: uri.into(),
                uuid: vm.uuid,
                domain: vm.name,
                disk,
                tune,
            }),
            Err(e) => {
                l.remove_tenant(name);
                Err(e)
            }
        }
    }

    /// Drops the connection to libvirt (its URI changed); the next
    /// adoption reaches it again.
    pub(super) fn forget_libvirt(&mut self) {
        self.backend.libvirt = None;
    }

    /// Stops deciding for a tenant, puts its `original` limits back (if
    /// given) through this device's backends (a QMP socket serves one
    /// client at a time) and takes it out of every backend. Returns how the
    /// restore went, and the cgroup its caps were shared at if no tenant
    /// shares it any more.
    pub(super) fn release(
        &mut self,
        name: &str,
        original: Option<&Original>,
    ) -> (anyhow::Result<()>, Option<PathBuf>) {
        self.controller.remove_tenant(name);
        let restored = original.map_or(Ok(()), |original| {
            super::adoption::restore(name, original, Some(&mut self.backend))
        });
        (restored, self.disconnect(name))
    }

    /// Takes a tenant out of every backend; returns the cgroup its caps
    /// were shared at if no tenant shares it any more.
    fn disconnect(&mut self, name: &str) -> Option<PathBuf> {
        self.backend.qmp.remove_tenant(name);
        if let Some(l) = self.backend.libvirt.as_mut() {
            l.remove_tenant(name);
        }
        let holder = self.backend.cgroups.remove_tenant(name)?;
        (self.backend.cgroups.sharing(&holder) == 0).then_some(holder)
    }

    /// One interval of this device: its controller decides and applies, the
    /// device's state is noted, and each tenant in `roster` takes what the
    /// interval did to it (`dt`: its length in seconds). Returns the
    /// decision time.
    pub(super) fn tick(
        &mut self,
        now: Duration,
        early: bool,
        roster: &mut Roster,
        dt: f64,
    ) -> Duration {
        let report = if early {
            self.controller.tick_early(now, &mut self.backend)
        } else {
            self.controller.tick(now, &mut self.backend)
        };
        self.note_device(&report);
        for name in &report.counter_resets {
            warn!(tenant = %name, "counters went backwards (cgroup or VM recreated?); its limits are written again");
            self.controller.forget_caps(name);
        }
        let mut errors: HashMap<String, String> = report.errors.into_iter().collect();
        let verdicts = &report.verdicts.tenants;
        let outcomes =
            report
                .samples
                .iter()
                .zip(&report.applied)
                .enumerate()
                .map(|(i, (sample, caps))| TenantOutcome {
                    name: sample.spec.name.clone(),
                    caps: *caps,
                    usage: sample.usage,
                    view: sample
                        .usage
                        .as_ref()
                        .map(|u| UsageView::new(u, self.cost.cost_rate(u))),
                    // A policy that gave no verdict for it judged nothing.
                    floor_met: verdicts.get(i).and_then(|v| v.floor_met),
                    error: errors.remove(&sample.spec.name),
                });
        for outcome in outcomes {
            if let Some(t) = roster.get_mut(&outcome.name) {
                t.absorb(outcome, dt);
            }
        }
        report.decision_time
    }

    /// Notes what the interval showed of the device: its counters, the
    /// policy's verdict and capacity, and whether the floors fit (logged
    /// once per change, not per interval).
    fn note_device(&mut self, report: &TickReport) {
        let step = self.controller.capacity_step();
        self.note_capacity_fault(step.and_then(|s| s.fault));
        let state = &mut self.state;
        state.utilisation = report.device.map(|s| s.utilisation);
        state.avg_queue = report.device.map(|s| s.avg_queue);
        state.capacity_estimate = self.controller.capacity_estimate();
        state.capacity_step = step;
        state.capacity_curve = self.controller.capacity_curve();
        // Each interval's judgement, for an operator asking why the learned
        // capacity moved (`IOFLOOR_LOG=iofloor_daemon=debug`).
        if let Some(step) = &state.capacity_step {
            debug!(
                device = %self.config.name,
                verdict = ?step.verdict,
                phase = ?step.phase,
                estimate = step.estimate,
                level = step.level,
                plateau = step.plateau,
                served = step.seen.served,
                floors_need = step.seen.floors_need,
                latency_us = step.seen.latency_us,
                avg_queue = step.seen.avg_queue,
                capped = step.seen.capped,
                capped_shortfall = step.seen.capped_shortfall,
                wants_more = step.seen.wants_more,
                floor_share = step.seen.floor_share,
                departed = step.seen.departed,
                early = step.seen.early,
                "capacity step"
            );
        }
        self.note_model_disagreement();
        let state = &mut self.state;
        state.latency_us = report.device.and_then(|s| s.mean_latency_us());
        state.contended = Some(report.verdicts.contended);
        let feasibility = self.controller.feasibility();
        let feasible = feasibility.map(|f| f.feasible());
        if feasible.is_some() && feasible != state.floors_feasible {
            match feasibility {
                Some(f) if !f.feasible() => warn!(
                    device = %self.config.name,
                    capacity = f.capacity,
                    floors = f.floors,
                    shortfall = f.shortfall,
                    "the active floors no longer fit the device's learned capacity: every entitlement is scaled down by the same factor"
                ),
                Some(f) => info!(
                    device = %self.config.name,
                    capacity = f.capacity,
                    floors = f.floors,
                    "the active floors fit the device again"
                ),
                None => {}
            }
        }
        state.floors_feasible = feasible;
        state.floor_shortfall = feasibility.map(|f| f.shortfall);
        let in_reach = feasibility.and_then(|f| f.latency_target_in_reach);
        let threshold_us = feasibility.and_then(|f| f.latency_threshold_us);
        if in_reach.is_some() && in_reach != state.latency_target_in_reach {
            match in_reach {
                Some(false) => warn!(
                    device = %self.config.name,
                    judged_at_us = threshold_us,
                    "latency_target is below 1.25 x this device's least latency (the least on its curve of the last two minutes): no cap can meet it, so the device is held under that instead"
                ),
                Some(true) if state.latency_target_in_reach.is_some() => {
                    info!(device = %self.config.name, "latency_target is within the device's reach again")
                }
                _ => {}
            }
        }
        state.latency_target_in_reach = in_reach;
        state.latency_threshold_us = threshold_us;
    }
}

impl DeviceLoop {
    /// Says once, at each change, why the capacity loop holds its estimate
    /// without judging the device (and when it judges again).
    fn note_capacity_fault(&mut self, fault: Option<iofloor_core::capacity::Fault>) {
        if fault == self.capacity_fault {
            return;
        }
        match fault {
            Some(fault) => warn!(
                device = %self.config.name,
                "the capacity loop holds its estimate: {fault}"
            ),
            None => info!(device = %self.config.name, "the capacity loop judges the device again"),
        }
        self.capacity_fault = fault;
    }

    /// Says once when the capacity learned strays [`MODEL_DISAGREEMENT`]
    /// times or more from the model file the config names: the loop learns
    /// the device away from it, but the file prices every floor in IOPS or
    /// bytes and should be measured again.
    fn note_model_disagreement(&mut self) {
        let (ModelSource::File(file), Some(estimate)) =
            (&self.config.model, self.state.capacity_estimate)
        else {
            return;
        };
        let off = estimate.max(1e-9).max(1.0 / estimate.max(1e-9));
        if off >= MODEL_DISAGREEMENT && !self.model_disagreement_told {
            warn!(
                device = %self.config.name,
                model_file = %file.display(),
                learned = estimate,
                "the device delivers {estimate:.2}x what the model file says: floors in IOPS or bytes are priced by it; measure it again (`iofloor calibrate`)"
            );
            self.model_disagreement_told = true;
        }
    }
}

impl Tenant {
    /// Takes what an interval of its device did to it; `dt` is the
    /// interval's length in seconds.
    fn absorb(&mut self, outcome: TenantOutcome, dt: f64) {
        self.throttled_for = if self.caps.is_unlimited() { 0.0 } else { dt };
        self.throttled_seconds += self.throttled_for;
        self.caps = outcome.caps;
        self.usage = outcome.view;
        if let Some(u) = outcome.usage.filter(|u| !u.is_idle()) {
            self.last_mix = Some(u);
        }
        self.floor_met = outcome.floor_met;
        note_availability(self, &outcome.name, outcome.error.as_deref());
    }
}

/// A tenant's read or write failed (`error`) or worked this interval: logged
/// once when it starts failing, when the reason changes (at debug) and when
/// it recovers, not every interval.
fn note_availability(t: &mut Tenant, name: &str, error: Option<&str>) {
    match error {
        Some(e) => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use iofloor_core::{
        judge, Backend, Counters, DeviceCounters, PolicyKind, Rate, TenantClass, TenantSpec,
    };
    use std::sync::Arc;

    /// A device that serves `iops` 4 KiB random reads per second to each
    /// tenant and keeps `queue` I/Os in flight on average.
    struct Steady {
        iops: u64,
        queue: u64,
        seconds: u64,
    }

    impl Backend for Steady {
        type Error = String;
        fn read_counters(&mut self, _: &TenantSpec) -> Result<Counters, String> {
            let ios = self.iops * self.seconds;
            Ok(Counters {
                read_ios: ios,
                read_bytes: ios * 4096,
                ..Counters::default()
            })
        }
        fn read_device(&mut self) -> Option<DeviceCounters> {
            let ns = self.seconds * 1_000_000_000;
            Some(DeviceCounters {
                busy_ns: ns,
                queue_ns: self.queue * ns,
                completions: 2 * self.iops * self.seconds,
            })
        }
        fn apply_caps(&mut self, _: &TenantSpec, _: &iofloor_core::Caps) -> Result<(), String> {
            Ok(())
        }
    }

    /// The service shows the verdict the policy decided by. With a queue
    /// knee from calibration (the config sets none), a device whose queue is
    /// past the knee is contended although the load is far under the
    /// border, so a tenant under its floor missed it. Judged again from the
    /// config's own parameters, as the service did before, it was shown as
    /// met.
    #[test]
    fn floor_met_follows_the_calibrated_knee_the_policy_decided_by() {
        let text = "[[device]]\nid = \"7:0\"\nmodel = { rbps = 1e9, rseqiops = 4e3, rrandiops = 4e3, wbps = 1e9, wseqiops = 4e3, wrandiops = 4e3 }\n";
        let config = Config::parse(text, Path::new("/x.toml")).unwrap();
        assert_eq!(config.params.floor.queue_knee, None);
        let params = policy_params(&config, Some(2.0));
        let cost = iofloor_core::synthetic::iops_only_model(4000.0);
        let policy = iofloor_core::build_policy(
            PolicyKind::Floor,
            &params,
            PolicyContext {
                cost,
                capacity: 1.0,
            },
        );
        let spec = |name: &str| {
            Arc::new(TenantSpec::new(name, TenantClass::Container).with_floor(Rate::Iops(1000.0)))
        };
        let mut controller = Controller::new(policy, vec![spec("db"), spec("web")]);
        let mut device = Steady {
            iops: 500,
            queue: 6,
            seconds: 0,
        };
        let mut report = controller.tick(Duration::ZERO, &mut device);
        for s in 1..=3 {
            device.seconds = s;
            report = controller.tick(Duration::from_secs(s), &mut device);
        }
        let load = report
            .samples
            .iter()
            .filter_map(|s| s.usage.as_ref())
            .map(|u| cost.cost_rate(u))
            .sum::<f64>();
        let judged_again = judge::contended(
            load,
            config.params.floor.border,
            report.device.map(|d| d.avg_queue),
            config.params.floor.queue_knee,
        );
        assert!(
            !judged_again,
            "a quarter of the device, no knee in the config"
        );
        assert!(report.verdicts.contended, "queue 6 is past the knee of 2");
        for v in &report.verdicts.tenants {
            assert_eq!(v.entitled, Some(1000.0));
            assert_eq!(v.floor_met, Some(false), "500 of a 1,000 IOPS floor");
        }
    }
}
