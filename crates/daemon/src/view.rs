//! What the daemon shows: the JSON shapes of the HTTP API (docs/api.yaml),
//! filled by the control thread after each interval and read by the API,
//! the dashboard and `iofloor top`.

use iofloor_core::units::Rate;
use iofloor_core::{Caps, TenantClass, Usage};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// Points of history kept per tenant.
pub const HISTORY: usize = 600;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct UsageView {
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bytes_per_sec: f64,
    pub write_bytes_per_sec: f64,
    pub iops: f64,
    pub bytes_per_sec: f64,
    /// Share of the device per second (1.0 = the whole device).
    pub cost: f64,
    pub latency_us: Option<f64>,
}

impl UsageView {
    pub fn new(u: &Usage, cost: f64) -> UsageView {
        UsageView {
            read_iops: u.read.ios,
            write_iops: u.write.ios,
            read_bytes_per_sec: u.read.bytes,
            write_bytes_per_sec: u.write.bytes,
            iops: u.iops(),
            bytes_per_sec: u.bytes_per_sec(),
            cost,
            latency_us: u.latency_us,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    Cgroup,
    Qmp,
    Libvirt,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantView {
    pub name: String,
    pub class: TenantClass,
    pub source: SourceKind,
    pub path: String,
    pub device: String,
    pub floor: Option<Rate>,
    pub ceiling: Option<Rate>,
    pub weight: f64,
    pub latency_sensitive: bool,
    pub available: bool,
    pub error: Option<String>,
    pub usage: Option<UsageView>,
    pub caps: Caps,
    pub floor_met: Option<bool>,
    pub throttled_seconds: f64,
    pub overridden: bool,
    /// The groups the tenant is in, innermost first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub t: f64,
    pub iops: f64,
    pub bytes_per_sec: f64,
    pub cost: f64,
    pub latency_us: Option<f64>,
    pub capped: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceState {
    pub device: String,
    pub path: String,
    pub utilisation: Option<f64>,
    pub avg_queue: Option<f64>,
    pub capacity_estimate: Option<f64>,
    /// Mean time an I/O spent at the device over the last interval (µs).
    #[serde(default)]
    pub latency_us: Option<f64>,
    /// Whether the active tenants' floors fit what the policy can hand out
    /// (`None` for policies that do not judge it); while they do not, every
    /// entitlement is scaled down by the same factor.
    #[serde(default)]
    pub floors_feasible: Option<bool>,
    /// How much the floors exceed it, in cost units per second.
    #[serde(default)]
    pub floor_shortfall: Option<f64>,
    /// The mean device latency above which the policy counts the device as
    /// overloaded (µs): `latency_target`, raised to 1.25 × the device's
    /// service time when below it; the automatic threshold without one.
    #[serde(default)]
    pub latency_threshold_us: Option<f64>,
    /// Whether `latency_target` is within the device's reach (`None`
    /// without a target).
    #[serde(default)]
    pub latency_target_in_reach: Option<bool>,
    /// Whether the policy judged the device contended over the last
    /// interval: the verdict every tenant's `floor_met` was judged with.
    #[serde(default)]
    pub contended: Option<bool>,
    /// How the capacity loop judged the last interval: its verdict, the
    /// level it regains fast, what it was shown (served, the floors' need,
    /// the flags the policy passed on). The figures that say why
    /// `capacity_estimate` moved, for policies that learn capacity.
    #[serde(default)]
    pub capacity_step: Option<iofloor_core::capacity::CapacityStep>,
    /// The capacity loop's recent points of the device's curve, oldest
    /// first: work served against I/Os in flight, the plateau among them
    /// (`capacity_step.plateau`) the most a full interval served.
    #[serde(default)]
    pub capacity_curve: Vec<iofloor_core::capacity::CurvePoint>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdmissionRow {
    pub name: String,
    pub floor_cost: Option<f64>,
    pub guaranteed: bool,
    /// A group's row: its floor beyond its members' own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub group: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdmissionView {
    pub device: String,
    pub admitted: bool,
    pub usable_capacity: f64,
    pub total_floor_cost: f64,
    pub summary: String,
    pub tenants: Vec<AdmissionRow>,
}

impl AdmissionView {
    pub fn new(device: &str, v: &iofloor_core::admission::AdmissionVerdict) -> AdmissionView {
        AdmissionView {
            device: device.to_string(),
            admitted: v.admitted,
            usable_capacity: v.usable_capacity,
            total_floor_cost: v.total_floor_cost,
            summary: v.summary(),
            tenants: v
                .tenants
                .iter()
                .map(|t| AdmissionRow {
                    name: t.name.clone(),
                    floor_cost: t.floor_cost,
                    guaranteed: t.guaranteed,
                    group: t.group,
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reload {
    pub ok: bool,
    pub message: String,
    pub at: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub policy: String,
    pub interval_s: f64,
    pub uptime_s: f64,
    pub ticks: u64,
    /// Of `ticks`, those run before their interval ended because a look at
    /// a device between intervals saw an overload (`watch_interval`).
    #[serde(default)]
    pub early_ticks: u64,
    pub overruns: u64,
    /// The control loop's timing over its last ticks.
    #[serde(default)]
    pub tick: TickStatus,
    pub config: String,
    pub devices: Vec<DeviceState>,
    pub last_reload: Option<Reload>,
    /// Cluster mode: this agent's place in the cluster; `None` on a single host.
    #[serde(default)]
    pub cluster: Option<ClusterView>,
    /// The daemon's heap when the status was asked for (glibc only).
    #[serde(default)]
    pub heap: Option<crate::memory::Heap>,
}

/// A timing's distribution over the last ticks, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// How long intervals take and how late they start (docs/api.yaml).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TickStatus {
    /// Ticks the percentiles are over (the last 1,000 at most).
    pub samples: usize,
    /// The last finished tick's own figures (each tick is reported once,
    /// by the next one: a tick cannot time its own publishing).
    pub last_duration_ms: f64,
    pub last_lateness_ms: f64,
    pub duration_ms: Percentiles,
    pub lateness_ms: Percentiles,
}

/// This agent as the cluster sees it, and how its last caps were chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterView {
    pub cluster: String,
    pub host: String,
    /// The shared device's cluster-wide name.
    pub device: String,
    /// `allocator` or `agent`.
    pub role: String,
    /// The allocator's host, as the election says.
    pub allocator: Option<String>,
    pub connected: bool,
    /// Hosts whose agents hold a claim in etcd.
    pub hosts: Vec<String>,
    /// `allocated`, `starting` or `fallback`.
    pub mode: Option<String>,
    /// Age of the allocation in force, by this host's clock.
    pub allocation_age_s: Option<f64>,
    pub conflicts: Vec<String>,
    /// On the allocator: hosts gone quiet with their caps in force, whose
    /// last load it counts as load it cannot cap.
    #[serde(default)]
    pub ghosts: Vec<String>,
    pub leases_lost: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TickTenant {
    pub name: String,
    pub device: String,
    pub available: bool,
    pub usage: Option<UsageView>,
    pub caps: Caps,
    pub floor: Option<Rate>,
    pub floor_met: Option<bool>,
}

/// One interval, as streamed on /api/v1/samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tick {
    pub t: f64,
    pub devices: Vec<DeviceState>,
    pub tenants: Vec<TickTenant>,
    /// The control loop's timing, as in the status.
    #[serde(default)]
    pub timing: TickStatus,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantList {
    pub now: f64,
    pub interval_s: f64,
    pub tenants: Vec<TenantView>,
}

/// Adds a point to a tenant's history (see [`View::push_point`]).
fn push_point(history: &mut BTreeMap<String, VecDeque<Point>>, name: &str, point: Point) {
    let h = match history.get_mut(name) {
        Some(h) => h,
        None => history
            .entry(name.to_string())
            .or_insert_with(|| VecDeque::with_capacity(HISTORY)),
    };
    if h.len() == HISTORY {
        h.pop_front();
    }
    h.push_back(point);
}

/// Everything the API reads, replaced or appended to once per interval.
#[derive(Debug, Clone)]
pub struct View {
    pub status: Status,
    pub tenants: BTreeMap<String, TenantView>,
    pub history: BTreeMap<String, VecDeque<Point>>,
    pub admission: Vec<AdmissionView>,
    pub now: f64,
}

impl View {
    /// Adds a point to a tenant's history, the oldest going past
    /// [`HISTORY`]. A history is allocated whole with its first point: a
    /// daemon's memory then follows how many tenants it has, not how long
    /// they have lived (growing by doubling, each history's memory rose for
    /// its first five minutes, to 1,024 points' worth).
    pub fn push_point(&mut self, name: &str, point: Point) {
        push_point(&mut self.history, name, point);
    }

    pub fn tick(&self) -> Tick {
        Tick {
            t: self.now,
            timing: self.status.tick.clone(),
            devices: self.status.devices.clone(),
            tenants: self
                .tenants
                .values()
                .map(|t| TickTenant {
                    name: t.name.clone(),
                    device: t.device.clone(),
                    available: t.available,
                    usage: t.usage,
                    caps: t.caps,
                    floor: t.floor,
                    floor_met: t.floor_met,
                })
                .collect(),
        }
    }
}

/// One interval's timing.
#[derive(Debug, Clone, Copy, Default)]
pub struct TickTiming {
    /// The policies' decisions, the longest device's.
    pub decision: std::time::Duration,
    /// The whole interval: counters read, decisions, caps written, published.
    pub duration: std::time::Duration,
    /// Start after the scheduled time: API changes handled first, or a
    /// machine too busy to wake the thread on time.
    pub lateness: std::time::Duration,
    /// Run before its interval ended, on what a look at the devices saw.
    pub early: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(t: f64) -> Point {
        Point {
            t,
            iops: 1.0,
            bytes_per_sec: 4096.0,
            cost: 0.001,
            latency_us: None,
            capped: false,
        }
    }

    #[test]
    fn a_history_is_allocated_whole_and_keeps_the_last_points() {
        let mut history = BTreeMap::new();
        push_point(&mut history, "a", point(0.0));
        let capacity = history["a"].capacity();
        assert!((HISTORY..HISTORY + 16).contains(&capacity), "{capacity}");
        for i in 1..(2 * HISTORY) {
            push_point(&mut history, "a", point(i as f64));
        }
        let h = &history["a"];
        assert_eq!(h.len(), HISTORY);
        assert_eq!(h.capacity(), capacity, "never grown");
        assert_eq!(h.front().unwrap().t, HISTORY as f64);
    }
}
