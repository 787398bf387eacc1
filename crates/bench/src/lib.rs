//! iofloor-bench: the fio scenario runner. It plays a scenario file (the same
//! format the simulator reads) on a real block device: one cgroup per tenant,
//! fio processes started and stopped on the scenario's schedule inside them,
//! the chosen policy driven live through the cgroup backend at the control
//! interval, and per-second per-tenant series recorded from the cgroup
//! counters, /proc/diskstats and fio's per-I/O latency logs. [`FioPlatform`]
//! is the scenario harness's [`Platform`] for real devices, so baselines,
//! records and measures are the simulator's, and a report can be rebuilt from
//! a results directory. Everything it creates — cgroups, fio processes,
//! throttles — is removed at the end, on error and on Ctrl-C.

mod agents;
mod arrival;
mod capacity;
pub mod cluster;
pub mod lag;
mod play;
mod session;
mod truth;

use iofloor_core::policy::PolicyKind;
use iofloor_core::CostModel;
use iofloor_host::cgroup::{self, DevId};
use iofloor_host::fio;
use iofloor_report::record::RunRecord;
use iofloor_scenario::{Control, KernelRun, Platform, RawRun, RunEnvironment, Scenario};
use iofloor_testbed::rig::Rig;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Bad input or an unusable machine: exit code 2.
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Host(#[from] iofloor_host::HostError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Failed(String),
    #[error("interrupted")]
    Interrupted,
}

pub type Result<T> = std::result::Result<T, BenchError>;

/// How to run a scenario on a device.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub device: PathBuf,
    pub policies: Vec<PolicyKind>,
    /// The kernel's own controllers to run beside the policies (cgroup v2).
    pub kernel: Vec<KernelRun>,
    pub cgroup_root: PathBuf,
    /// fio outputs and latency logs go here.
    pub work_dir: PathBuf,
    /// The cost model policies use; default: the scenario's device model.
    pub model: Option<CostModel>,
    /// Length of each protected tenant's alone run (its p99 baseline).
    pub alone: Duration,
    /// Idle time between runs, so one run's queue does not leak into the next.
    pub settle: Duration,
    /// Run VM tenants through QEMU's block layer (a qemu-storage-daemon per
    /// VM over the shared device, throttled over QMP) instead of as cgroups.
    pub vm_paths: bool,
    /// Where `iofloor rig` records its rigs: a scenario's `[[device.change]]`
    /// and other-host `[[unmanaged]]` load need the rig behind `device`.
    pub rig_state_dir: PathBuf,
}

/// The rig whose device is `device`, if `iofloor rig up` made it.
pub fn rig_of(device: &std::path::Path, state_dir: &std::path::Path) -> Option<Rig> {
    Rig::list(state_dir)
        .ok()?
        .into_iter()
        .find(|r| r.device.as_deref() == Some(device))
}

/// What of the scenario needs a rig: its device changes (applied to the
/// rig's throttle group over QMP) and load from another host (a second loop
/// device over the rig's export, invisible in this device's counters).
fn needs_rig(scenario: &Scenario) -> bool {
    scenario.unmanaged.iter().any(|u| {
        u.origin == iofloor_scenario::format::UnmanagedOrigin::OtherHost && u.device.is_none()
    })
}

/// Checks what a run needs and says clearly what is missing.
pub fn preflight(scenario: &Scenario, opts: &BenchOptions) -> Result<DevId> {
    // Before root and devices, so a cluster scenario is told what to run
    // wherever it is tried.
    if let Some(cluster) = &scenario.cluster {
        return Err(BenchError::Invalid(
            cluster
                .declared
                .error(
                    "a cluster scenario: `iofloor sim` plays it, and fio plays it on the \
                     cluster test bed (`iofloor cluster up --hosts N`, then `iofloor bench \
                     --cluster SCENARIO` without --device)",
                )
                .to_string(),
        ));
    }
    require_root()?;
    let dev =
        DevId::of_block_device(&opts.device).map_err(|e| BenchError::Invalid(e.to_string()))?;
    let version =
        cgroup::detect(&opts.cgroup_root).map_err(|e| BenchError::Invalid(e.to_string()))?;
    if let (Some(run), cgroup::Version::V1) = (opts.kernel.first(), version) {
        return Err(BenchError::Invalid(format!(
            "{}: the kernel's controllers are set up through cgroup v2 (io.cost, io.weight, io.bfq.weight); {} is a v1 hierarchy",
            run.label(),
            opts.cgroup_root.display()
        )));
    }
    for placed in scenario.unmanaged.iter().filter_map(|u| u.device.as_ref()) {
        DevId::of_block_device(&placed.value)
            .map_err(|e| BenchError::Invalid(placed.error(e.to_string()).to_string()))?;
    }
    let not_a_rig = |what: &str, or: &str| {
        BenchError::Invalid(format!(
            "{}: {what} needs a device made by `iofloor rig up` (its capacity is changed live over QMP){or}; {} is not one of the rigs in {}",
            scenario.name,
            opts.device.display(),
            opts.rig_state_dir.display()
        ))
    };
    if needs_rig(scenario) && rig_of(&opts.device, &opts.rig_state_dir).is_none() {
        return Err(not_a_rig(
            "`unmanaged` load with `origin = \"other-host\"` and no `device`",
            "",
        ));
    }
    if !scenario.device.changes.is_empty()
        && capacity::CapacityKnob::find(&opts.device, &opts.rig_state_dir)?.is_none()
    {
        return Err(not_a_rig(
            "`device.change`",
            " or the cgroup v2 test guest's disk (`iofloor guest up`)",
        ));
    }
    check_fio_and_floors(scenario, opts)?;
    Ok(dev)
}

fn require_root() -> Result<()> {
    if rustix::process::geteuid().is_root() {
        Ok(())
    } else {
        Err(BenchError::Invalid(
            "iofloor bench needs root (it creates cgroups and sets throttles)".into(),
        ))
    }
}

/// fio is there, and the scenario's floors fit its policies' model.
fn check_fio_and_floors(scenario: &Scenario, opts: &BenchOptions) -> Result<()> {
    fio::check_version().map_err(|e| BenchError::Invalid(e.to_string()))?;
    let verdict = with_model(scenario, opts).admission();
    if verdict.admitted {
        Ok(())
    } else {
        Err(BenchError::Invalid(format!(
            "{}: admission control: {}",
            scenario.name,
            verdict.summary()
        )))
    }
}

fn with_model(scenario: &Scenario, opts: &BenchOptions) -> Scenario {
    match opts.model {
        Some(m) => scenario.with_policy_model(m),
        None => scenario.clone(),
    }
}

/// Total wall time a bench will take, for progress reporting.
pub fn planned_time(scenario: &Scenario, opts: &BenchOptions) -> Duration {
    let runs = bench_controls(scenario, opts).len() as u32;
    let alone = scenario.tenants.len() as u32;
    (scenario.duration + opts.settle) * runs
        + (opts.alone.min(scenario.duration) + opts.settle) * alone
}

/// A real block device as the harness's platform: one run at a time, fio in
/// cgroups (or behind QEMU for VM tenants), the policy live on the kernel's
/// throttles.
pub struct FioPlatform<'a> {
    pub opts: &'a BenchOptions,
    pub dev: DevId,
    /// Set by a signal handler: every run and pause stops at the next check.
    pub stop: &'a AtomicBool,
}

impl Platform for FioPlatform<'_> {
    type Error = BenchError;

    fn kind(&self) -> &'static str {
        "device"
    }

    fn source(&self) -> String {
        format!("device:{}", self.opts.device.display())
    }

    fn alone_scenario(&self, scenario: &Scenario, index: usize) -> Scenario {
        alone_run(scenario, index, self.opts)
    }

    fn planned_effort(&self, scenario: &Scenario) -> f64 {
        (scenario.duration + self.opts.settle).as_secs_f64()
    }

    fn run(
        &self,
        scenario: &Scenario,
        control: Option<Control>,
        label: &str,
        progress: &(dyn Fn(f64) + Sync),
    ) -> Result<RawRun> {
        let (driver, kernel) = match control {
            Some(Control::HostsAlone(_)) => {
                return Err(BenchError::Invalid(format!(
                    "{label}: one host's bench has no hosts to run alone"
                )))
            }
            Some(Control::Policy(kind)) => (play::Driver::Policy(kind), None),
            Some(Control::Kernel(KernelRun { peer, policy })) => match policy {
                PolicyKind::None => (play::Driver::Nothing, Some(peer)),
                policy => (play::Driver::Policy(policy), Some(peer)),
            },
            None => (play::Driver::Nothing, None),
        };
        let setup = play::Setup {
            opts: self.opts,
            placement: play::Placement::one_device(
                &self.opts.device,
                self.dev,
                scenario.tenants.len(),
            ),
            driver,
            kernel,
            stop: self.stop,
        };
        play::play(scenario, setup, &tag(label), progress)
    }

    fn settle(&self) -> Result<()> {
        settle(self.opts, self.stop)
    }

    fn environment(&self, _scenario: &Scenario) -> RunEnvironment {
        environment(self.opts.vm_paths)
    }
}

/// A tenant's alone run is as long as `--alone-secs` asks (its p99
/// baseline); only one that covers the scenario gives window demands.
fn alone_run(scenario: &Scenario, index: usize, opts: &BenchOptions) -> Scenario {
    let mut sc = scenario.alone(index);
    sc.duration = opts.alone.min(scenario.duration);
    sc.warmup = Duration::from_secs(1).min(sc.duration / 4);
    sc
}

/// A run's directory name from its label.
fn tag(label: &str) -> String {
    label.replace(' ', "-")
}

/// The pause between runs, cut short by a stop.
fn settle(opts: &BenchOptions, stop: &AtomicBool) -> Result<()> {
    let until = Instant::now() + opts.settle;
    while Instant::now() < until {
        if stop.load(Ordering::SeqCst) {
            return Err(BenchError::Interrupted);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The machine's kernel, fio and (with QEMU paths) QEMU versions.
fn environment(with_qemu: bool) -> RunEnvironment {
    let first_line = |cmd: &str, arg: &str| {
        Command::new(cmd)
            .arg(arg)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .map(str::to_string)
            })
    };
    RunEnvironment {
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .map(|s| s.trim().to_string()),
        fio_version: first_line("fio", "--version"),
        qemu_version: with_qemu
            .then(|| first_line("qemu-storage-daemon", "--version"))
            .flatten(),
        device_model: None,
    }
}

/// [`run`] on the cluster test bed: the alone baselines, `none`, and each
/// policy as a cluster and with every host alone.
pub fn run_cluster(
    scenario: &Scenario,
    platform: &cluster::ClusterPlatform<'_>,
    progress: &(dyn Fn(f64, &str) + Sync),
) -> Result<Vec<RunRecord>> {
    std::fs::create_dir_all(&platform.opts.work_dir).map_err(|source| BenchError::Io {
        path: platform.opts.work_dir.clone(),
        source,
    })?;
    let scenario = with_model(scenario, platform.opts);
    iofloor_scenario::run_policies(platform, &scenario, &platform.opts.policies, progress)
}

/// Runs the alone baselines and every policy (plus `none`) through the
/// scenario harness; returns one record per policy. `dev` is what
/// [`preflight`] returned for `opts.device`.
pub fn run(
    scenario: &Scenario,
    opts: &BenchOptions,
    dev: DevId,
    stop: &AtomicBool,
    progress: &(dyn Fn(f64, &str) + Sync),
) -> Result<Vec<RunRecord>> {
    std::fs::create_dir_all(&opts.work_dir).map_err(|source| BenchError::Io {
        path: opts.work_dir.clone(),
        source,
    })?;
    let scenario = with_model(scenario, opts);
    let platform = FioPlatform { opts, dev, stop };
    let controls = bench_controls(&scenario, opts);
    iofloor_scenario::run_controls(&platform, &scenario, &controls, progress)
}

/// The runs of a bench: `none` and the policies, then the kernel's controllers.
fn bench_controls(scenario: &Scenario, opts: &BenchOptions) -> Vec<Control> {
    let mut controls = iofloor_scenario::controls(scenario, &opts.policies);
    controls.extend(opts.kernel.iter().map(|k| Control::Kernel(*k)));
    controls
}
