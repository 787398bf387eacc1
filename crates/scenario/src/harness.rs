//! The one harness: a scenario's policies played on a [`Platform`]. It owns
//! everything that must not differ between a simulated and a real run: the
//! `none` reference run every measure compares with, the alone baselines (a
//! tenant's demand in each window and its p99 with the device to itself), the
//! run records and the environment they carry.

use crate::format::Scenario;
use crate::stats::DecisionStats;
use iofloor_core::policy::PolicyKind;
use iofloor_core::units::RateUnit;
use iofloor_core::CostParams;
use iofloor_report::record::{
    CapacityTraceEntry, Environment, GroupInfo, LatencySummary, RunRecord, TenantInfo, Window,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

/// What one run on a platform measured, before the harness adds the baselines.
#[derive(Debug, Clone, Default)]
pub struct RawRun {
    /// One window per second; `demand` is filled only where the platform
    /// knows it (rate-limited jobs), the harness fills the rest from the alone runs.
    pub windows: Vec<Window>,
    /// Per tenant, after warm-up.
    pub latency: Vec<LatencySummary>,
    pub decisions: DecisionStats,
    pub ios_completed: u64,
    /// Every decision's judgement by the capacity loop (see `RunRecord`).
    pub capacity_trace: Vec<CapacityTraceEntry>,
}

/// Facts about the machine a platform runs on, for the records' environment.
#[derive(Debug, Clone, Default)]
pub struct RunEnvironment {
    pub kernel: Option<String>,
    pub fio_version: Option<String>,
    pub qemu_version: Option<String>,
    /// The simulated device's true cost model.
    pub device_model: Option<CostParams>,
}

/// What drives the throttles of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// The policy: on the one host, or in a cluster scenario run by the
    /// cluster's allocator over every host's tenants.
    Policy(PolicyKind),
    /// A cluster scenario with each host running the policy over its own
    /// tenants, with the whole device's model and nothing from the others:
    /// the single-host daemon on every host, the cluster mode's baseline.
    HostsAlone(PolicyKind),
    /// One of the kernel's own controllers, set up on a real device before
    /// the run and put back after it, alone or with a policy deciding the
    /// amounts on top (`floor+bfq`). The simulator models none of them:
    /// only [`run_controls`] asks for one, and `iofloor sim` does not
    /// accept them.
    Kernel(KernelRun),
}

impl Control {
    /// The policy that decides each interval (`none` under a kernel controller).
    pub fn kind(self) -> PolicyKind {
        match self {
            Control::Policy(k) | Control::HostsAlone(k) => k,
            Control::Kernel(run) => run.policy,
        }
    }

    /// The run's name in records and tables.
    pub fn label(self) -> String {
        match self {
            Control::Policy(k) => k.as_str().to_string(),
            Control::HostsAlone(k) => format!("{}-hosts-alone", k.as_str()),
            Control::Kernel(run) => run.label(),
        }
    }
}

/// The kernel's I/O controllers iofloor is measured against on cgroup v2,
/// each tenant weighted in proportion to its floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelPeer {
    /// io.cost with the policies' cost model as its own, its rate pinned
    /// to the model (no latency target), ordering by `io.weight`.
    IoCost,
    /// The same with a latency target (QoS): io.cost slows every tenant
    /// down when the device's completions come back late.
    IoCostQos,
    /// BFQ as the device's scheduler, ordering by `io.bfq.weight`.
    Bfq,
}

impl KernelPeer {
    pub const ALL: [KernelPeer; 3] = [KernelPeer::IoCost, KernelPeer::IoCostQos, KernelPeer::Bfq];

    pub fn as_str(self) -> &'static str {
        match self {
            KernelPeer::IoCost => "iocost",
            KernelPeer::IoCostQos => "iocost-qos",
            KernelPeer::Bfq => "bfq",
        }
    }

    pub fn parse(name: &str) -> Option<KernelPeer> {
        KernelPeer::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

/// A run under one of the kernel's controllers: `peer` orders the I/O, and
/// `policy` (`none` for the controller alone) decides the amounts through
/// the throttles, as in any run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelRun {
    pub peer: KernelPeer,
    pub policy: PolicyKind,
}

impl KernelRun {
    /// `iocost` for the controller alone, `floor+iocost` with a policy.
    pub fn label(self) -> String {
        match self.policy {
            PolicyKind::None => self.peer.as_str().to_string(),
            policy => format!("{}+{}", policy.as_str(), self.peer.as_str()),
        }
    }

    /// The run a label names (`iocost`, `floor+bfq`); `None` for any other
    /// name.
    pub fn parse(name: &str) -> Option<KernelRun> {
        let (policy, peer) = match name.split_once('+') {
            Some((policy, peer)) => (policy.parse().ok()?, peer),
            None => (PolicyKind::None, name),
        };
        Some(KernelRun {
            peer: KernelPeer::parse(peer)?,
            policy,
        })
    }
}

/// Where a scenario runs: the simulator, or fio on a real device.
pub trait Platform: Sync {
    type Error: std::error::Error + Send;

    /// "simulator" or "device".
    fn kind(&self) -> &'static str;

    /// The record's `source`: "sim" or "device:/dev/loop0".
    fn source(&self) -> String;

    /// How many runs may go at once: a device takes one at a time (runs
    /// would disturb each other); the simulator one per thread.
    fn parallel_runs(&self) -> usize {
        1
    }

    /// The alone baseline of tenant `index`.
    fn alone_scenario(&self, scenario: &Scenario, index: usize) -> Scenario {
        scenario.alone(index)
    }

    /// Relative effort of a run, for the progress fraction.
    fn planned_effort(&self, scenario: &Scenario) -> f64 {
        scenario.duration.as_secs_f64()
    }

    /// Plays `scenario` with `control` driving the throttles, or with no
    /// controller at all when `None` (the alone baselines).
    fn run(
        &self,
        scenario: &Scenario,
        control: Option<Control>,
        label: &str,
        progress: &(dyn Fn(f64) + Sync),
    ) -> Result<RawRun, Self::Error>;

    /// Between consecutive runs (a real device lets its queue drain).
    fn settle(&self) -> Result<(), Self::Error> {
        Ok(())
    }

    fn environment(&self, scenario: &Scenario) -> RunEnvironment;
}

/// A harness failure is the platform's own error.
pub type HarnessError<T> = <T as Platform>::Error;

/// `none` first (the reference for work conservation), then `policies` in
/// order, each once.
pub fn policies_with_reference(policies: &[PolicyKind]) -> Vec<PolicyKind> {
    let mut out = vec![PolicyKind::None];
    for p in policies {
        if !out.contains(p) {
            out.push(*p);
        }
    }
    out
}

/// The runs of a scenario: `none` first, then each policy; in a cluster
/// scenario each policy that throttles also with every host alone, so the
/// cluster mode's gain is measured beside it.
pub fn controls(scenario: &Scenario, policies: &[PolicyKind]) -> Vec<Control> {
    let kinds = policies_with_reference(policies);
    let mut out: Vec<Control> = kinds.iter().map(|k| Control::Policy(*k)).collect();
    if scenario.cluster.is_some() {
        out.extend(
            kinds
                .iter()
                .filter(|k| **k != PolicyKind::None)
                .map(|k| Control::HostsAlone(*k)),
        );
    }
    out
}

/// A task's outcome, empty until it has run.
type Slot<E> = Mutex<Option<Result<RawRun, E>>>;

enum Task {
    Alone(usize, Box<Scenario>),
    Policy(Control),
}

/// Runs every tenant alone and every requested policy plus `none`, and
/// returns one record per policy (`none` first) with demand and the alone
/// baselines filled in. `progress` gets the fraction done and what runs.
pub fn run_policies<T: Platform>(
    platform: &T,
    scenario: &Scenario,
    policies: &[PolicyKind],
    progress: &(dyn Fn(f64, &str) + Sync),
) -> Result<Vec<RunRecord>, HarnessError<T>> {
    run_controls(platform, scenario, &controls(scenario, policies), progress)
}

/// [`run_policies`] for runs given one by one (`none` first, as
/// [`controls`] gives them), with the kernel's controllers among them.
pub fn run_controls<T: Platform>(
    platform: &T,
    scenario: &Scenario,
    kinds: &[Control],
    progress: &(dyn Fn(f64, &str) + Sync),
) -> Result<Vec<RunRecord>, HarnessError<T>> {
    let started = SystemTime::now();
    let n = scenario.tenants.len();
    let mut tasks: Vec<Task> = (0..n)
        .map(|i| Task::Alone(i, Box::new(platform.alone_scenario(scenario, i))))
        .collect();
    tasks.extend(kinds.iter().map(|k| Task::Policy(*k)));
    let (labels, efforts) = labels_and_efforts(platform, scenario, &tasks);
    let total_effort: f64 = efforts.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    let done = Mutex::new(vec![0.0f64; tasks.len()]);
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let outputs: Vec<Slot<T::Error>> = tasks.iter().map(|_| Mutex::new(None)).collect();
    let worker = || loop {
        if failed.load(Ordering::SeqCst) {
            break;
        }
        let k = next.fetch_add(1, Ordering::SeqCst);
        if k >= tasks.len() {
            break;
        }
        let report = |f: f64| {
            let mut d = done.lock().unwrap_or_else(|e| e.into_inner());
            d[k] = f.clamp(0.0, 1.0) * efforts[k];
            progress(d.iter().sum::<f64>() / total_effort, &labels[k]);
        };
        let out = match &tasks[k] {
            Task::Alone(_, sc) => platform.run(sc, None, &labels[k], &report),
            Task::Policy(control) => platform.run(scenario, Some(*control), &labels[k], &report),
        };
        let out = out.and_then(|run| platform.settle().map(|()| run));
        if out.is_err() {
            failed.store(true, Ordering::SeqCst);
        }
        *outputs[k].lock().unwrap_or_else(|e| e.into_inner()) = Some(out);
    };
    let threads = platform.parallel_runs().clamp(1, tasks.len().max(1));
    if threads == 1 {
        worker();
    } else {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(worker);
            }
        });
    }
    let mut runs = finished_runs(outputs)?;
    let policy_runs = runs.split_off(n);
    let alone: Vec<(RawRun, bool)> = runs
        .into_iter()
        .zip(&tasks)
        .map(|(run, task)| {
            let covers = matches!(task, Task::Alone(_, sc) if sc.duration >= scenario.duration);
            (run, covers)
        })
        .collect();
    let env = environment(platform, scenario, started);
    Ok(kinds
        .iter()
        .zip(policy_runs)
        .map(|(control, run)| assemble(platform, scenario, &control.label(), run, &alone, &env))
        .collect())
}

/// Each task's name for the progress line, and its share of the work.
fn labels_and_efforts<T: Platform>(
    platform: &T,
    scenario: &Scenario,
    tasks: &[Task],
) -> (Vec<String>, Vec<f64>) {
    tasks
        .iter()
        .map(|t| match t {
            Task::Alone(i, sc) => (
                format!("{} alone", scenario.tenants[*i].spec.name),
                platform.planned_effort(sc),
            ),
            Task::Policy(c) => (c.label(), platform.planned_effort(scenario)),
        })
        .unzip()
}

/// Every task's run in task order, or the first failure. Tasks never
/// started after a failure hold nothing.
fn finished_runs<E>(outputs: Vec<Slot<E>>) -> Result<Vec<RawRun>, E> {
    let mut runs = Vec::with_capacity(outputs.len());
    let mut first_error = None;
    for slot in outputs {
        match slot.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(Ok(run)) => runs.push(run),
            Some(Err(e)) => {
                first_error.get_or_insert(e);
            }
            None => {}
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(runs),
    }
}

fn environment<T: Platform>(platform: &T, scenario: &Scenario, started: SystemTime) -> Environment {
    let unix = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    };
    let machine = platform.environment(scenario);
    Environment {
        iofloor_version: env!("CARGO_PKG_VERSION").to_string(),
        testbed: platform.kind().to_string(),
        started_unix_s: unix(started),
        finished_unix_s: unix(SystemTime::now()),
        policy_model: *scenario.policy_model.params(),
        device_model: machine.device_model,
        policy_params: scenario.policy.clone(),
        time_scale: scenario.time_scale,
        kernel: machine.kernel,
        fio_version: machine.fio_version,
        qemu_version: machine.qemu_version,
    }
}

/// `windows` with each tenant's demand, where the platform did not know it,
/// taken from what it got alone in the same window (`alone_windows(i)`:
/// tenant `i`'s alone run, empty where it did not cover the scenario).
fn with_demand<'a>(
    mut windows: Vec<Window>,
    alone_windows: impl Fn(usize) -> &'a [Window],
) -> Vec<Window> {
    for (k, w) in windows.iter_mut().enumerate() {
        for (i, tw) in w.tenants.iter_mut().enumerate() {
            if tw.demand.is_none() {
                tw.demand = alone_windows(i).get(k).map(|aw| aw.tenants[0].got);
            }
        }
    }
    windows
}

/// One policy's record: its run plus, per tenant, the alone p99 and — where
/// the alone run covered the whole scenario — what it got alone in each
/// window, which is its demand wherever the platform did not know it.
fn assemble<T: Platform>(
    platform: &T,
    scenario: &Scenario,
    policy: &str,
    run: RawRun,
    alone: &[(RawRun, bool)],
    env: &Environment,
) -> RunRecord {
    let group_index = |g: Option<&iofloor_core::GroupSpec>| {
        g.and_then(|g| scenario.groups.iter().position(|s| s.name == g.name))
    };
    let alone_windows = |i: usize| -> &[Window] {
        match alone.get(i) {
            Some((a, true)) => &a.windows,
            _ => &[],
        }
    };
    let tenants = scenario
        .tenants
        .iter()
        .enumerate()
        .map(|(i, t)| TenantInfo {
            name: t.spec.name.clone(),
            class: t.spec.class,
            noisy: t.noisy,
            floor: t.spec.floor,
            unit: t
                .spec
                .floor
                .map(|f| f.unit())
                .unwrap_or(RateUnit::BytesPerSec),
            alone_p99_ms: alone
                .get(i)
                .and_then(|(a, _)| a.latency.first())
                .map(|l| l.p99_ms),
            alone_windows: alone_windows(i)
                .iter()
                .map(|w| w.tenants[0].clone())
                .collect(),
            group: group_index(t.spec.group.as_deref()),
        })
        .collect();
    let groups = scenario
        .groups
        .iter()
        .map(|g| GroupInfo {
            name: g.name.clone(),
            floor: g.floor,
            ceiling: g.ceiling,
            unit: g.floor.map(|f| f.unit()).unwrap_or(RateUnit::BytesPerSec),
            parent: group_index(g.parent.as_deref()),
        })
        .collect();
    let windows = with_demand(run.windows, alone_windows);
    RunRecord {
        schema_version: iofloor_report::record::SCHEMA_VERSION,
        environment: Some(env.clone()),
        scenario: scenario.name.clone(),
        policy: policy.to_string(),
        source: platform.source(),
        window_s: 1.0,
        warmup_s: scenario.warmup.as_secs_f64(),
        duration_s: scenario.duration.as_secs_f64(),
        control_interval_s: scenario.interval.as_secs_f64(),
        tenants,
        groups,
        windows,
        steps: scenario.steps().iter().map(|d| d.as_secs_f64()).collect(),
        latency: run.latency,
        decision_time_us_max: run.decisions.max_us(),
        decision_time_us_mean: run.decisions.mean_us(),
        ios_completed: run.ios_completed,
        capacity_trace: run.capacity_trace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_runs_are_named_alone_or_under_a_policy_and_nothing_else_parses() {
        for name in [
            "iocost",
            "iocost-qos",
            "bfq",
            "floor+bfq",
            "static+iocost-qos",
        ] {
            let run = KernelRun::parse(name).unwrap();
            assert_eq!(run.label(), name);
            assert_eq!(Control::Kernel(run).label(), name);
        }
        let floor_bfq = KernelRun::parse("floor+bfq").unwrap();
        assert_eq!(Control::Kernel(floor_bfq).kind(), PolicyKind::Floor);
        assert_eq!(KernelRun::parse("bfq").unwrap().policy, PolicyKind::None);
        for name in [
            "floor",
            "",
            "+bfq",
            "floor+",
            "fastest+bfq",
            "floor+cfq",
            "bfq+floor",
        ] {
            assert_eq!(KernelRun::parse(name), None, "{name}");
        }
    }
}
