//! One run on a real device, in three parts a reader can take one at a time:
//! [`Play::start`] makes the tenants' cgroups (or QEMU paths) and the
//! controller, [`Play::drive`] starts and stops fio on the scenario's
//! schedule while the policy ticks and each second's window is sampled, and
//! [`latency_from_logs`] turns fio's per-I/O logs into the latency figures.

use crate::agents::{AgentPlan, Agents};
use crate::arrival::Arrivals;
use crate::capacity::CapacityKnob;
use crate::session::{LogInfo, Session};
use crate::truth::RigTruth;
use crate::{BenchError, BenchOptions, Result};
use iofloor_core::control::Controller;
use iofloor_core::cost::CostModel;
use iofloor_core::model::Direction;
use iofloor_core::policy::{self, PolicyContext, PolicyKind};
use iofloor_core::units::Rate;
use iofloor_core::Backend;
use iofloor_core::{Counters, DirUsage, Usage};
use iofloor_host::backends::{HybridBackend, QmpBackend, QmpTarget};
use iofloor_host::cgroup::DevId;
use iofloor_host::diskstats::{DiskStat, DiskStats};
use iofloor_host::fio;
use iofloor_host::kernel_control::{IoCostQos, KernelControl, KernelSetup};
use iofloor_host::CgroupBackend;
use iofloor_report::record::{CapacityTraceEntry, DeviceWindow, TenantWindow, Throughput, Window};
use iofloor_scenario::format::{Job, Scenario, UnmanagedOrigin};
use iofloor_scenario::{DecisionStats, KernelPeer, LatencyRecorder, RawRun};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a run's tenants do their I/O: the one device of a host's bench,
/// or on the cluster test bed each host's own view of the shared device.
pub(crate) struct Placement {
    /// Per host: its block device.
    pub devices: Vec<(PathBuf, DevId)>,
    /// Per tenant of the scenario played: its host.
    pub tenant_host: Vec<usize>,
}

impl Placement {
    /// Every tenant on one device.
    pub fn one_device(device: &Path, dev: DevId, tenants: usize) -> Placement {
        Placement {
            devices: vec![(device.to_path_buf(), dev)],
            tenant_host: vec![0; tenants],
        }
    }
}

/// What drives the throttles of one run.
pub(crate) enum Driver<'a> {
    /// Nothing: the reference run and the alone baselines.
    Nothing,
    /// The policy in this process, on the one host's throttles.
    Policy(PolicyKind),
    /// `iofloor run` on every host of the cluster bed, started once the
    /// tenants' cgroups exist; they also play the scenario's host events.
    Agents(AgentPlan<'a>),
}

/// What a run needs from its platform.
pub(crate) struct Setup<'a> {
    pub opts: &'a BenchOptions,
    pub placement: Placement,
    pub driver: Driver<'a>,
    /// One of the kernel's own controllers, set up once the tenants'
    /// cgroups exist and put back when the run ends.
    pub kernel: Option<KernelPeer>,
    /// Set by a signal handler: the run stops at the next check.
    pub stop: &'a AtomicBool,
}

/// Plays one scenario as `setup` says.
pub(crate) fn play(
    scenario: &Scenario,
    setup: Setup<'_>,
    tag: &str,
    progress: &(dyn Fn(f64) + Sync),
) -> Result<RawRun> {
    let stop = setup.stop;
    let mut run = Play::start(scenario, setup, tag)?;
    let (windows, decisions) = run.drive(stop, progress)?;
    // The agents first: they put back every limit they set before the
    // session removes the cgroups.
    if let Some(agents) = run.agents.take() {
        agents.stop()?;
    }
    let logs = run.session.stop_all()?;
    if let Some(kernel) = run.kernel.take() {
        kernel.restore()?;
    }
    let (windows, latency) = latency_from_logs(scenario, windows, &logs)?;
    run.session.cleanup()?;
    let ios_completed = windows
        .iter()
        .flat_map(|w| w.tenants.iter().map(|t| t.got.iops))
        .sum::<f64>() as u64;
    Ok(RawRun {
        windows,
        latency,
        decisions: decisions.stats,
        ios_completed,
        capacity_trace: decisions.capacity_trace,
    })
}

/// One backend per host's device: its cgroups, and QEMU paths over QMP.
fn backends(opts: &BenchOptions, devs: &[DevId]) -> Result<Vec<HybridBackend>> {
    devs.iter()
        .map(|&dev| {
            Ok(HybridBackend {
                cgroups: CgroupBackend::new(
                    iofloor_host::cgroup::controller(&opts.cgroup_root, dev)?,
                    Some(DiskStats::proc(dev)),
                ),
                qmp: QmpBackend::new(Duration::from_secs(2)),
                libvirt: None,
            })
        })
        .collect()
}

/// The device each unmanaged load runs on: its own, this host's, or a
/// second view of the rig standing for another host.
fn place_unmanaged(
    scenario: &Scenario,
    opts: &BenchOptions,
    session: &mut Session,
) -> Result<Vec<PathBuf>> {
    let rig = crate::rig_of(&opts.device, &opts.rig_state_dir);
    let mut devices = Vec::with_capacity(scenario.unmanaged.len());
    for u in &scenario.unmanaged {
        devices.push(match (u.origin, &rig) {
            _ if let Some(placed) = &u.device => placed.value.clone(),
            (UnmanagedOrigin::ThisHost, _) => opts.device.clone(),
            (UnmanagedOrigin::OtherHost, Some(rig)) => session.add_other_host_device(rig)?,
            (UnmanagedOrigin::OtherHost, None) => {
                return Err(BenchError::Invalid(format!(
                    "unmanaged load `{}` from another host needs a rig behind {}",
                    u.name,
                    opts.device.display()
                )))
            }
        });
    }
    Ok(devices)
}

/// Puts each tenant where it does its I/O, in its host's backend: a VM
/// behind a QEMU path of its own (with `--vm-path`), else a cgroup on the
/// host's device; returns each one's device.
fn place_tenants(
    scenario: &Scenario,
    opts: &BenchOptions,
    placement: &Placement,
    session: &mut Session,
    backends: &mut [HybridBackend],
    work: &Path,
) -> Result<Vec<PathBuf>> {
    let mut tenant_device = Vec::with_capacity(scenario.tenants.len());
    for (i, t) in scenario.tenants.iter().enumerate() {
        let host = placement.tenant_host[i];
        let backend = &mut backends[host];
        if opts.vm_paths && t.spec.class == iofloor_core::TenantClass::Vm {
            let vm = session.add_vm_path(&opts.device, &work.join("vm-paths"))?;
            let disk = vm.device.clone().expect("a started VM path has a device");
            let stats_device = DevId::of_block_device(&disk)?;
            backend.qmp.add_tenant(
                &t.spec.name,
                &vm.socket,
                QmpTarget::Group {
                    group: "dev".into(),
                    stats_device,
                },
            );
            tenant_device.push(disk);
        } else {
            backend
                .cgroups
                .add_tenant(&t.spec.name, session.tenant_cgroup(i).to_path_buf());
            tenant_device.push(placement.devices[host].0.clone());
        }
    }
    Ok(tenant_device)
}

/// How long the load due at a run's start may take to begin its I/O.
const LOAD_START_LIMIT: Duration = Duration::from_secs(30);

/// io.cost's latency target in `iocost-qos`: the 95th percentile of
/// completions within 5 ms, above a QD-1 tenant's p99 alone on the v2
/// guest's 1,000-IOPS disk (1.5–3.7 ms measured), so only a real queue
/// trips it.
const IOCOST_QOS_PCT: f64 = 95.0;
const IOCOST_QOS_LAT_US: u64 = 5_000;

/// Sets up the kernel's controller `peer` on the device: io.cost with the
/// policies' own cost model (or BFQ), each tenant weighted by its floor in
/// cost units at its jobs' mix (a tenant without a floor at the least).
fn kernel_control(
    scenario: &Scenario,
    peer: KernelPeer,
    opts: &BenchOptions,
    session: &Session,
    dev: DevId,
) -> Result<KernelControl> {
    let model = &scenario.policy_model;
    let tenants: Vec<(PathBuf, f64)> = scenario
        .tenants
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mix = scenario.expected_mix(t).unwrap_or_default();
            let floor = t.spec.floor.and_then(|f| model.rate_to_cost(f, &mix));
            (session.tenant_cgroup(i).to_path_buf(), floor.unwrap_or(0.0))
        })
        .collect();
    let setup = match peer {
        KernelPeer::IoCost => KernelSetup::IoCost {
            model: *model.params(),
            qos: IoCostQos::PINNED,
        },
        KernelPeer::IoCostQos => KernelSetup::IoCost {
            model: *model.params(),
            qos: IoCostQos::latency(IOCOST_QOS_PCT, IOCOST_QOS_LAT_US),
        },
        KernelPeer::Bfq => KernelSetup::Bfq,
    };
    let journal = crate::session::kernel_journal()?;
    Ok(KernelControl::apply(
        &setup,
        &opts.cgroup_root,
        Path::new("/sys"),
        dev,
        &tenants,
        Some(&journal),
    )?)
}

/// The policy `kind` over the scenario's tenants, as the daemon builds it.
fn policy_controller(scenario: &Scenario, kind: PolicyKind) -> Controller {
    let ctx = PolicyContext {
        cost: scenario.policy_model,
        capacity: 1.0,
    };
    let specs = scenario
        .tenants
        .iter()
        .map(|t| Arc::new(t.spec.clone()))
        .collect();
    Controller::new(policy::build(kind, &scenario.policy, ctx), specs)
}

/// Where a run stands on its schedule: the next process change, device
/// change, tick, look and window, and when the last window closed.
struct Clock {
    next_change: usize,
    next_device_change: usize,
    next_tick: Duration,
    next_look: Duration,
    next_window: Duration,
    last_window_at: Duration,
}

impl Default for Clock {
    fn default() -> Self {
        Clock {
            next_change: 0,
            next_device_change: 0,
            next_tick: Duration::ZERO,
            next_look: Duration::ZERO,
            next_window: Duration::from_secs(1),
            last_window_at: Duration::ZERO,
        }
    }
}

/// The counters at the last window's end, each window measured from them,
/// and what the rig could do.
struct Meter {
    counters: Vec<Counters>,
    diskstats: Vec<DiskStats>,
    disk: Vec<DiskStat>,
    truth: RigTruth,
    arrivals: Arrivals,
}

/// The policy's decision times, and the tenants whose errors were said
/// (each once).
#[derive(Default)]
struct Decisions {
    stats: DecisionStats,
    /// The capacity loop's judgement of each decision, at seconds from the start.
    capacity_trace: Vec<CapacityTraceEntry>,
    errors_seen: std::collections::HashSet<String>,
}

/// A run in progress: its resources and the controller.
struct Play<'s> {
    scenario: &'s Scenario,
    /// Before `session`: dropped (stopped) before the cgroups go.
    agents: Option<Agents>,
    /// The kernel's controller in force, put back before the cgroups go.
    kernel: Option<KernelControl>,
    session: Session,
    /// One per host (index as in [`Placement::devices`]).
    backends: Vec<HybridBackend>,
    tenant_host: Vec<usize>,
    controller: Option<Controller>,
    /// The device each tenant's fio processes use (the shared one, or a VM's
    /// QEMU path), then each unmanaged source's.
    tenant_device: Vec<PathBuf>,
    /// The rig or guest disk behind the device, if it is one: the
    /// scenario's device changes go to it, and its limits are what the
    /// device could do.
    capacity: Option<CapacityKnob>,
    work: PathBuf,
    devs: Vec<DevId>,
}

impl<'s> Play<'s> {
    fn start(scenario: &'s Scenario, setup: Setup<'_>, tag: &str) -> Result<Play<'s>> {
        let Setup {
            opts,
            placement,
            driver,
            kernel,
            ..
        } = setup;
        let devs: Vec<DevId> = placement.devices.iter().map(|(_, dev)| *dev).collect();
        let work = opts.work_dir.join(tag);
        std::fs::create_dir_all(&work).map_err(|source| BenchError::Io {
            path: work.clone(),
            source,
        })?;
        let mut session = Session::create(&opts.cgroup_root, &devs, scenario, tag)?;
        let max_procs = most_processes(scenario);
        // Every host's device is a view of the same storage: the regions
        // are shared out over all of them.
        let region = (device_sectors(devs[0])? * 512 / max_procs as u64) / (1 << 20) * (1 << 20);
        if region < 1 << 20 {
            return Err(BenchError::Invalid(format!(
                "{}: too small for {max_procs} fio processes",
                placement.devices[0].0.display()
            )));
        }
        session.set_regions(max_procs, region);

        let mut backends = backends(opts, &devs)?;
        let mut tenant_device = place_tenants(
            scenario,
            opts,
            &placement,
            &mut session,
            &mut backends,
            &work,
        )?;
        tenant_device.extend(place_unmanaged(scenario, opts, &mut session)?);
        let kernel = kernel
            .map(|peer| kernel_control(scenario, peer, opts, &session, devs[0]))
            .transpose()?;
        let (controller, agents) = match driver {
            Driver::Nothing => (None, None),
            Driver::Policy(kind) => (Some(policy_controller(scenario, kind)), None),
            Driver::Agents(plan) => (None, Some(plan.start(scenario, &session, &work)?)),
        };
        // A rig is known from its state (its limits chart the true
        // capacity); the guest's relay is asked only by a scenario that
        // changes the disk.
        let capacity = if scenario.device.changes.is_empty() {
            crate::rig_of(&opts.device, &opts.rig_state_dir).map(CapacityKnob::Rig)
        } else {
            CapacityKnob::find(&opts.device, &opts.rig_state_dir)?
        };
        Ok(Play {
            scenario,
            agents,
            kernel,
            capacity,
            session,
            backends,
            tenant_host: placement.tenant_host,
            controller,
            tenant_device,
            work,
            devs,
        })
    }

    /// Runs the schedule to the end; returns the windows (latency not yet
    /// filled in) and the policy's decision times.
    fn drive(
        &mut self,
        stop: &AtomicBool,
        progress: &(dyn Fn(f64) + Sync),
    ) -> Result<(Vec<Window>, Decisions)> {
        let scenario = self.scenario;
        let model = scenario.policy_model;
        let n = scenario.tenants.len();
        let duration = scenario.duration;
        let plan = changes(scenario);
        let mut running: Vec<Vec<u32>> = scenario
            .tenants
            .iter()
            .map(|t| t.jobs.len())
            .chain(scenario.unmanaged.iter().map(|u| u.jobs.len()))
            .map(|jobs| vec![0; jobs])
            .collect();
        let mut windows: Vec<Window> = Vec::new();
        let mut clock = Clock::default();
        self.start_load(&plan, &mut clock, &mut running, stop)?;
        let mut meter = self.meter()?;
        let mut decisions = Decisions::default();
        let start = Instant::now();
        self.session.start = Some(start);
        // What each tenant asks during the open window: what ran at its
        // start. Taken at its end, a phase starting right at the boundary
        // (a noisy tenant back at 30 s) made the idle window before it ask
        // for everything, and its floor counted as missed there.
        let mut window_demand: Option<Vec<Option<Throughput>>> = None;
        let demand_now = |running: &[Vec<u32>]| -> Vec<Option<Throughput>> {
            (0..n)
                .map(|i| declared_demand(scenario, i, &running[i], &model))
                .collect()
        };
        loop {
            if stop.load(Ordering::SeqCst) {
                return Err(BenchError::Interrupted);
            }
            let now = start.elapsed();
            self.start_processes(&plan, &mut clock, now, &mut running, &mut meter.arrivals)?;
            self.watch_arrivals(&mut meter.arrivals, now)?;
            self.change_device(&mut clock, now, &mut meter.truth)?;
            if let Some(agents) = self.agents.as_mut() {
                agents.play_events(now)?;
                if let Some(msg) = agents.check()? {
                    return Err(BenchError::Failed(msg));
                }
            }
            let begun = meter.arrivals.waiting().next().is_none();
            self.control(&mut clock, now, begun, &mut decisions);
            let demand = window_demand.get_or_insert_with(|| demand_now(&running));
            if now >= clock.next_window {
                windows.extend(self.close_windows(&mut clock, &mut meter, demand, now)?);
                *demand = demand_now(&running);
                progress((now.as_secs_f64() / duration.as_secs_f64()).min(1.0));
            }
            if let Some(msg) = self.session.check_processes()? {
                return Err(BenchError::Failed(msg));
            }
            if now >= duration {
                break;
            }
            let wake = self.next_wake(&clock, &plan, now);
            std::thread::sleep((wake - now).min(Duration::from_millis(50)));
        }
        Ok((windows, decisions))
    }

    /// The windows up to `now`, measured over the time the counters really
    /// span: a stop of slow fio processes may have held the loop past the
    /// window's end, and a 1 s divisor would then show a burst and a gap.
    /// Every window the span covers gets its mean rates, so window k stays
    /// second k (the latency logs are binned so).
    fn close_windows(
        &mut self,
        clock: &mut Clock,
        meter: &mut Meter,
        demand: &[Option<Throughput>],
        now: Duration,
    ) -> Result<Vec<Window>> {
        let span = (clock.last_window_at, now);
        clock.last_window_at = now;
        let (tenants, device) = self.measure(meter, demand, span)?;
        let mut windows = Vec::new();
        while clock.next_window <= now {
            windows.push(Window {
                t: clock.next_window.as_secs_f64() - 1.0,
                tenants: tenants.clone(),
                device: device.clone(),
            });
            clock.next_window += Duration::from_secs(1);
        }
        Ok(windows)
    }

    /// The counters every window is measured from, as they are now.
    fn meter(&mut self) -> Result<Meter> {
        let scenario = self.scenario;
        let counters = scenario
            .tenants
            .iter()
            .enumerate()
            .map(|(i, t)| self.read_counters(i, &t.spec))
            .collect::<Result<_>>()?;
        let diskstats: Vec<DiskStats> = self.devs.iter().map(|d| DiskStats::proc(*d)).collect();
        let disk = diskstats
            .iter()
            .map(|d| d.read().map_err(BenchError::from))
            .collect::<Result<_>>()?;
        Ok(Meter {
            counters,
            diskstats,
            disk,
            truth: RigTruth::new(self.capacity.as_ref().map(CapacityKnob::spec)),
            arrivals: Arrivals::new(scenario.tenants.len()),
        })
    }

    /// Starts the load due at the run's time 0 and waits until each of its
    /// tenants does I/O: the run's clock starts then. A fio process loads
    /// some fifty libraries before its first I/O; on a TCG guest one took
    /// 1.1 s of its vCPU and seven started together 8 s (measured), so a
    /// 10-s run at `--time-scale 0.25` saw its tenants for 2-4 s, or for
    /// none of it, and counted the rest as floors missed.
    fn start_load(
        &mut self,
        plan: &[Change],
        clock: &mut Clock,
        running: &mut [Vec<u32>],
        stop: &AtomicBool,
    ) -> Result<()> {
        let mut arrivals = Arrivals::new(self.scenario.tenants.len());
        self.start_processes(plan, clock, Duration::ZERO, running, &mut arrivals)?;
        let deadline = Instant::now() + LOAD_START_LIMIT;
        loop {
            let Some(i) = arrivals.waiting().next() else {
                return Ok(());
            };
            if stop.load(Ordering::SeqCst) {
                return Err(BenchError::Interrupted);
            }
            if let Some(msg) = self.session.check_processes()? {
                return Err(BenchError::Failed(msg));
            }
            if Instant::now() >= deadline {
                return Err(BenchError::Failed(format!(
                    "tenant {}: no I/O {} s after its fio started",
                    self.scenario.tenants[i].spec.name,
                    LOAD_START_LIMIT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
            self.watch_arrivals(&mut arrivals, Duration::ZERO)?;
        }
    }

    /// Starts and stops the fio processes whose time in `plan` has come.
    fn start_processes(
        &mut self,
        plan: &[Change],
        clock: &mut Clock,
        now: Duration,
        running: &mut [Vec<u32>],
        arrivals: &mut Arrivals,
    ) -> Result<()> {
        while let Some(&c) = plan.get(clock.next_change).filter(|c| c.at <= now) {
            let job = job_of(self.scenario, c.tenant, c.job);
            let managed = c.tenant < self.scenario.tenants.len();
            if managed && c.numjobs > 0 && running[c.tenant].iter().all(|&n| n == 0) {
                let counters =
                    self.read_counters(c.tenant, &self.scenario.tenants[c.tenant].spec)?;
                arrivals.started(c.tenant, now, counters);
            }
            // Past the run's end: the run stops its processes itself, and
            // one whose I/O began first must not end before the clock
            // started by the last one (`start_load`) does.
            let remaining = self.scenario.duration.saturating_sub(now).as_secs_f64()
                + 1.0
                + LOAD_START_LIMIT.as_secs_f64();
            self.session.set_processes(
                c.tenant,
                c.job,
                job,
                c.numjobs,
                c.iodepth,
                remaining,
                &self.tenant_device[c.tenant],
                &self.work,
            )?;
            running[c.tenant][c.job] = c.numjobs;
            clock.next_change += 1;
        }
        Ok(())
    }

    /// Changes the device's capacity where the scenario says it changes by
    /// now: through the agents on the cluster bed, else on the rig, whose
    /// true capacity `truth` follows.
    fn change_device(
        &mut self,
        clock: &mut Clock,
        now: Duration,
        truth: &mut RigTruth,
    ) -> Result<()> {
        let changes = &self.scenario.device.changes;
        while let Some(&(_, factor)) = changes.get(clock.next_device_change).filter(|c| c.0 <= now)
        {
            if let Some(agents) = self.agents.as_mut() {
                agents.change_capacity(factor)?;
            } else {
                let knob = self.capacity.as_ref().ok_or_else(|| {
                    BenchError::Invalid(
                        "`device.change` needs a rig or the test guest's disk behind the device"
                            .into(),
                    )
                })?;
                self.session.change_capacity(knob, factor)?;
                truth.change(factor);
            }
            clock.next_device_change += 1;
        }
        Ok(())
    }

    /// The policy's tick when its time has come, or an early one when a
    /// look between intervals asks for it.
    fn control(
        &mut self,
        clock: &mut Clock,
        now: Duration,
        tenants_begun: bool,
        decisions: &mut Decisions,
    ) {
        let Some(ctrl) = self.controller.as_mut() else {
            return;
        };
        let interval = self.scenario.interval;
        // The first tick waits, at most an interval, for the tenants the run
        // starts with to issue I/O (fio takes 0.3-0.7 s here): a first
        // interval that saw them start was taken for the device's state. On
        // the rig's ramp with the calibrated knee, its served (0.73, at a
        // queue past the knee) became the level to regain, and probes took
        // 18 s back to 1.0. A service starts beside tenants already running.
        if clock.next_tick.is_zero() && !tenants_begun && now < interval {
            return;
        }
        let look_every = self.scenario.watch_interval;
        let early = match look_every {
            Some(every) if now >= clock.next_look && now < clock.next_tick => {
                clock.next_look = now + every;
                ctrl.look(now, &mut self.backends[0])
            }
            _ => false,
        };
        if now < clock.next_tick && !early {
            return;
        }
        let report = if early {
            ctrl.tick_early(now, &mut self.backends[0])
        } else {
            ctrl.tick(now, &mut self.backends[0])
        };
        decisions.stats.record(report.decision_time);
        if let Some(step) = ctrl.capacity_step() {
            decisions.capacity_trace.push(CapacityTraceEntry {
                t: now.as_secs_f64(),
                step,
            });
        }
        for (tenant, e) in report.errors {
            if decisions.errors_seen.insert(tenant.clone()) {
                eprintln!("warning: tenant {tenant}: {e}");
            }
        }
        clock.next_tick = if early || clock.next_tick.is_zero() {
            now + interval
        } else {
            clock.next_tick + interval
        };
        if let Some(every) = look_every {
            clock.next_look = now + every;
        }
    }

    /// The window that ends now, `secs` long: each tenant's throughput
    /// against what it asked (`demand`), and the device's.
    fn measure(
        &mut self,
        meter: &mut Meter,
        demand: &[Option<Throughput>],
        (from, to): (Duration, Duration),
    ) -> Result<(Vec<TenantWindow>, DeviceWindow)> {
        let scenario = self.scenario;
        let secs = to.saturating_sub(from).as_secs_f64().max(1e-3);
        let mut tenants = Vec::with_capacity(scenario.tenants.len());
        for (i, t) in scenario.tenants.iter().enumerate() {
            let cur = self.read_counters(i, &t.spec)?;
            meter.arrivals.seen(i, to, &cur);
            let seq = seq_share(scenario, i);
            tenants.push(TenantWindow {
                got: window_throughput(&meter.counters[i], &cur, secs, seq, &scenario.policy_model),
                demand: demand[i],
                mean_latency_ms: None,
                cap_cost: None,
                active_share: meter.arrivals.active_share(i, from, to),
            });
            meter.counters[i] = cur;
        }
        // On the cluster bed each host's disk counters hold only its own
        // I/O: the queues add up, the busiest host's utilisation is the
        // device's least.
        let (mut avg_queue, mut utilisation) = (0.0, 0.0f64);
        for (stats, last) in meter.diskstats.iter().zip(meter.disk.iter_mut()) {
            let disk = stats.read()?;
            let queue_ms = disk.time_in_queue_ms.saturating_sub(last.time_in_queue_ms);
            let busy_ms = disk.io_ticks_ms.saturating_sub(last.io_ticks_ms);
            avg_queue += queue_ms as f64 / 1000.0 / secs;
            utilisation = utilisation.max((busy_ms as f64 / 1000.0 / secs).min(1.0));
            *last = disk;
        }
        let device = DeviceWindow {
            avg_queue,
            utilisation,
            mean_latency_ms: None,
            capacity: self.controller.as_ref().and_then(|c| c.capacity_estimate()),
            true_capacity: meter.truth.for_window(&tenants),
            // Filled in from the unmanaged jobs' fio logs at the end.
            unmanaged: None,
        };
        Ok((tenants, device))
    }

    /// Looks at the counters of the tenants started and not yet seen doing
    /// I/O ([`Arrivals`]).
    fn watch_arrivals(&mut self, arrivals: &mut Arrivals, now: Duration) -> Result<()> {
        let waiting: Vec<usize> = arrivals.waiting().collect();
        for i in waiting {
            let counters = self.read_counters(i, &self.scenario.tenants[i].spec)?;
            arrivals.seen(i, now, &counters);
        }
        Ok(())
    }

    /// When the loop next has something to do (at most the run's end).
    fn next_wake(&self, clock: &Clock, plan: &[Change], now: Duration) -> Duration {
        let scenario = self.scenario;
        let duration = scenario.duration;
        [
            clock.next_window,
            clock.next_tick,
            scenario
                .watch_interval
                .map_or(duration, |_| clock.next_look),
            plan.get(clock.next_change).map_or(duration, |c| c.at),
            scenario
                .device
                .changes
                .get(clock.next_device_change)
                .map_or(duration, |c| c.0),
            self.agents
                .as_ref()
                .and_then(Agents::next_event)
                .unwrap_or(duration),
            duration,
        ]
        .into_iter()
        .filter(|t| *t > now)
        .min()
        .unwrap_or(now)
    }

    fn read_counters(
        &mut self,
        tenant: usize,
        spec: &iofloor_core::TenantSpec,
    ) -> Result<Counters> {
        Ok(self.backends[self.tenant_host[tenant]].read_counters(spec)?)
    }
}

/// Latency from fio's per-I/O logs: per-window means for each tenant and the
/// device, and each tenant's distribution after warm-up. The unmanaged jobs'
/// logs give what that load was served in each window (its I/Os counted at
/// completion, priced with the policy's model like the tenants').
fn latency_from_logs(
    scenario: &Scenario,
    mut windows: Vec<Window>,
    logs: &[LogInfo],
) -> Result<(Vec<Window>, Vec<iofloor_report::record::LatencySummary>)> {
    let n = scenario.tenants.len();
    let mut recorders: Vec<LatencyRecorder> = vec![LatencyRecorder::default(); n];
    let mut win_lat: Vec<Vec<(f64, u64)>> = vec![vec![(0.0, 0); windows.len()]; n];
    let mut dev_lat: Vec<(f64, u64)> = vec![(0.0, 0); windows.len()];
    let (warmup, end) = (
        scenario.warmup.as_secs_f64(),
        scenario.duration.as_secs_f64(),
    );
    let mut unmanaged: Vec<Option<Throughput>> =
        vec![(!scenario.unmanaged.is_empty()).then(Throughput::default); windows.len()];
    for log in logs {
        if !log.path.exists() {
            continue;
        }
        // Unmanaged load is no tenant's: it shows in the device's work and
        // in what it does to the tenants, never in their latency.
        if log.tenant >= n {
            let job = job_of(scenario, log.tenant, log.job);
            let cost = |dir| {
                scenario
                    .policy_model
                    .io_cost(dir, job.bs as f64, job.rw.sequential())
            };
            let (read_cost, write_cost) = (cost(Direction::Read), cost(Direction::Write));
            for (ms, _, write) in fio::read_lat_log(&log.path)? {
                let t = log.started + ms as f64 / 1000.0;
                if t < 0.0 {
                    continue;
                }
                let Some(Some(w)) = unmanaged.get_mut(t as usize) else {
                    continue;
                };
                w.iops += 1.0;
                w.bytes_per_s += job.bs as f64;
                w.cost += if write { write_cost } else { read_cost };
            }
            continue;
        }
        for (ms, lat_ns, _) in fio::read_lat_log(&log.path)? {
            let t = log.started + ms as f64 / 1000.0;
            if t < 0.0 {
                continue;
            }
            if t >= warmup && t < end {
                recorders[log.tenant].record_ns(lat_ns);
            }
            let k = t as usize;
            if k < windows.len() {
                win_lat[log.tenant][k].0 += lat_ns as f64;
                win_lat[log.tenant][k].1 += 1;
                dev_lat[k].0 += lat_ns as f64;
                dev_lat[k].1 += 1;
            }
        }
    }
    let mean_ms = |(sum, cnt): (f64, u64)| (cnt > 0).then(|| sum / cnt as f64 / 1e6);
    for (k, w) in windows.iter_mut().enumerate() {
        for (i, tw) in w.tenants.iter_mut().enumerate() {
            tw.mean_latency_ms = mean_ms(win_lat[i][k]);
        }
        w.device.mean_latency_ms = mean_ms(dev_lat[k]);
        w.device.unmanaged = unmanaged[k];
    }
    Ok((
        windows,
        recorders.iter().map(LatencyRecorder::summary).collect(),
    ))
}

/// Each concurrently running process gets its own region of the device.
fn most_processes(scenario: &Scenario) -> u32 {
    scenario
        .tenants
        .iter()
        .map(|t| &t.jobs)
        .chain(scenario.unmanaged.iter().map(|u| &u.jobs))
        .flat_map(|jobs| {
            jobs.iter()
                .map(|j| j.schedule.iter().map(|(_, s)| s.numjobs).max().unwrap_or(0))
        })
        .sum::<u32>()
        .max(1)
        // A depth change runs old and new processes side by side for a moment.
        * 2
}

/// One scheduled change of a job.
#[derive(Debug, Clone, Copy)]
struct Change {
    at: Duration,
    tenant: usize,
    job: usize,
    numjobs: u32,
    iodepth: u32,
}

/// Job `job` of source `source`: a tenant, or past the tenants an unmanaged load.
fn job_of(scenario: &Scenario, source: usize, job: usize) -> &Job {
    match scenario.tenants.get(source) {
        Some(t) => &t.jobs[job],
        None => &scenario.unmanaged[source - scenario.tenants.len()].jobs[job],
    }
}

fn changes(scenario: &Scenario) -> Vec<Change> {
    let mut out: Vec<Change> = scenario
        .tenants
        .iter()
        .map(|t| &t.jobs)
        .chain(scenario.unmanaged.iter().map(|u| &u.jobs))
        .enumerate()
        .flat_map(|(ti, jobs)| {
            jobs.iter().enumerate().flat_map(move |(ji, j)| {
                j.schedule.iter().map(move |(at, s)| Change {
                    at: *at,
                    tenant: ti,
                    job: ji,
                    numjobs: s.numjobs,
                    iodepth: s.iodepth,
                })
            })
        })
        .collect();
    out.sort_by_key(|c| c.at);
    out
}

fn job_usage(job: &Job, per_process_ios: f64) -> Usage {
    let seq = if job.rw.sequential() { 1.0 } else { 0.0 };
    let dir = |share: f64| DirUsage {
        ios: per_process_ios * share,
        bytes: per_process_ios * share * job.bs as f64,
        seq_ios: per_process_ios * share * seq,
    };
    Usage {
        read: dir(job.read_share),
        write: dir(1.0 - job.read_share),
        latency_us: None,
    }
}

/// What the tenant asks at the moment: the sum of its processes' rates, or
/// `None` (unbounded) if any running process is closed-loop.
fn declared_demand(
    scenario: &Scenario,
    tenant: usize,
    running: &[u32],
    model: &CostModel,
) -> Option<Throughput> {
    let mut u = Usage::default();
    for (job, &n) in scenario.tenants[tenant].jobs.iter().zip(running) {
        if n == 0 {
            continue;
        }
        let per_process_ios = match job.rate? {
            Rate::Iops(x) => x,
            Rate::BytesPerSec(b) => b / job.bs as f64,
            Rate::Cost(_) => return None,
        };
        let ju = job_usage(job, per_process_ios * n as f64);
        u.read.ios += ju.read.ios;
        u.read.bytes += ju.read.bytes;
        u.read.seq_ios += ju.read.seq_ios;
        u.write.ios += ju.write.ios;
        u.write.bytes += ju.write.bytes;
        u.write.seq_ios += ju.write.seq_ios;
    }
    Some(Throughput {
        iops: u.iops(),
        bytes_per_s: u.bytes_per_sec(),
        cost: model.cost_rate(&u),
    })
}

/// Share of a tenant's I/Os that are sequential, from its jobs (cgroups do not say).
fn seq_share(scenario: &Scenario, tenant: usize) -> f64 {
    let jobs = &scenario.tenants[tenant].jobs;
    jobs.iter().filter(|j| j.rw.sequential()).count() as f64 / jobs.len().max(1) as f64
}

fn window_throughput(
    prev: &Counters,
    cur: &Counters,
    secs: f64,
    seq: f64,
    model: &CostModel,
) -> Throughput {
    match iofloor_core::control::usage_between(prev, cur, Duration::from_secs_f64(secs)) {
        Some(mut u) => {
            u.read.seq_ios = u.read.ios * seq;
            u.write.seq_ios = u.write.ios * seq;
            Throughput {
                iops: u.iops(),
                bytes_per_s: u.bytes_per_sec(),
                cost: model.cost_rate(&u),
            }
        }
        None => Throughput::default(),
    }
}

fn device_sectors(dev: DevId) -> Result<u64> {
    let name = dev.kernel_name(Path::new("/sys"))?;
    let p = PathBuf::from(format!("/sys/class/block/{name}/size"));
    let text = std::fs::read_to_string(&p)
        .map_err(|e| BenchError::Failed(format!("{}: {e}", p.display())))?;
    text.trim()
        .parse()
        .map_err(|_| BenchError::Failed(format!("{}: not a number", p.display())))
}
