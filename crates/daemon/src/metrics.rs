//! Prometheus metrics (`/metrics`), with the `prometheus-client` crate. Names
//! follow Prometheus conventions: base units (seconds, bytes), `_total` for
//! counters, `_ratio` for shares; per-tenant series carry `tenant`, `device`
//! and `class` labels and are removed when the tenant goes away, and cap series
//! exist only while a cap is in force.

use crate::view::TenantView;
use iofloor_core::units::Rate;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

type GaugeF = Gauge<f64, AtomicU64>;
type CounterF = Counter<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
    pub device: String,
    pub class: String,
}

impl TenantLabels {
    fn of(t: &TenantView) -> TenantLabels {
        TenantLabels {
            tenant: t.name.clone(),
            device: t.device.clone(),
            class: t.class.as_str().to_string(),
        }
    }
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum DirectionLabel {
    read,
    write,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirLabels {
    tenant: String,
    device: String,
    class: String,
    direction: DirectionLabel,
}

impl DirLabels {
    fn new(l: &TenantLabels, direction: DirectionLabel) -> DirLabels {
        DirLabels {
            tenant: l.tenant.clone(),
            device: l.device.clone(),
            class: l.class.clone(),
            direction,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FloorLabels {
    tenant: String,
    device: String,
    class: String,
    unit: String,
}

impl FloorLabels {
    fn new(l: &TenantLabels, unit: &str) -> FloorLabels {
        FloorLabels {
            tenant: l.tenant.clone(),
            device: l.device.clone(),
            class: l.class.clone(),
            unit: unit.into(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabels {
    device: String,
}

/// Cluster mode: which cluster, which shared device (the host is the
/// registry's own label, on every metric).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    cluster: String,
    device: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterModeLabels {
    cluster: String,
    device: String,
    mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: String,
}

fn unit_label(r: Rate) -> &'static str {
    match r {
        Rate::Iops(_) => "iops",
        Rate::BytesPerSec(_) => "bytes_per_second",
        Rate::Cost(_) => "cost",
    }
}

fn flag(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// Sets a gauge's series, or removes it when there is no value: a series
/// that is absent says "unknown" or "none", where a stale value would lie.
fn set_or_remove<L>(family: &Family<L, GaugeF>, labels: &L, value: Option<f64>)
where
    L: Clone + std::hash::Hash + Eq,
{
    match value {
        Some(v) => {
            family.get_or_create(labels).set(v);
        }
        None => {
            family.remove(labels);
        }
    }
}

/// Per-tenant series: usage, floor, caps, throttling and availability.
#[derive(Default)]
struct TenantSeries {
    iops: Family<DirLabels, GaugeF>,
    bytes: Family<DirLabels, GaugeF>,
    cost: Family<TenantLabels, GaugeF>,
    latency: Family<TenantLabels, GaugeF>,
    floor: Family<FloorLabels, GaugeF>,
    floor_met: Family<TenantLabels, GaugeF>,
    cap_iops: Family<DirLabels, GaugeF>,
    cap_bytes: Family<DirLabels, GaugeF>,
    throttled: Family<TenantLabels, CounterF>,
    available: Family<TenantLabels, GaugeF>,
}

impl TenantSeries {
    fn register(&self, r: &mut Registry) {
        r.register(
            "iofloor_tenant_iops",
            "I/O operations per second over the last interval",
            self.iops.clone(),
        );
        r.register(
            "iofloor_tenant_bytes_per_second",
            "Bytes per second over the last interval",
            self.bytes.clone(),
        );
        r.register(
            "iofloor_tenant_cost_ratio",
            "Share of the device's capacity used (cost model)",
            self.cost.clone(),
        );
        r.register(
            "iofloor_tenant_latency_seconds",
            "Mean completion latency, where the backend reports it",
            self.latency.clone(),
        );
        r.register(
            "iofloor_tenant_floor",
            "The tenant's floor, in the unit of the `unit` label",
            self.floor.clone(),
        );
        r.register(
            "iofloor_tenant_floor_met",
            "1 if the floor was met over the last interval (docs/config.md)",
            self.floor_met.clone(),
        );
        r.register(
            "iofloor_tenant_cap_iops",
            "IOPS cap in force (absent when none)",
            self.cap_iops.clone(),
        );
        r.register(
            "iofloor_tenant_cap_bytes_per_second",
            "Bandwidth cap in force (absent when none)",
            self.cap_bytes.clone(),
        );
        r.register(
            "iofloor_tenant_throttled_seconds",
            "Seconds the tenant had a cap in force",
            self.throttled.clone(),
        );
        r.register(
            "iofloor_tenant_available",
            "1 if the tenant's counters could be read this interval",
            self.available.clone(),
        );
    }

    fn update(&self, t: &TenantView, throttled_for: f64) {
        let l = TenantLabels::of(t);
        let (r, w) = (
            DirLabels::new(&l, DirectionLabel::read),
            DirLabels::new(&l, DirectionLabel::write),
        );
        self.available.get_or_create(&l).set(flag(t.available));
        if let Some(u) = &t.usage {
            self.iops.get_or_create(&r).set(u.read_iops);
            self.iops.get_or_create(&w).set(u.write_iops);
            self.bytes.get_or_create(&r).set(u.read_bytes_per_sec);
            self.bytes.get_or_create(&w).set(u.write_bytes_per_sec);
            self.cost.get_or_create(&l).set(u.cost);
            set_or_remove(&self.latency, &l, u.latency_us.map(|us| us / 1e6));
        }
        // The floor's unit is a label: a floor changed to another unit must
        // not leave the old unit's series behind.
        self.remove_floor(&l);
        if let Some(f) = t.floor {
            let fl = FloorLabels::new(&l, unit_label(f));
            self.floor.get_or_create(&fl).set(f.value());
        }
        set_or_remove(&self.floor_met, &l, t.floor_met.map(flag));
        for (labels, iops, bps) in [
            (&r, t.caps.read_iops, t.caps.read_bps),
            (&w, t.caps.write_iops, t.caps.write_bps),
        ] {
            set_or_remove(&self.cap_iops, labels, iops);
            set_or_remove(&self.cap_bytes, labels, bps);
        }
        self.throttled.get_or_create(&l).inc_by(throttled_for);
    }

    fn remove_floor(&self, l: &TenantLabels) {
        for unit in ["iops", "bytes_per_second", "cost"] {
            self.floor.remove(&FloorLabels::new(l, unit));
        }
    }

    fn forget(&self, t: &TenantView) {
        let l = TenantLabels::of(t);
        for d in [DirectionLabel::read, DirectionLabel::write] {
            let dl = DirLabels::new(&l, d);
            self.iops.remove(&dl);
            self.bytes.remove(&dl);
            self.cap_iops.remove(&dl);
            self.cap_bytes.remove(&dl);
        }
        self.cost.remove(&l);
        self.latency.remove(&l);
        self.floor_met.remove(&l);
        self.throttled.remove(&l);
        self.available.remove(&l);
        self.remove_floor(&l);
    }
}

/// Per-device series: load, learned capacity, the policy's verdicts and the
/// number of tenants.
#[derive(Default)]
struct DeviceSeries {
    utilisation: Family<DeviceLabels, GaugeF>,
    queue: Family<DeviceLabels, GaugeF>,
    capacity: Family<DeviceLabels, GaugeF>,
    plateau: Family<DeviceLabels, GaugeF>,
    latency: Family<DeviceLabels, GaugeF>,
    floors_feasible: Family<DeviceLabels, GaugeF>,
    contended: Family<DeviceLabels, GaugeF>,
    floor_shortfall: Family<DeviceLabels, GaugeF>,
    latency_threshold: Family<DeviceLabels, GaugeF>,
    target_in_reach: Family<DeviceLabels, GaugeF>,
    tenants: Family<DeviceLabels, GaugeF>,
}

impl DeviceSeries {
    fn register(&self, r: &mut Registry) {
        r.register(
            "iofloor_device_utilisation_ratio",
            "Share of the interval the device had I/O in flight",
            self.utilisation.clone(),
        );
        r.register(
            "iofloor_device_queue_depth",
            "Mean number of I/Os in flight",
            self.queue.clone(),
        );
        r.register(
            "iofloor_device_capacity_estimate_cost",
            "Capacity the policy believes the device has, in cost units per second",
            self.capacity.clone(),
        );
        r.register(
            "iofloor_device_capacity_plateau_cost",
            "The plateau of the device's curve of served work against I/Os in flight: the most an interval that found it full served, in cost units per second; absent while none has",
            self.plateau.clone(),
        );
        r.register(
            "iofloor_device_latency_seconds",
            "Mean time an I/O spent at the device (diskstats, Little's law)",
            self.latency.clone(),
        );
        r.register(
            "iofloor_device_floors_feasible",
            "1 if the active tenants' floors fit the learned capacity; 0 while every entitlement is scaled down",
            self.floors_feasible.clone(),
        );
        r.register(
            "iofloor_device_contended",
            "1 if the policy judged the device contended over the last interval: the verdict each tenant's floor_met was judged with",
            self.contended.clone(),
        );
        r.register(
            "iofloor_device_floor_shortfall_cost",
            "How much the active floors exceed what can be handed out, in cost units per second",
            self.floor_shortfall.clone(),
        );
        r.register(
            "iofloor_device_latency_threshold_seconds",
            "Mean device latency the policy holds the device under: latency_target, raised to 1.25 x the device's least latency when below it; absent without a target",
            self.latency_threshold.clone(),
        );
        r.register(
            "iofloor_device_latency_target_in_reach",
            "1 if latency_target is at least 1.25 x the device's least latency (the least on its curve); 0 when no cap can meet it; absent without a target",
            self.target_in_reach.clone(),
        );
        r.register(
            "iofloor_tenants",
            "Tenants under control",
            self.tenants.clone(),
        );
    }

    fn update(&self, state: &crate::view::DeviceState, tenants: usize) {
        let l = DeviceLabels {
            device: state.device.clone(),
        };
        for (family, value) in [
            (&self.utilisation, state.utilisation),
            (&self.queue, state.avg_queue),
            (&self.capacity, state.capacity_estimate),
            (
                &self.plateau,
                state.capacity_step.and_then(|step| step.plateau),
            ),
            (&self.latency, state.latency_us.map(|us| us / 1e6)),
            (&self.floors_feasible, state.floors_feasible.map(flag)),
            (&self.floor_shortfall, state.floor_shortfall),
            (&self.contended, state.contended.map(flag)),
            (
                &self.latency_threshold,
                state.latency_threshold_us.map(|us| us / 1e6),
            ),
            (
                &self.target_in_reach,
                state.latency_target_in_reach.map(flag),
            ),
        ] {
            set_or_remove(family, &l, value);
        }
        self.tenants.get_or_create(&l).set(tenants as f64);
    }
}

/// The control loop's own series: how long its intervals took, how late
/// they started and how many ran.
struct TickSeries {
    decision: Histogram,
    duration: Histogram,
    lateness: Histogram,
    overruns: Counter,
    early: Counter,
    ticks: Counter,
}

impl Default for TickSeries {
    fn default() -> TickSeries {
        TickSeries {
            decision: Histogram::new(exponential_buckets(1e-6, 4.0, 10)),
            // 10 µs .. 2.6 s: a tick of 100 tenants takes about a millisecond.
            duration: Histogram::new(exponential_buckets(1e-5, 2.0, 19)),
            lateness: Histogram::new(exponential_buckets(1e-5, 2.0, 19)),
            overruns: Counter::default(),
            early: Counter::default(),
            ticks: Counter::default(),
        }
    }
}

impl TickSeries {
    fn register(&self, r: &mut Registry) {
        r.register(
            "iofloor_decision_duration_seconds",
            "Time the policy took to decide",
            self.decision.clone(),
        );
        r.register(
            "iofloor_tick_duration_seconds",
            "Time a whole control interval took: reading counters, deciding, writing caps, publishing",
            self.duration.clone(),
        );
        r.register(
            "iofloor_tick_lateness_seconds",
            "How late a control interval started after its scheduled time (API changes handled first, a busy machine)",
            self.lateness.clone(),
        );
        r.register(
            "iofloor_interval_overruns",
            "Intervals that started late because the last one ran long",
            self.overruns.clone(),
        );
        r.register("iofloor_ticks", "Control intervals run", self.ticks.clone());
        r.register(
            "iofloor_early_ticks",
            "Control intervals cut short because a look at a device between intervals saw an overload (`watch_interval`)",
            self.early.clone(),
        );
    }

    fn observe(&self, timing: &crate::view::TickTiming, overrun: bool) {
        self.ticks.inc();
        self.decision.observe(timing.decision.as_secs_f64());
        self.duration.observe(timing.duration.as_secs_f64());
        self.lateness.observe(timing.lateness.as_secs_f64());
        if overrun {
            self.overruns.inc();
        }
        if timing.early {
            self.early.inc();
        }
    }
}

/// Cluster mode's series: this agent's place in the cluster, per shared
/// device.
#[derive(Default)]
struct ClusterSeries {
    allocator: Family<ClusterLabels, GaugeF>,
    connected: Family<ClusterLabels, GaugeF>,
    hosts: Family<ClusterLabels, GaugeF>,
    quiet_hosts: Family<ClusterLabels, GaugeF>,
    allocation_age: Family<ClusterLabels, GaugeF>,
    leases_lost: Family<ClusterLabels, GaugeF>,
    mode: Family<ClusterModeLabels, GaugeF>,
}

impl ClusterSeries {
    fn register(&self, r: &mut Registry) {
        r.register(
            "iofloor_cluster_allocator",
            "1 if this host is the cluster's allocator for the shared device",
            self.allocator.clone(),
        );
        r.register(
            "iofloor_cluster_connected",
            "1 if etcd answered in the last interval",
            self.connected.clone(),
        );
        r.register(
            "iofloor_cluster_hosts",
            "Hosts whose agents hold a claim in etcd",
            self.hosts.clone(),
        );
        r.register(
            "iofloor_cluster_quiet_hosts",
            "On the allocator: hosts gone quiet with their caps in force, whose last load it counts",
            self.quiet_hosts.clone(),
        );
        r.register(
            "iofloor_cluster_allocation_age_seconds",
            "Age of the allocation in force, by this host's clock",
            self.allocation_age.clone(),
        );
        r.register(
            "iofloor_cluster_leases_lost",
            "Times this agent lost its lease and rejoined",
            self.leases_lost.clone(),
        );
        r.register(
            "iofloor_cluster_mode",
            "1 for how the shared device's caps were chosen (allocated, starting, fallback)",
            self.mode.clone(),
        );
    }

    fn update(&self, c: &crate::view::ClusterView) {
        let l = ClusterLabels {
            cluster: c.cluster.clone(),
            device: c.device.clone(),
        };
        self.allocator
            .get_or_create(&l)
            .set(flag(c.role == "allocator"));
        self.connected.get_or_create(&l).set(flag(c.connected));
        self.hosts.get_or_create(&l).set(c.hosts.len() as f64);
        self.quiet_hosts
            .get_or_create(&l)
            .set(c.ghosts.len() as f64);
        self.leases_lost.get_or_create(&l).set(c.leases_lost as f64);
        set_or_remove(&self.allocation_age, &l, c.allocation_age_s);
        // Every mode has a series, 0 for the ones not in force, so a change
        // of mode shows as one series falling and another rising.
        for mode in ["allocated", "starting", "fallback"] {
            self.mode
                .get_or_create(&ClusterModeLabels {
                    cluster: c.cluster.clone(),
                    device: c.device.clone(),
                    mode: mode.into(),
                })
                .set(flag(c.mode.as_deref() == Some(mode)));
        }
    }
}

/// Every series the daemon exports, and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    tenants: TenantSeries,
    devices: DeviceSeries,
    ticks: TickSeries,
    reloads: Family<ReloadLabels, Counter>,
    cluster: ClusterSeries,
}

impl Metrics {
    /// Every metric carries `host`: the cluster's host name in cluster
    /// mode, else the machine's hostname. Prometheus' `instance` names the
    /// scrape target, which is not the host when agents are scraped through
    /// a proxy or several share an address; `host` says whose tenants these
    /// are when a cluster's series are put together.
    pub fn new(host: &str) -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_labels(std::iter::once((
                std::borrow::Cow::Borrowed("host"),
                std::borrow::Cow::Owned(host.to_string()),
            ))),
            tenants: TenantSeries::default(),
            devices: DeviceSeries::default(),
            ticks: TickSeries::default(),
            reloads: Family::default(),
            cluster: ClusterSeries::default(),
        };
        // Registration order is the order of the `/metrics` text.
        let r = &mut m.registry;
        m.tenants.register(r);
        m.devices.register(r);
        m.ticks.register(r);
        r.register(
            "iofloor_config_reloads",
            "Config reloads, by result",
            m.reloads.clone(),
        );
        m.cluster.register(r);
        m
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// The classic Prometheus text format (0.0.4), for scrapers and tools
    /// that do not negotiate OpenMetrics (`promtool check metrics` among
    /// them). Hand-written because prometheus-client only emits OpenMetrics;
    /// the two differ only in counter family names (OpenMetrics names the
    /// family without `_total`, the classic format names it as its samples)
    /// and in the closing `# EOF`.
    pub fn encode_classic(&self) -> String {
        classic_from_openmetrics(&self.encode())
    }

    /// Updates a tenant's series after an interval; `throttled_for` is how
    /// long of it the tenant had a cap in force.
    pub fn tenant(&self, t: &TenantView, throttled_for: f64) {
        self.tenants.update(t, throttled_for);
    }

    /// Removes every series of a tenant that went away.
    pub fn forget_tenant(&self, t: &TenantView) {
        self.tenants.forget(t);
    }

    pub fn device(&self, state: &crate::view::DeviceState, tenants: usize) {
        self.devices.update(state, tenants);
    }

    /// Cluster mode: this agent's place in the cluster.
    pub fn cluster(&self, c: &crate::view::ClusterView) {
        self.cluster.update(c);
    }

    pub fn tick(&self, timing: &crate::view::TickTiming, overrun: bool) {
        self.ticks.observe(timing, overrun);
    }

    pub fn reload(&self, ok: bool) {
        self.reloads
            .get_or_create(&ReloadLabels {
                result: if ok { "ok" } else { "refused" }.into(),
            })
            .inc();
    }
}

fn classic_from_openmetrics(text: &str) -> String {
    let counters: std::collections::HashSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_text_names_counter_families_as_their_samples() {
        let m = Metrics::new("h1");
        m.tick(
            &crate::view::TickTiming {
                decision: std::time::Duration::from_millis(1),
                ..Default::default()
            },
            true,
        );
        let classic = m.encode_classic();
        assert!(
            classic.contains(
                "# TYPE iofloor_ticks_total counter\niofloor_ticks_total{host=\"h1\"} 1\n"
            ),
            "{classic}"
        );
        assert!(
            classic.contains("# HELP iofloor_interval_overruns_total "),
            "{classic}"
        );
        assert!(
            classic.contains("# TYPE iofloor_decision_duration_seconds histogram"),
            "{classic}"
        );
        assert!(!classic.contains("# EOF"));
        assert!(m.encode().ends_with("# EOF\n"));
    }

    #[test]
    fn the_latency_threshold_in_force_is_shown_while_there_is_one() {
        let m = Metrics::new("h1");
        let mut state = crate::view::DeviceState {
            device: "7:0".into(),
            path: "/dev/loop0".into(),
            utilisation: Some(0.5),
            avg_queue: Some(0.9),
            capacity_estimate: Some(1.0),
            latency_us: Some(6_300.0),
            floors_feasible: Some(true),
            floor_shortfall: Some(0.0),
            latency_threshold_us: Some(7_875.0),
            latency_target_in_reach: Some(false),
            contended: Some(true),
            capacity_step: None,
            capacity_curve: Vec::new(),
        };
        m.device(&state, 3);
        let text = m.encode();
        assert!(
            text.contains("iofloor_device_latency_threshold_seconds{"),
            "{text}"
        );
        assert!(text.contains("} 0.007875\n"), "{text}");
        assert!(
            text.contains(
                "iofloor_device_latency_target_in_reach{host=\"h1\",device=\"7:0\"} 0.0\n"
            ),
            "{text}"
        );
        state.latency_threshold_us = None;
        m.device(&state, 3);
        let text = m.encode();
        assert!(
            !text.contains("iofloor_device_latency_threshold_seconds{"),
            "a threshold gone is no stale series: {text}"
        );
    }
}
