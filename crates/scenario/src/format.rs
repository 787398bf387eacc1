//! Scenario files (TOML): the device, the tenants, their fio-like jobs and how
//! the load changes over time. One format for the simulator and the real-device
//! runner; documented in docs/scenarios.md.
//!
//! Quantities are written as operators write them (`64k`, `8MiB/s`, `500iops`,
//! `60s`) and checked while parsing, so a mistake is reported with its file,
//! line and field.

use iofloor_core::cost::{CostModel, CostParams};
use iofloor_core::units::Rate;
use iofloor_core::{PolicyParams, TenantClass, TenantSpec, ValidationError};
use serde::Deserialize;
use std::path::Path;
use std::time::Duration;

/// A scenario that could not be read or makes no sense.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// The message from the TOML parser carries line, column and the field.
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    /// A value that parses but makes no sense; `line` is where its key is
    /// written (or the nearest table that holds it, for a missing one).
    #[error("{path}{}: {source}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Invalid {
        path: String,
        line: Option<usize>,
        source: ValidationError,
    },
}

/// The longest scenario: four hours, well inside what the simulator's event
/// clock represents and longer than any experiment worth repeating.
pub const MAX_DURATION: Duration = Duration::from_secs(4 * 3600);

// Quantities that parse themselves, so errors carry the TOML position.
pub use iofloor_core::units::quantity::{BandwidthQ, DurationQ, RateQ, SizeQ};

// ---- the file ----

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub duration: DurationQ,
    pub warmup: Option<DurationQ>,
    /// Control interval (default 1 s, at least 100 ms).
    pub interval: Option<DurationQ>,
    /// How often the device is looked at between intervals, for an
    /// overload to decide on at once (default and `0s`: never). Not with
    /// `[cluster]`, whose hosts decide together.
    pub watch_interval: Option<DurationQ>,
    /// Seed of the simulator's random numbers.
    #[serde(default = "default_seed")]
    pub seed: u64,
    pub device: DeviceFile,
    #[serde(default)]
    pub policy: PolicyParams,
    #[serde(rename = "tenant", default)]
    pub tenants: Vec<TenantFile>,
    /// Groups of tenants with a floor, ceiling and weight of their own.
    #[serde(rename = "group", default)]
    pub groups: Vec<GroupFile>,
    /// Load on the same device that no policy sees per tenant or can throttle.
    #[serde(rename = "unmanaged", default)]
    pub unmanaged: Vec<UnmanagedFile>,
    /// How a cluster scenario's hosts exchange (tenants name their `host`).
    pub cluster: Option<ClusterFile>,
}

/// `[cluster]`: the publish → allocate → apply loop of a cluster scenario
/// and what happens to its hosts. The defaults are the daemon's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// From the agents' reports to the allocator's round; its allocation is
    /// applied at each agent's next interval. Default: half the interval.
    pub delay: Option<DurationQ>,
    /// A host's etcd lease: how long its report outlives it, and how long an
    /// allocator that died is waited for before another takes over.
    pub lease_ttl: Option<DurationQ>,
    /// An allocation older than this is not applied (the host falls back).
    pub stale_after: Option<DurationQ>,
    #[serde(rename = "event", default)]
    pub events: Vec<ClusterEventFile>,
}

/// Something that happens to one host at a time.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterEventFile {
    pub at: DurationQ,
    pub host: String,
    pub kind: ClusterEventKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterEventKind {
    /// The host's agent is killed (SIGKILL): its caps stay as last written,
    /// its lease expires, and if it was the allocator another host takes over.
    Kill,
    /// The host loses etcd and the other hosts (not its storage): nothing it
    /// publishes arrives, no allocation reaches it.
    Partition,
    /// A partitioned host is reachable again.
    Heal,
}

impl ClusterEventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterEventKind::Kill => "kill",
            ClusterEventKind::Partition => "partition",
            ClusterEventKind::Heal => "heal",
        }
    }
}

fn default_seed() -> u64 {
    1
}

/// The device: a linear cost model (as Linux io.cost) for its true capacity,
/// its internal parallelism and the spread of its service times.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceFile {
    pub parallelism: u32,
    pub rbps: BandwidthQ,
    pub rseqiops: f64,
    pub rrandiops: f64,
    pub wbps: BandwidthQ,
    pub wseqiops: f64,
    pub wrandiops: f64,
    /// Mean of the exponential tail added to each service time, as a share of
    /// it (service = base × (1 − jitter + Exp(jitter))): mean preserved.
    #[serde(default = "default_jitter")]
    pub jitter: f64,
    pub write_cliff: Option<WriteCliffFile>,
    /// A rate-limited volume: the cost model's capacity is a token bucket's
    /// rate in front of a fast device (cloud volumes, array ports, QEMU
    /// throttle groups such as the rig).
    pub rate_limit: Option<RateLimitFile>,
    /// Garbage collection: past a number of I/Os in service, each one is
    /// slower, so served work falls as the queue grows.
    pub gc: Option<GcFile>,
    /// The cost model the policies are given, if not the device's true one
    /// (to study a mis-calibrated model).
    pub model: Option<PolicyModelFile>,
    /// Changes of the device's capacity over time, nobody told (a neighbour
    /// host, garbage collection, a throttle lowered by the storage admin).
    #[serde(rename = "change", default)]
    pub changes: Vec<DeviceChangeFile>,
}

/// From `at` on, the device does `factor` times what it is declared to do.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceChangeFile {
    pub at: DurationQ,
    pub factor: f64,
}

/// Where unmanaged I/O comes from, which decides what the host can see of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnmanagedOrigin {
    /// Another host on the same storage: invisible here, even in the
    /// device's counters; only its effect on latency and throughput shows.
    #[default]
    OtherHost,
    /// This host, outside any controlled cgroup or VM: the device's counters
    /// (`/proc/diskstats`) include it.
    ThisHost,
}

/// Load on the device that iofloor neither sees per tenant nor throttles.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnmanagedFile {
    pub name: String,
    #[serde(default)]
    pub origin: UnmanagedOrigin,
    /// The block device the load runs on (`iofloor bench`): another host's
    /// path to the same storage. Without it, `other-host` load gets a loop
    /// device the bench makes over the rig's export and `this-host` load
    /// runs on the bench's device. The simulator has one device and ignores it.
    #[serde(default)]
    pub device: Option<std::path::PathBuf>,
    #[serde(rename = "job", default)]
    pub jobs: Vec<JobFile>,
}

fn default_jitter() -> f64 {
    0.1
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyModelFile {
    pub rbps: BandwidthQ,
    pub rseqiops: f64,
    pub rrandiops: f64,
    pub wbps: BandwidthQ,
    pub wseqiops: f64,
    pub wrandiops: f64,
}

/// After `after` bytes written, writes take `factor` times as long (an SSD
/// whose spare blocks ran out).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteCliffFile {
    pub after: SizeQ,
    pub factor: f64,
}

/// A token bucket in front of a fast device.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitFile {
    /// What an I/O the bucket lets through at once takes at the device.
    pub idle_latency: DurationQ,
    /// The bucket's depth, as time at its rate: how far ahead of its rate
    /// a burst may go (default none: I/Os leave it evenly spaced).
    #[serde(default)]
    pub burst: Option<DurationQ>,
}

/// Served work that falls past a queue depth.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcFile {
    /// I/Os in service at which the device serves the model's capacity;
    /// past it each is slower.
    pub depth: u32,
    /// What each I/O in service past `depth` adds to every I/O's time, as
    /// a share of it times `depth`: above 1, served work falls.
    pub slowdown: f64,
}

/// A group of tenants (a customer, a VM's disks): its members share its
/// floor, take what a sibling leaves before anyone else, and together never
/// exceed its ceiling. Members name it (`group = "..."`); a group may be in
/// another.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupFile {
    pub name: String,
    pub floor: Option<RateQ>,
    pub ceiling: Option<RateQ>,
    pub weight: Option<f64>,
    /// The group this one is in.
    pub group: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantFile {
    pub name: String,
    #[serde(default)]
    pub class: TenantClass,
    pub floor: Option<RateQ>,
    pub ceiling: Option<RateQ>,
    pub weight: Option<f64>,
    /// Marks the tenant that causes the contention; the others are protected.
    #[serde(default)]
    pub noisy: bool,
    /// Needs its fast path, not only its floor: under contention a
    /// latency-sensitive container takes what VMs hold above their floors.
    #[serde(default)]
    pub latency_sensitive: bool,
    /// The hypervisor's I/O path of a VM tenant.
    pub vm_path: Option<VmPathFile>,
    /// The host the tenant runs on, in a cluster scenario (every tenant names
    /// one, or none does).
    pub host: Option<String>,
    /// The `[[group]]` the tenant is in.
    pub group: Option<String>,
    #[serde(rename = "job", default)]
    pub jobs: Vec<JobFile>,
}

/// A VM's I/O passes a stage of `threads` servers taking `overhead` each:
/// added latency, and a ceiling of threads/overhead IOPS (seed 000: +16 µs,
/// about half of an NVMe SSD).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmPathFile {
    pub overhead: DurationQ,
    #[serde(default = "default_threads")]
    pub threads: u32,
}

fn default_threads() -> u32 {
    4
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    Read,
    Write,
    Randread,
    Randwrite,
    Rw,
    Randrw,
}

impl Rw {
    pub fn sequential(self) -> bool {
        matches!(self, Rw::Read | Rw::Write | Rw::Rw)
    }

    /// Share of reads.
    pub fn read_share(self, rwmixread: Option<u8>) -> f64 {
        match self {
            Rw::Read | Rw::Randread => 1.0,
            Rw::Write | Rw::Randwrite => 0.0,
            Rw::Rw | Rw::Randrw => rwmixread.unwrap_or(50) as f64 / 100.0,
        }
    }

    pub fn as_fio(self) -> &'static str {
        match self {
            Rw::Read => "read",
            Rw::Write => "write",
            Rw::Randread => "randread",
            Rw::Randwrite => "randwrite",
            Rw::Rw => "rw",
            Rw::Randrw => "randrw",
        }
    }
}

/// A fio-like job: `numjobs` processes each keeping `iodepth` I/Os in flight,
/// each limited to `rate` if given (closed loop otherwise).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    pub rw: Rw,
    pub rwmixread: Option<u8>,
    pub bs: SizeQ,
    #[serde(default = "one")]
    pub iodepth: u32,
    #[serde(default = "one")]
    pub numjobs: u32,
    /// Per-process rate, as fio's `rate` (bytes/s) or `rate_iops` (IOPS).
    pub rate: Option<RateQ>,
    /// How a rate's I/Os are spaced, as fio's `rate_process`: evenly
    /// (`linear`, the default) or at random (`poisson`, exponentially
    /// distributed gaps: the arrivals of many independent users).
    #[serde(default)]
    pub rate_process: RateProcess,
    pub start: Option<DurationQ>,
    pub stop: Option<DurationQ>,
    /// Add `add` processes every `every`, up to `max` (the seed's noisy VM).
    pub ramp: Option<RampFile>,
    /// Explicit changes at given times.
    #[serde(rename = "phase", default)]
    pub phases: Vec<PhaseFile>,
}

fn one() -> u32 {
    1
}

/// fio's `rate_process`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RateProcess {
    #[default]
    Linear,
    Poisson,
}

impl RateProcess {
    /// fio's name for it.
    pub fn as_fio(self) -> &'static str {
        match self {
            RateProcess::Linear => "linear",
            RateProcess::Poisson => "poisson",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RampFile {
    pub every: DurationQ,
    #[serde(default = "one")]
    pub add: u32,
    pub max: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseFile {
    pub at: DurationQ,
    pub numjobs: Option<u32>,
    pub iodepth: Option<u32>,
}

// ---- the validated scenario ----

/// A job's shape at a point in time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobState {
    pub numjobs: u32,
    pub iodepth: u32,
}

#[derive(Debug, Clone)]
pub struct Job {
    pub rw: Rw,
    pub read_share: f64,
    pub bs: u64,
    pub rate: Option<Rate>,
    pub rate_process: RateProcess,
    /// (time, state) in time order; the first entry is at the job's start and a
    /// state with `numjobs == 0` means stopped.
    pub schedule: Vec<(Duration, JobState)>,
}

/// The entry of a time-ordered schedule in force at `t`, if any yet.
fn in_force_at<T: Copy>(schedule: &[(Duration, T)], t: Duration) -> Option<T> {
    schedule
        .iter()
        .take_while(|(at, _)| *at <= t)
        .last()
        .map(|(_, v)| *v)
}

impl Job {
    pub fn state_at(&self, t: Duration) -> JobState {
        in_force_at(&self.schedule, t).unwrap_or(JobState {
            numjobs: 0,
            iodepth: 1,
        })
    }
}

#[derive(Debug, Clone, Copy)]
pub struct VmPath {
    pub overhead: Duration,
    pub threads: u32,
}

#[derive(Debug, Clone)]
pub struct Tenant {
    pub spec: TenantSpec,
    pub noisy: bool,
    pub vm_path: Option<VmPath>,
    /// Index of its host in [`Cluster::hosts`], in a cluster scenario.
    pub host: Option<usize>,
    pub jobs: Vec<Job>,
}

/// A cluster scenario's hosts and their exchange (see [`ClusterFile`]).
#[derive(Debug, Clone)]
pub struct Cluster {
    /// In the order tenants first name them; the first is the first allocator.
    pub hosts: Vec<String>,
    pub delay: Duration,
    pub lease_ttl: Duration,
    pub stale_after: Duration,
    /// (time, host index, what) in time order.
    pub events: Vec<(Duration, usize, ClusterEventKind)>,
    /// Where the first tenant names its host, for a platform that cannot
    /// play a cluster to say so.
    pub declared: Placed<String>,
}

#[derive(Debug, Clone)]
pub struct Device {
    pub parallelism: u32,
    pub cost: CostModel,
    pub jitter: f64,
    pub write_cliff: Option<(u64, f64)>,
    pub shape: DeviceShape,
    /// (time, capacity factor) in time order; factor 1 before the first.
    pub changes: Vec<(Duration, f64)>,
}

/// How the device serves what it is given, beside its cost model.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum DeviceShape {
    /// `parallelism` I/Os in service at once, each taking `parallelism ×
    /// cost`: latency flat up to that many in flight, then queueing (a
    /// knee; with a parallelism of 1, one FIFO queue).
    #[default]
    Parallel,
    /// A token bucket at the cost model's rate, `burst` (ns at that rate)
    /// deep, in front of a device that takes `idle_latency` (ns) an I/O:
    /// fast until the limit bites, queueing when it does.
    RateLimited { idle_latency: f64, burst: f64 },
    /// `depth` queues at the model's capacity, up to `parallelism` I/Os in
    /// service, each taking `1 + slowdown × (in service − depth) / depth`
    /// times as long past `depth`.
    Gc { depth: u32, slowdown: f64 },
}

impl Device {
    /// The capacity factor in force at `t`.
    pub fn factor_at(&self, t: Duration) -> f64 {
        in_force_at(&self.changes, t).unwrap_or(1.0)
    }
}

/// A source of unmanaged load (see [`UnmanagedFile`]).
#[derive(Debug, Clone)]
pub struct Unmanaged {
    pub name: String,
    pub origin: UnmanagedOrigin,
    /// Where it runs on a real host (see [`UnmanagedFile::device`]), with
    /// the place it is written, for errors found when it is opened.
    pub device: Option<Placed<std::path::PathBuf>>,
    pub jobs: Vec<Job>,
}

/// A value with the file, line and key it was written under, so a check
/// that can only run later (a device opened by the bench) names them.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed<T> {
    pub value: T,
    pub path: String,
    pub line: Option<usize>,
    pub key: String,
}

impl<T> Placed<T> {
    /// The error for this value, as a scenario error names any other.
    pub fn error(&self, message: impl Into<String>) -> ScenarioError {
        ScenarioError::Invalid {
            path: self.path.clone(),
            line: self.line,
            source: ValidationError::new(self.key.clone(), message),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub duration: Duration,
    pub warmup: Duration,
    pub interval: Duration,
    /// Looks at the device between intervals (None: none).
    pub watch_interval: Option<Duration>,
    pub seed: u64,
    pub device: Device,
    /// The model policies are given (the device's own unless `[device.model]`).
    pub policy_model: CostModel,
    pub policy: PolicyParams,
    pub tenants: Vec<Tenant>,
    /// The `[[group]]`s, in file order (tenants hold theirs in their spec).
    pub groups: Vec<std::sync::Arc<iofloor_core::GroupSpec>>,
    pub unmanaged: Vec<Unmanaged>,
    /// Hosts sharing the device, when tenants name them.
    pub cluster: Option<Cluster>,
    /// Factor every time was scaled by ([`Scenario::time_scaled`]); 1 as written.
    pub time_scale: f64,
}

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            path: shown.clone(),
            source,
        })?;
        Scenario::parse(&text, &shown)
    }

    /// Parses scenario text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
        let file: ScenarioFile = toml::from_str(text).map_err(|e| ScenarioError::Parse {
            path: origin.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        let mut scenario = file.validate().map_err(|source| ScenarioError::Invalid {
            path: origin.to_string(),
            line: crate::locate::line_of(text, &source.key),
            source,
        })?;
        for (ui, u) in scenario.unmanaged.iter_mut().enumerate() {
            if let Some(placed) = u.device.as_mut() {
                placed.key = format!("unmanaged[{ui}].device");
                placed.path = origin.to_string();
                placed.line = crate::locate::line_of(text, &placed.key);
            }
        }
        if let Some(placed) = scenario.cluster.as_mut().map(|c| &mut c.declared) {
            placed.path = origin.to_string();
            placed.line = crate::locate::line_of(text, &placed.key);
        }
        Ok(scenario)
    }

    /// Times at which any tenant's load changes (after t = 0).
    pub fn steps(&self) -> Vec<Duration> {
        let mut steps: Vec<Duration> = self
            .tenants
            .iter()
            .flat_map(|t| t.jobs.iter())
            .chain(self.unmanaged.iter().flat_map(|u| u.jobs.iter()))
            .flat_map(|j| j.schedule.iter().map(|(at, _)| *at))
            .chain(self.device.changes.iter().map(|(at, _)| *at))
            .filter(|at| !at.is_zero() && *at < self.duration)
            .collect();
        steps.sort();
        steps.dedup();
        steps
    }

    /// The same scenario with every time scaled by `factor` (e.g. 0.25 to run
    /// the seed's 10-minute experiment in 2.5 minutes).
    pub fn time_scaled(&self, factor: f64) -> Scenario {
        // Saturates: a scenario of years scaled up is still a (long) run, not a panic.
        let s = |d: Duration| {
            Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(Duration::MAX)
        };
        let mut out = self.clone();
        out.time_scale = self.time_scale * factor;
        out.duration = s(self.duration);
        out.warmup = s(self.warmup);
        let jobs = out
            .tenants
            .iter_mut()
            .flat_map(|t| t.jobs.iter_mut())
            .chain(out.unmanaged.iter_mut().flat_map(|u| u.jobs.iter_mut()));
        for j in jobs {
            for (at, _) in &mut j.schedule {
                *at = s(*at);
            }
        }
        for (at, _) in &mut out.device.changes {
            *at = s(*at);
        }
        if let Some(c) = out.cluster.as_mut() {
            for (at, _, _) in &mut c.events {
                *at = s(*at);
            }
        }
        out
    }

    /// The scenario with only tenant `index` (for its "alone" baseline).
    pub fn alone(&self, index: usize) -> Scenario {
        let mut out = self.clone();
        out.tenants = vec![self.tenants[index].clone()];
        out.tenants[0].host = None;
        out.unmanaged.clear();
        out.device.changes.clear();
        out.cluster = None;
        out
    }

    /// The same scenario with the policies given `model` (a calibrated one)
    /// instead of the scenario's.
    pub fn with_policy_model(&self, model: CostModel) -> Scenario {
        Scenario {
            policy_model: model,
            ..self.clone()
        }
    }

    /// Admission control on the policies' model: can every floor be kept?
    pub fn admission(&self) -> iofloor_core::admission::AdmissionVerdict {
        let mixes: Vec<_> = self
            .tenants
            .iter()
            .map(|t| (&t.spec, self.expected_mix(t)))
            .collect();
        iofloor_core::admission::check(
            &self.policy_model,
            self.policy.floor.target_utilisation,
            &mixes,
        )
    }

    /// The expected mix of each tenant, from its jobs (for admission control).
    pub fn expected_mix(&self, tenant: &Tenant) -> Option<iofloor_core::Usage> {
        use iofloor_core::{DirUsage, Usage};
        let mut u = Usage::default();
        for j in &tenant.jobs {
            let ios = 1.0;
            let seq = if j.rw.sequential() { 1.0 } else { 0.0 };
            let add = |d: &mut DirUsage, share: f64| {
                d.ios += ios * share;
                d.bytes += ios * share * j.bs as f64;
                d.seq_ios += ios * share * seq;
            };
            add(&mut u.read, j.read_share);
            add(&mut u.write, 1.0 - j.read_share);
        }
        (!u.is_idle()).then_some(u)
    }
}

type Checked<T> = Result<T, ValidationError>;

fn bad<T>(key: &str, message: impl Into<String>) -> Checked<T> {
    Err(ValidationError::new(key, message))
}

fn positive(key: &str, v: f64) -> Checked<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        bad(key, format!("must be a positive number, got {v}"))
    }
}

/// The times of a scenario: duration, warm-up and control interval.
fn checked_times(file: &ScenarioFile) -> Checked<(Duration, Duration, Duration)> {
    let duration = file.duration.0;
    if duration < Duration::from_secs(1) || duration > MAX_DURATION {
        return bad(
            "duration",
            format!("must be between 1s and 4h, got {duration:?}"),
        );
    }
    let warmup = file
        .warmup
        .map(|w| w.0)
        .unwrap_or(Duration::from_secs(10).min(duration / 10));
    if warmup >= duration {
        return bad("warmup", "must be shorter than `duration`");
    }
    let interval = file.interval.map(|i| i.0).unwrap_or(Duration::from_secs(1));
    if interval < Duration::from_millis(100) || interval > Duration::from_secs(60) {
        return bad(
            "interval",
            format!("must be between 100ms and 60s, got {interval:?}"),
        );
    }
    Ok((duration, warmup, interval))
}

/// A cost model written out in the file (the device's, or the one the policies get).
fn checked_cost_model(
    rbps: f64,
    rseqiops: f64,
    rrandiops: f64,
    wbps: f64,
    wseqiops: f64,
    wrandiops: f64,
) -> Checked<CostModel> {
    for (key, v) in [
        ("rseqiops", rseqiops),
        ("rrandiops", rrandiops),
        ("wseqiops", wseqiops),
        ("wrandiops", wrandiops),
    ] {
        positive(key, v)?;
    }
    CostModel::new(CostParams {
        rbps,
        rseqiops,
        rrandiops,
        wbps,
        wseqiops,
        wrandiops,
    })
    .map_err(|e| {
        ValidationError::new(
            e.field,
            format!("must be a positive number, got {}", e.value),
        )
    })
}

/// Capacity changes: factors in (0, 100], times inside the run, in order.
fn checked_changes(
    changes: &[DeviceChangeFile],
    duration: Duration,
) -> Checked<Vec<(Duration, f64)>> {
    let mut out: Vec<(Duration, f64)> = Vec::with_capacity(changes.len());
    for (i, c) in changes.iter().enumerate() {
        let key = |k: &str| format!("change[{i}].{k}");
        if !(c.factor > 0.0 && c.factor <= 100.0) {
            return bad(
                &key("factor"),
                format!("must be in (0, 100], got {}", c.factor),
            );
        }
        if c.at.0 >= duration {
            return bad(
                &key("at"),
                format!("{:?} is not before the end of the run", c.at.0),
            );
        }
        if out.last().is_some_and(|(prev, _)| *prev >= c.at.0) {
            return bad(&key("at"), "changes must be listed in time order");
        }
        out.push((c.at.0, c.factor));
    }
    Ok(out)
}

/// The device's shape: parallel queues, or one of `rate_limit` and `gc`.
fn checked_shape(d: &DeviceFile) -> Checked<DeviceShape> {
    let ns = |q: &DurationQ| q.0.as_nanos() as f64;
    match (&d.rate_limit, &d.gc) {
        (Some(_), Some(_)) => bad(
            "gc",
            "a device is rate-limited or garbage-collecting, not both",
        ),
        (Some(r), None) => {
            if r.idle_latency.0.is_zero() || r.idle_latency.0 > Duration::from_secs(1) {
                return bad(
                    "rate_limit.idle_latency",
                    format!("must be above 0 and at most 1s, got {:?}", r.idle_latency.0),
                );
            }
            if r.burst.is_some_and(|b| b.0 > Duration::from_secs(10)) {
                return bad("rate_limit.burst", "must be at most 10s");
            }
            Ok(DeviceShape::RateLimited {
                idle_latency: ns(&r.idle_latency),
                burst: r.burst.as_ref().map_or(0.0, ns),
            })
        }
        (None, Some(g)) => {
            if g.depth == 0 || g.depth > d.parallelism {
                return bad(
                    "gc.depth",
                    format!(
                        "must be between 1 and `parallelism` ({}), got {}",
                        d.parallelism, g.depth
                    ),
                );
            }
            if !(g.slowdown > 0.0 && g.slowdown <= 100.0) {
                return bad(
                    "gc.slowdown",
                    format!("must be in (0, 100], got {}", g.slowdown),
                );
            }
            Ok(DeviceShape::Gc {
                depth: g.depth,
                slowdown: g.slowdown,
            })
        }
        (None, None) => Ok(DeviceShape::Parallel),
    }
}

/// The device and the model the policies are given.
fn checked_device(d: &DeviceFile, duration: Duration) -> Checked<(Device, CostModel)> {
    if d.parallelism == 0 || d.parallelism > 65536 {
        return bad(
            "parallelism",
            format!("must be between 1 and 65536, got {}", d.parallelism),
        );
    }
    if !(0.0..1.0).contains(&d.jitter) {
        return bad("jitter", format!("must be in [0, 1), got {}", d.jitter));
    }
    let cost = checked_cost_model(
        d.rbps.0,
        d.rseqiops,
        d.rrandiops,
        d.wbps.0,
        d.wseqiops,
        d.wrandiops,
    )?;
    let policy_model = match &d.model {
        Some(m) => checked_cost_model(
            m.rbps.0,
            m.rseqiops,
            m.rrandiops,
            m.wbps.0,
            m.wseqiops,
            m.wrandiops,
        )
        .map_err(|e| e.under("model"))?,
        None => cost,
    };
    let write_cliff = match &d.write_cliff {
        Some(c) if !(c.factor >= 1.0 && c.factor.is_finite()) => {
            return bad(
                "write_cliff.factor",
                format!("must be at least 1, got {}", c.factor),
            );
        }
        Some(c) => Some((c.after.0, c.factor)),
        None => None,
    };
    let device = Device {
        parallelism: d.parallelism,
        cost,
        jitter: d.jitter,
        write_cliff,
        shape: checked_shape(d)?,
        changes: checked_changes(&d.changes, duration)?,
    };
    Ok((device, policy_model))
}

impl TenantFile {
    fn validate(self, duration: Duration) -> Checked<Tenant> {
        if self.name.trim().is_empty() {
            return bad("name", "must not be empty");
        }
        iofloor_core::model::check_promise(
            self.floor.map(|f| f.0),
            self.ceiling.map(|c| c.0),
            self.weight,
        )?;
        if self.jobs.is_empty() {
            return bad(
                "job",
                format!("tenant `{}` needs at least one [[tenant.job]]", self.name),
            );
        }
        let vm_path = match (&self.vm_path, self.class) {
            (Some(p), _) if p.threads == 0 => return bad("vm_path.threads", "must be at least 1"),
            (Some(p), _) => Some(VmPath {
                overhead: p.overhead.0,
                threads: p.threads,
            }),
            // Seed 000: a VM's I/O path adds about 16 µs.
            (None, TenantClass::Vm) => Some(VmPath {
                overhead: Duration::from_micros(16),
                threads: 4,
            }),
            (None, TenantClass::Container) => None,
        };
        let jobs = self
            .jobs
            .into_iter()
            .enumerate()
            .map(|(ji, j)| {
                j.validate(duration)
                    .map_err(|e| e.under(&format!("job[{ji}]")))
            })
            .collect::<Checked<Vec<Job>>>()?;
        let spec = TenantSpec {
            name: self.name,
            class: self.class,
            floor: self.floor.map(|f| f.0),
            ceiling: self.ceiling.map(|c| c.0),
            weight: self.weight.unwrap_or(iofloor_core::model::DEFAULT_WEIGHT),
            latency_sensitive: self.latency_sensitive,
            group: None,
        };
        Ok(Tenant {
            spec,
            noisy: self.noisy,
            vm_path,
            host: None,
            jobs,
        })
    }
}

impl ScenarioFile {
    fn validate(self) -> Checked<Scenario> {
        if self.name.trim().is_empty() {
            return bad("name", "must not be empty");
        }
        let (duration, warmup, interval) = checked_times(&self)?;
        self.policy.validate()?;
        let (device, policy_model) =
            checked_device(&self.device, duration).map_err(|e| e.under("device"))?;
        if self.tenants.is_empty() {
            return bad("tenant", "a scenario needs at least one [[tenant]]");
        }
        let mut names = std::collections::HashSet::new();
        let mut tenants = Vec::new();
        let host_names: Vec<Option<String>> = self.tenants.iter().map(|t| t.host.clone()).collect();
        let group_names: Vec<Option<String>> =
            self.tenants.iter().map(|t| t.group.clone()).collect();
        for (ti, t) in self.tenants.into_iter().enumerate() {
            let at = format!("tenant[{ti}]");
            if !names.insert(t.name.clone()) {
                return Err(ValidationError::new(
                    "name",
                    format!("`{}` used by two tenants", t.name),
                )
                .under(&at));
            }
            tenants.push(t.validate(duration).map_err(|e| e.under(&at))?);
        }
        let groups = checked_groups(&self.groups, &names, &group_names, &mut tenants)?;
        let mut unmanaged = Vec::new();
        for (ui, u) in self.unmanaged.into_iter().enumerate() {
            let at = format!("unmanaged[{ui}]");
            unmanaged.push(u.validate(duration, &names).map_err(|e| e.under(&at))?);
        }
        let cluster = checked_cluster(
            self.cluster.as_ref(),
            &host_names,
            &mut tenants,
            &unmanaged,
            duration,
            interval,
        )?;
        let watch_interval = iofloor_core::control::watch_interval(
            interval,
            self.watch_interval.map(|w| w.0),
            cluster.is_some(),
        )
        .or_else(|e| bad("watch_interval", e.to_string()))?;
        Ok(Scenario {
            name: self.name,
            description: self.description,
            duration,
            warmup,
            interval,
            watch_interval,
            seed: self.seed,
            device,
            policy_model,
            policy: self.policy,
            tenants,
            groups,
            unmanaged,
            cluster,
            time_scale: 1.0,
        })
    }
}

/// The scenario's groups, checked as the service's config checks them
/// (iofloor_core::hierarchy), and each tenant given the group it names.
fn checked_groups(
    files: &[GroupFile],
    tenant_names: &std::collections::HashSet<String>,
    named: &[Option<String>],
    tenants: &mut [Tenant],
) -> Checked<Vec<std::sync::Arc<iofloor_core::GroupSpec>>> {
    use iofloor_core::hierarchy::{build_groups, check_member_floors, GroupDef};
    let defs: Vec<GroupDef> = files
        .iter()
        .map(|g| GroupDef {
            name: g.name.clone(),
            floor: g.floor.map(|f| f.0),
            ceiling: g.ceiling.map(|c| c.0),
            weight: g.weight,
            parent: g.group.clone(),
        })
        .collect();
    let under = |(i, e): (usize, ValidationError)| e.under(&format!("group[{i}]"));
    let groups = build_groups(&defs).map_err(under)?;
    if let Some(i) = files.iter().position(|g| tenant_names.contains(&g.name)) {
        return bad(
            &format!("group[{i}].name"),
            format!("`{}` names a tenant too", files[i].name),
        );
    }
    let mut members = Vec::new();
    for (ti, name) in named.iter().enumerate() {
        let Some(name) = name else { continue };
        let Some(g) = groups.iter().position(|g| g.name == *name) else {
            return bad(
                &format!("tenant[{ti}].group"),
                format!("`{name}` is not a `[[group]]`"),
            );
        };
        tenants[ti].spec.group = Some(groups[g].clone());
        members.push((g, tenants[ti].spec.floor));
    }
    check_member_floors(&groups, members).map_err(under)?;
    Ok(groups)
}

/// A host name as etcd keys and the daemon's `[cluster] host` take it.
fn checked_host_name(key: &str, name: &str) -> Checked<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        bad(
            key,
            format!("`{name}` is not a host name (1–64 of A–Z a–z 0–9 - _ .)"),
        )
    }
}

/// The cluster of a scenario whose tenants name their hosts: every tenant
/// names one or none does, events name known hosts in time order, and the
/// exchange's times fit the interval.
fn checked_cluster(
    file: Option<&ClusterFile>,
    host_names: &[Option<String>],
    tenants: &mut [Tenant],
    unmanaged: &[Unmanaged],
    duration: Duration,
    interval: Duration,
) -> Checked<Option<Cluster>> {
    let Some(first) = host_names.iter().position(Option::is_some) else {
        if file.is_some() {
            return bad(
                "cluster",
                "no tenant names its `host`: a cluster needs them",
            );
        }
        return Ok(None);
    };
    let hosts = placed_hosts(host_names, first, tenants)?;
    if let Some(ui) = unmanaged
        .iter()
        .position(|u| u.origin == UnmanagedOrigin::ThisHost)
    {
        return bad(
            &format!("unmanaged[{ui}].origin"),
            "a cluster scenario has no one host for `this-host` load: use `other-host`",
        );
    }
    let file = file.cloned().unwrap_or_default();
    let delay = file.delay.map(|d| d.0).unwrap_or(interval / 2);
    if delay >= interval {
        return bad(
            "cluster.delay",
            format!("must be shorter than the interval ({interval:?}), got {delay:?}"),
        );
    }
    let lease_ttl = file
        .lease_ttl
        .map(|d| d.0)
        .unwrap_or(Duration::from_secs(3));
    if lease_ttl < interval {
        return bad(
            "cluster.lease_ttl",
            format!("must be at least the interval ({interval:?}), got {lease_ttl:?}"),
        );
    }
    let stale_after = file.stale_after.map(|d| d.0).unwrap_or(interval * 3);
    if stale_after < interval {
        return bad(
            "cluster.stale_after",
            format!("must be at least the interval ({interval:?}), got {stale_after:?}"),
        );
    }
    let events = checked_events(&file.events, &hosts, duration)?;
    Ok(Some(Cluster {
        hosts,
        delay,
        lease_ttl,
        stale_after,
        events,
        declared: Placed {
            value: host_names[first].clone().unwrap_or_default(),
            path: String::new(),
            line: None,
            key: format!("tenant[{first}].host"),
        },
    }))
}

/// The cluster's hosts in the order tenants first name them; sets each
/// tenant's host. Every tenant must name one, as tenant `first` does.
fn placed_hosts(
    host_names: &[Option<String>],
    first: usize,
    tenants: &mut [Tenant],
) -> Checked<Vec<String>> {
    let mut hosts: Vec<String> = Vec::new();
    for (ti, name) in host_names.iter().enumerate() {
        let key = format!("tenant[{ti}].host");
        let Some(name) = name else {
            return bad(
                &key,
                format!("missing: `tenant[{first}]` names its host, so every tenant must"),
            );
        };
        checked_host_name(&key, name)?;
        let index = match hosts.iter().position(|h| h == name) {
            Some(i) => i,
            None => {
                hosts.push(name.clone());
                hosts.len() - 1
            }
        };
        tenants[ti].host = Some(index);
    }
    Ok(hosts)
}

/// The cluster's events on `hosts`, each before the run's end and in time
/// order.
fn checked_events(
    file_events: &[ClusterEventFile],
    hosts: &[String],
    duration: Duration,
) -> Checked<Vec<(Duration, usize, ClusterEventKind)>> {
    let mut events: Vec<(Duration, usize, ClusterEventKind)> = Vec::new();
    for (ei, e) in file_events.iter().enumerate() {
        let key = |k: &str| format!("cluster.event[{ei}].{k}");
        let Some(host) = hosts.iter().position(|h| *h == e.host) else {
            return bad(
                &key("host"),
                format!(
                    "no tenant runs on `{}` (hosts: {})",
                    e.host,
                    hosts.join(", ")
                ),
            );
        };
        if e.at.0 >= duration {
            return bad(
                &key("at"),
                format!("{:?} is not before the end of the run", e.at.0),
            );
        }
        if events.last().is_some_and(|(prev, _, _)| *prev > e.at.0) {
            return bad(&key("at"), "events must be listed in time order");
        }
        events.push((e.at.0, host, e.kind));
    }
    Ok(events)
}

impl UnmanagedFile {
    fn validate(
        self,
        duration: Duration,
        tenant_names: &std::collections::HashSet<String>,
    ) -> Checked<Unmanaged> {
        if self.name.trim().is_empty() {
            return bad("name", "must not be empty");
        }
        if tenant_names.contains(&self.name) {
            return bad("name", format!("`{}` is also a tenant's name", self.name));
        }
        if self.jobs.is_empty() {
            return bad(
                "job",
                format!(
                    "unmanaged load `{}` needs at least one [[unmanaged.job]]",
                    self.name
                ),
            );
        }
        if let Some(device) = &self.device {
            if !device.is_absolute() {
                return bad(
                    "device",
                    format!("must be an absolute path, got `{}`", device.display()),
                );
            }
        }
        let jobs = self
            .jobs
            .into_iter()
            .enumerate()
            .map(|(ji, j)| {
                j.validate(duration)
                    .map_err(|e| e.under(&format!("job[{ji}]")))
            })
            .collect::<Checked<Vec<Job>>>()?;
        Ok(Unmanaged {
            name: self.name,
            origin: self.origin,
            // Placed by `Scenario::parse`, which knows the file.
            device: self.device.map(|value| Placed {
                value,
                path: String::new(),
                line: None,
                key: String::new(),
            }),
            jobs,
        })
    }
}

/// A change in a job's schedule: when, and its new number of processes
/// and queue depth (`None`: unchanged).
type JobChange = (Duration, Option<u32>, Option<u32>);

impl JobFile {
    fn validate(self, duration: Duration) -> Checked<Job> {
        if self.iodepth == 0 || self.iodepth > 4096 {
            return bad(
                "iodepth",
                format!("must be between 1 and 4096, got {}", self.iodepth),
            );
        }
        if self.numjobs > 1024 {
            return bad(
                "numjobs",
                format!("must be at most 1024, got {}", self.numjobs),
            );
        }
        if self.bs.0 > 64 << 20 {
            return bad("bs", "must be at most 64MiB");
        }
        if let Some(m) = self.rwmixread {
            if m > 100 {
                return bad("rwmixread", format!("must be 0..100, got {m}"));
            }
        }
        if let Some(RateQ(Rate::Cost(_))) = self.rate {
            return bad("rate", "must be in bytes/s or IOPS, as in fio");
        }
        let start = self.start.map(|s| s.0).unwrap_or_default();
        let stop = self.stop.map(|s| s.0).unwrap_or(duration);
        if stop <= start {
            return bad("stop", "must be after `start`");
        }
        let mut changes = self.changes(start, stop)?;
        let mut state = JobState {
            numjobs: self.numjobs,
            iodepth: self.iodepth,
        };
        changes.sort_by_key(|c| c.0);
        let mut schedule = vec![(start, state)];
        for (t, n, d) in changes {
            if t >= stop {
                continue;
            }
            if let Some(n) = n {
                state.numjobs = n;
            }
            if let Some(d) = d {
                state.iodepth = d;
            }
            schedule.push((t, state));
        }
        if stop < duration {
            schedule.push((
                stop,
                JobState {
                    numjobs: 0,
                    iodepth: state.iodepth,
                },
            ));
        }
        Ok(Job {
            rw: self.rw,
            read_share: self.rw.read_share(self.rwmixread),
            bs: self.bs.0,
            rate: self.rate.map(|r| r.0),
            rate_process: self.rate_process,
            schedule,
        })
    }

    /// The job's ramp and phases as changes (time, processes, queue depth)
    /// between `start` and `stop`, not yet in order.
    fn changes(&self, start: Duration, stop: Duration) -> Checked<Vec<JobChange>> {
        let mut changes: Vec<JobChange> = Vec::new();
        if let Some(r) = &self.ramp {
            if r.every.0.is_zero() {
                return bad("ramp.every", "must be positive");
            }
            if r.max < self.numjobs || r.add == 0 {
                return bad(
                    "ramp.max",
                    "must be at least `numjobs`, and `ramp.add` positive",
                );
            }
            let mut n = self.numjobs;
            let mut t = start + r.every.0;
            while n < r.max && t < stop {
                n = (n + r.add).min(r.max);
                changes.push((t, Some(n), None));
                t += r.every.0;
            }
        }
        for (pi, p) in self.phases.iter().enumerate() {
            if p.numjobs.is_none() && p.iodepth.is_none() {
                return bad(&format!("phase[{pi}]"), "set `numjobs` or `iodepth`");
            }
            if let Some(d) = p.iodepth {
                if d == 0 || d > 4096 {
                    return bad(
                        &format!("phase[{pi}].iodepth"),
                        format!("must be between 1 and 4096, got {d}"),
                    );
                }
            }
            changes.push((start + p.at.0, p.numjobs, p.iodepth));
        }
        Ok(changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
name = "t"
duration = "60s"
[device]
parallelism = 4
rbps = "200MiB/s"
rseqiops = 8000
rrandiops = 4000
wbps = "100MiB/s"
wseqiops = 4000
wrandiops = 2000
[[tenant]]
name = "a"
floor = "10MiB/s"
[[tenant.job]]
rw = "randwrite"
bs = "64k"
numjobs = 1
ramp = { every = "10s", max = 4 }
"#;

    #[test]
    fn parses_and_expands_ramp() {
        let s = Scenario::parse(BASE, "t.toml").unwrap();
        let j = &s.tenants[0].jobs[0];
        let counts: Vec<u32> = j.schedule.iter().map(|(_, st)| st.numjobs).collect();
        assert_eq!(counts, vec![1, 2, 3, 4]);
        assert_eq!(
            s.steps(),
            vec![
                Duration::from_secs(10),
                Duration::from_secs(20),
                Duration::from_secs(30)
            ]
        );
        assert_eq!(j.state_at(Duration::from_secs(25)).numjobs, 3);
        assert_eq!(s.time_scaled(0.5).steps()[0], Duration::from_secs(5));
    }

    fn err_of(text: &str) -> String {
        Scenario::parse(text, "bad.toml").unwrap_err().to_string()
    }

    #[test]
    fn bad_input_names_file_line_and_field() {
        let e = err_of(&BASE.replace(r#"floor = "10MiB/s""#, r#"floor = "0MB/s""#));
        assert!(
            e.contains("bad.toml")
                && e.contains("line 14")
                && e.contains("floor = ")
                && e.contains("greater than zero"),
            "{e}"
        );
        let e = err_of(&BASE.replace(r#"bs = "64k""#, r#"bs = "64 furlongs""#));
        assert!(
            e.contains("line 17") && e.contains("bs = ") && e.contains("furlongs"),
            "{e}"
        );
        let e = err_of(&BASE.replace("wrandiops = 2000", "wrandiops = 2000\nwarp = 9"));
        assert!(e.contains("unknown field `warp`"), "{e}");
        let e = err_of(&BASE.replace("duration = \"60s\"\n", ""));
        assert!(e.contains("missing field `duration`"), "{e}");
        let e = err_of(&BASE.replace("numjobs = 1", "numjobs = 1\niodepth = 0"));
        assert!(
            e.starts_with("bad.toml:19: `tenant[0].job[0].iodepth` must be between 1 and 4096"),
            "{e}"
        );
        let e = err_of(&BASE.replace("[[tenant]]", "[[tenant]]\nweight = 0.0"));
        assert!(e.starts_with("bad.toml:13: `tenant[0].weight`"), "{e}");
        let e = err_of(&format!(
            "{BASE}[[tenant]]\nname = \"a\"\n[[tenant.job]]\nrw = \"read\"\nbs = \"4k\"\n"
        ));
        assert!(
            e.contains("`tenant[1].name` `a` used by two tenants"),
            "{e}"
        );
        let e = err_of(&BASE.replace("wrandiops = 2000", "wrandiops = -5"));
        assert!(e.contains("device.wrandiops"), "{e}");
        let e = err_of(&BASE.replace("[policy]", "").replace(
            "[[tenant]]",
            "[policy.floor]\ntarget_utilisation = 1.5\n[[tenant]]",
        ));
        assert!(e.contains("target_utilisation"), "{e}");
    }

    #[test]
    fn watch_interval_is_an_eighth_unless_given_and_bad_values_name_the_line() {
        let with = |watch: &str| {
            BASE.replace(
                "duration = \"60s\"\n",
                &format!("duration = \"60s\"\n{watch}"),
            )
        };
        let s = Scenario::parse(BASE, "t.toml").unwrap();
        assert_eq!(s.watch_interval, Some(Duration::from_millis(125)));
        let s = Scenario::parse(&with("watch_interval = \"0s\"\n"), "t.toml").unwrap();
        assert_eq!(s.watch_interval, None);
        let s = Scenario::parse(&with("watch_interval = \"250ms\"\n"), "t.toml").unwrap();
        assert_eq!(s.watch_interval, Some(Duration::from_millis(250)));
        for bad in ["\"1s\"", "\"1ms\""] {
            let e = err_of(&with(&format!("watch_interval = {bad}\n")));
            assert!(
                e.starts_with("bad.toml:4: `watch_interval` must be 0s"),
                "{e}"
            );
        }
        let e = err_of(&with("watch_interval = \"soon\"\n"));
        assert!(
            e.contains("bad.toml") && e.contains("line 4") && e.contains("soon"),
            "{e}"
        );
    }

    #[test]
    fn device_changes_and_unmanaged_load_parse_and_scale() {
        let text = format!(
            "{BASE}[[unmanaged]]\nname = \"other\"\n[[unmanaged.job]]\nrw = \"randread\"\nbs = \"4k\"\nstart = \"20s\"\n"
        )
        .replace(
            "wrandiops = 2000",
            "wrandiops = 2000\n[[device.change]]\nat = \"30s\"\nfactor = 0.6",
        );
        let s = Scenario::parse(&text, "t.toml").unwrap();
        assert_eq!(s.device.factor_at(Duration::from_secs(29)), 1.0);
        assert_eq!(s.device.factor_at(Duration::from_secs(30)), 0.6);
        assert_eq!(s.unmanaged[0].origin, UnmanagedOrigin::OtherHost);
        assert!(s.steps().contains(&Duration::from_secs(30)));
        let half = s.time_scaled(0.5);
        assert_eq!(half.device.changes[0].0, Duration::from_secs(15));
        assert_eq!(
            half.unmanaged[0].jobs[0].schedule[0].0,
            Duration::from_secs(10)
        );
        let alone = s.alone(0);
        assert!(alone.unmanaged.is_empty() && alone.device.changes.is_empty());
    }

    #[test]
    fn bad_changes_targets_and_unmanaged_load_name_their_key_and_line() {
        let change = |at: &str, factor: &str| {
            err_of(&BASE.replace(
                "wrandiops = 2000",
                &format!("wrandiops = 2000\n[[device.change]]\nat = {at}\nfactor = {factor}"),
            ))
        };
        let e = change("\"30s\"", "0");
        assert!(
            e.starts_with("bad.toml:14: `device.change[0].factor` must be in (0, 100], got 0"),
            "{e}"
        );
        let e = change("\"30s\"", "-1.5");
        assert!(e.contains("`device.change[0].factor`"), "{e}");
        let e = change("\"90s\"", "0.5");
        assert!(
            e.contains("`device.change[0].at`") && e.contains("not before the end"),
            "{e}"
        );
        let target = |t: &str| {
            err_of(&BASE.replace(
                "[[tenant]]",
                &format!("[policy.floor]\nlatency_target = {t}\n[[tenant]]"),
            ))
        };
        let e = target("\"0ms\"");
        assert!(
            e.starts_with("bad.toml:13: `policy.floor.latency_target` must be above 0"),
            "{e}"
        );
        let e = target("\"-2ms\"");
        assert!(e.contains("line 13") && e.contains("negative"), "{e}");
        let e = target("\"soon\"");
        assert!(
            e.contains("line 13") && e.contains("invalid duration"),
            "{e}"
        );
        let e = err_of(&format!(
            "{BASE}[[unmanaged]]\nname = \"a\"\n[[unmanaged.job]]\nrw = \"read\"\nbs = \"4k\"\n"
        ));
        assert!(
            e.contains("`unmanaged[0].name` `a` is also a tenant's name"),
            "{e}"
        );
        let e = err_of(&format!(
            "{BASE}[[unmanaged]]\nname = \"b\"\norigin = \"mars\"\n"
        ));
        assert!(e.contains("unknown variant `mars`"), "{e}");
        let e = err_of(&format!(
            "{BASE}[[unmanaged]]\nname = \"c\"\ndevice = \"loop9\"\n[[unmanaged.job]]\nrw = \"read\"\nbs = \"4k\"\n"
        ));
        assert!(
            e.contains("`unmanaged[0].device` must be an absolute path, got `loop9`"),
            "{e}"
        );
    }

    #[test]
    fn groups_parse_and_bad_trees_name_their_key_and_line() {
        let grouped = |groups: &str| {
            format!(
                "{}{groups}",
                BASE.replace(
                    "floor = \"10MiB/s\"\n",
                    "floor = \"10MiB/s\"\ngroup = \"team\"\n"
                )
            )
        };
        let s = Scenario::parse(
            &grouped("[[group]]\nname = \"team\"\nfloor = \"30MiB/s\"\ngroup = \"customer\"\n[[group]]\nname = \"customer\"\nweight = 200\n"),
            "t.toml",
        )
        .unwrap();
        assert_eq!(s.groups.len(), 2);
        let team = s.tenants[0].spec.group.as_ref().unwrap();
        assert_eq!(team.parent.as_ref().unwrap().weight, 200.0);
        assert!(std::sync::Arc::ptr_eq(team, &s.groups[0]));

        let e = err_of(&grouped("[[group]]\nname = \"team\"\ngroup = \"team\"\n"));
        assert!(
            e.starts_with("bad.toml:23: `group[0].group` makes a cycle: team in team"),
            "{e}"
        );
        let e = err_of(&grouped("[[group]]\nname = \"team\"\ngroup = \"nope\"\n"));
        assert!(
            e.starts_with("bad.toml:23: `group[0].group` `nope` is not a `[[group]]`"),
            "{e}"
        );
        let e = err_of(&grouped("[[group]]\nname = \"other\"\n"));
        assert!(
            e.starts_with("bad.toml:15: `tenant[0].group` `team` is not a `[[group]]`"),
            "{e}"
        );
        let e = err_of(&grouped("[[group]]\nname = \"team\"\nfloor = \"5MiB/s\"\n"));
        assert!(
            e.starts_with("bad.toml:23: `group[0].floor` 5.0 MiB/s is below what its members' floors add up to (10.0 MiB/s)"),
            "{e}"
        );
        let e = err_of(&grouped("[[group]]\nname = \"a\"\n"));
        assert!(e.contains("`group[0].name` `a` names a tenant too"), "{e}");
        let e = err_of(&grouped(
            "[[group]]\nname = \"team\"\nfloor = \"5MiB/s\"\nceiling = \"1MiB/s\"\n",
        ));
        assert!(
            e.contains("`group[0].ceiling`") && e.contains("below `floor`"),
            "{e}"
        );
    }

    #[test]
    fn an_unmanaged_device_remembers_where_it_was_written() {
        let text = format!(
            "{BASE}[[unmanaged]]\nname = \"c\"\ndevice = \"/dev/nope\"\n[[unmanaged.job]]\nrw = \"read\"\nbs = \"4k\"\n"
        );
        let s = Scenario::parse(&text, "x.toml").unwrap();
        let placed = s.unmanaged[0].device.as_ref().unwrap();
        assert_eq!(placed.value, std::path::PathBuf::from("/dev/nope"));
        let line = text
            .lines()
            .position(|l| l.starts_with("device ="))
            .unwrap()
            + 1;
        assert_eq!(
            placed.error("is not a block device").to_string(),
            format!("x.toml:{line}: `unmanaged[0].device` is not a block device")
        );
    }

    /// BASE with a second tenant, both on hosts, and `extra` appended.
    fn cluster_text(host_a: &str, extra: &str) -> String {
        let two = format!(
            "{BASE}[[tenant]]\nname = \"b\"\nhost = \"h2\"\n[[tenant.job]]\nrw = \"read\"\nbs = \"4k\"\n"
        );
        two.replacen("name = \"a\"", &format!("name = \"a\"\n{host_a}"), 1) + extra
    }

    #[test]
    fn tenants_on_hosts_make_a_cluster_with_the_daemons_defaults() {
        let s = Scenario::parse(
            &cluster_text(
                "host = \"h1\"",
                "[cluster]\nlease_ttl = \"2s\"\n[[cluster.event]]\nat = \"20s\"\nhost = \"h1\"\nkind = \"kill\"\n[[cluster.event]]\nat = \"30s\"\nhost = \"h2\"\nkind = \"partition\"\n",
            ),
            "c.toml",
        )
        .unwrap();
        let c = s.cluster.as_ref().unwrap();
        assert_eq!(c.hosts, vec!["h1", "h2"]);
        assert_eq!((s.tenants[0].host, s.tenants[1].host), (Some(0), Some(1)));
        assert_eq!(c.delay, Duration::from_millis(500), "half the interval");
        assert_eq!(c.lease_ttl, Duration::from_secs(2));
        assert_eq!(c.stale_after, Duration::from_secs(3), "3 intervals");
        assert_eq!(
            c.events[1],
            (Duration::from_secs(30), 1, ClusterEventKind::Partition)
        );
        assert_eq!(
            s.time_scaled(0.5).cluster.unwrap().events[0].0,
            Duration::from_secs(10)
        );
        let alone = s.alone(1);
        assert!(alone.cluster.is_none() && alone.tenants[0].host.is_none());
        assert!(Scenario::parse(BASE, "t.toml").unwrap().cluster.is_none());
    }

    #[test]
    fn bad_clusters_name_their_key_and_line() {
        let e = err_of(&cluster_text("", ""));
        assert!(
            e.starts_with("bad.toml:12: `tenant[0].host` missing: `tenant[1]` names its host"),
            "{e}"
        );
        let e = err_of(&cluster_text("host = \"h 1\"", ""));
        assert!(
            e.starts_with("bad.toml:14: `tenant[0].host` `h 1` is not a host name"),
            "{e}"
        );
        let e = err_of(&format!("{BASE}[cluster]\n"));
        assert!(e.contains("`cluster` no tenant names its `host`"), "{e}");
        let e = err_of(&cluster_text(
            "host = \"h1\"",
            "[cluster]\ndelay = \"1s\"\n",
        ));
        assert!(
            e.contains("`cluster.delay` must be shorter than the interval"),
            "{e}"
        );
        let e = err_of(&cluster_text(
            "host = \"h1\"",
            "[[cluster.event]]\nat = \"5s\"\nhost = \"h9\"\nkind = \"kill\"\n",
        ));
        let line = cluster_text("host = \"h1\"", "").lines().count() + 3;
        assert!(
            e.starts_with(&format!(
                "bad.toml:{line}: `cluster.event[0].host` no tenant runs on `h9` (hosts: h1, h2)"
            )),
            "{e}"
        );
        let e = err_of(&cluster_text(
            "host = \"h1\"",
            "[[cluster.event]]\nat = \"5s\"\nhost = \"h1\"\nkind = \"reboot\"\n",
        ));
        assert!(e.contains("unknown variant `reboot`"), "{e}");
        let e = err_of(&cluster_text(
            "host = \"h1\"",
            "[[unmanaged]]\nname = \"x\"\norigin = \"this-host\"\n[[unmanaged.job]]\nrw = \"read\"\nbs = \"4k\"\n",
        ));
        assert!(
            e.contains("`unmanaged[0].origin` a cluster scenario has no one host"),
            "{e}"
        );
    }
}
