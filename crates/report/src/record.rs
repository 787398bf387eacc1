//! Raw records of one run: per-window, per-tenant figures as measured. Kept
//! apart from the measures computed from them, so a report can be rebuilt from
//! a results directory without rerunning anything.

use iofloor_core::units::{Rate, RateUnit};
use iofloor_core::{CostParams, PolicyParams, TenantClass};
use serde::{Deserialize, Serialize};

/// Throughput over a window in every unit a floor can be stated in.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Throughput {
    pub iops: f64,
    pub bytes_per_s: f64,
    /// Cost units per second (share of the device).
    pub cost: f64,
}

impl Throughput {
    pub fn in_unit(&self, unit: RateUnit) -> f64 {
        match unit {
            RateUnit::Iops => self.iops,
            RateUnit::BytesPerSec => self.bytes_per_s,
            RateUnit::Cost => self.cost,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantInfo {
    pub name: String,
    pub class: TenantClass,
    /// The tenant causing the contention in the experiment; the others are
    /// the protected ones for the p99 measure.
    pub noisy: bool,
    pub floor: Option<Rate>,
    /// Unit its throughput is reported in: its floor's, else bytes/s.
    pub unit: RateUnit,
    /// p99 latency in ms when it ran alone on the device, if measured.
    pub alone_p99_ms: Option<f64>,
    /// What it got in each window when it ran alone, where that run covered
    /// the scenario (for the per-phase comparison, seed 000 Fig. 6).
    #[serde(default)]
    pub alone_windows: Vec<TenantWindow>,
    /// Index in [`RunRecord::groups`] of the group it is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<usize>,
}

/// A group of tenants with a promise of its own; its figures in a window are
/// its members' (tenants and groups under it) added up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupInfo {
    pub name: String,
    pub floor: Option<Rate>,
    pub ceiling: Option<Rate>,
    /// Unit its throughput is reported in: its floor's, else bytes/s.
    pub unit: RateUnit,
    /// Index in [`RunRecord::groups`] of the group it is in.
    pub parent: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TenantWindow {
    pub got: Throughput,
    /// What the tenant asks for in this window: what it received running
    /// alone on the device in the same window. `None` when not measured.
    pub demand: Option<Throughput>,
    pub mean_latency_ms: Option<f64>,
    /// The cost cap in force at the window's end (None: unlimited).
    pub cap_cost: Option<f64>,
    /// The share of the window the tenant ran, where it began (or, in the
    /// simulator, ended) within the window (`None`: the whole window). Its
    /// floor there is judged pro rata: a closed-loop tenant's fio processes
    /// take up to half a second to issue their first I/O after they are
    /// started, and no policy serves a floor's worth in what is left of the
    /// second, nor in the part of it before a tenant stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_share: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DeviceWindow {
    pub avg_queue: f64,
    pub utilisation: f64,
    pub mean_latency_ms: Option<f64>,
    /// The capacity the policy believed in at the window's end, in cost
    /// units per second (1.0 = the model's), where it learns one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<f64>,
    /// What the device could do in the window, in the same units, where
    /// the runner knows it: the simulator, from its true device as it is
    /// now (declared changes and write cliff included) over the policies'
    /// model, for the mix of the I/O it started in the window; `iofloor
    /// bench` on a rig, from the rig's throttle group priced for the mix
    /// the tenants ran (a window with none repeats the last figure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub true_capacity: Option<f64>,
    /// What load outside every managed tenant was served in the window
    /// (another host's I/O on the same storage, I/O outside any cgroup),
    /// where the runner can see it: the simulator always, `iofloor bench`
    /// from the unmanaged fio jobs' logs. `None` where there is no such load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmanaged: Option<Throughput>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Window {
    /// Start of the window, seconds from the start of the run.
    pub t: f64,
    pub tenants: Vec<TenantWindow>,
    pub device: DeviceWindow,
}

/// Latency distribution of one tenant after warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// The record layout this build writes. Version 1 is every record written
/// before the field existed (read as such); a newer version than this is
/// refused by the reader rather than half understood.
pub const SCHEMA_VERSION: u32 = 3;

fn schema_before_versioning() -> u32 {
    1
}

/// Where a record came from, so a saved result can be traced and rerun.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// iofloor's version (Cargo package version of the writer).
    pub iofloor_version: String,
    /// The platform the run was on (`Platform::kind` of iofloor-scenario):
    /// "simulator" or "device" (with the device in `RunRecord::source`).
    /// Named before platforms were; kept so records read across versions.
    pub testbed: String,
    /// Wall-clock start and end of the whole invocation, seconds since the Unix epoch.
    pub started_unix_s: f64,
    pub finished_unix_s: f64,
    /// The cost model the policies were given.
    pub policy_model: CostParams,
    /// The simulated device's true model, where it differs from a real one.
    pub device_model: Option<CostParams>,
    pub policy_params: PolicyParams,
    /// Factor the scenario's times were scaled by.
    pub time_scale: f64,
    /// `uname -r` of the machine that ran it (real runs).
    pub kernel: Option<String>,
    pub fio_version: Option<String>,
    pub qemu_version: Option<String>,
}

/// Everything measured in one run of one policy on one scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// [`SCHEMA_VERSION`] of the writer.
    #[serde(default = "schema_before_versioning")]
    pub schema_version: u32,
    /// Absent in version-1 records.
    #[serde(default)]
    pub environment: Option<Environment>,
    pub scenario: String,
    pub policy: String,
    /// "sim" or "device:/dev/..." for real runs.
    pub source: String,
    pub window_s: f64,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub control_interval_s: f64,
    pub tenants: Vec<TenantInfo>,
    /// Groups of tenants (schema 3); empty where no tenant is in one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupInfo>,
    pub windows: Vec<Window>,
    /// Times (s) at which the load changed: a job started, stopped, or changed depth.
    pub steps: Vec<f64>,
    pub latency: Vec<LatencySummary>,
    pub decision_time_us_max: f64,
    pub decision_time_us_mean: f64,
    /// I/Os completed in the run (all tenants), for throughput-of-simulation figures.
    pub ios_completed: u64,
    /// Every decision's judgement by the policy's capacity loop, in order,
    /// where it learns capacity: why the learned capacity moved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capacity_trace: Vec<CapacityTraceEntry>,
}

/// One decision of the capacity loop, at `t` seconds from the run's start.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CapacityTraceEntry {
    pub t: f64,
    #[serde(flatten)]
    pub step: iofloor_core::capacity::CapacityStep,
}

impl RunRecord {
    /// Whether its policy learned a capacity (there is a chart of it).
    pub fn learns_capacity(&self) -> bool {
        self.windows.iter().any(|w| w.device.capacity.is_some())
    }
}
