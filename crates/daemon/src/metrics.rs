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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FloorLabels {
    tenant: String,
    device: String,
    class: String,
    unit: String,
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

pub struct Metrics {
    registry: Registry,
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
    utilisation: Family<DeviceLabels, GaugeF>,
    queue: Family<DeviceLabels, GaugeF>,
    capacity: Family<DeviceLabels, GaugeF>,
    device_latency: Family<DeviceLabels, GaugeF>,
    floors_feasible: Family<DeviceLabels, GaugeF>,
    contended: Family<DeviceLabels, GaugeF>,
    floor_shortfall: Family<DeviceLabels, GaugeF>,
    latency_threshold: Family<DeviceLabels, GaugeF>,
    tenants: Family<DeviceLabels, GaugeF>,
    decision: Histogram,
    tick_duration: Histogram,
    tick_lateness: Histogram,
    overruns: Counter,
    early_ticks: Counter,
    ticks: Counter,
    reloads: Family<ReloadLabels, Counter>,
    cluster_allocator: Family<ClusterLabels, GaugeF>,
    cluster_connected: Family<ClusterLabels, GaugeF>,
    cluster_hosts: Family<ClusterLabels, GaugeF>,
    cluster_quiet_hosts: Family<ClusterLabels, GaugeF>,
    cluster_allocation_age: Family<ClusterLabels, GaugeF>,
    cluster_leases_lost: Family<ClusterLabels, GaugeF>,
    cluster_mode: Family<ClusterModeLabels, GaugeF>,
}

fn unit_label(r: Rate) -> &'static str {
    match r {
        Rate::Iops(_) => "iops",
        Rate::BytesPerSec(_) => "bytes_per_second",
        Rate::Cost(_) => "cost",
    }
}

impl Metrics {
    /// Every metric carries `host`: the cluster's host name in cluster
    /// mode, else the machine's hostname. Prometheus' `instance` names the
    /// scrape target, which is not the host when agents are scraped through
    /// a proxy or several share an address; `host` says whose tenants these
    /// are when a cluster's series are put together.
    pub fn new(host: &str) -> Metrics {
        let mut m = Metrics {
            iops: Family::default(),
            bytes: Family::default(),
            cost: Family::default(),
            latency: Family::default(),
            floor: Family::default(),
            floor_met: Family::default(),
            cap_iops: Family::default(),
            cap_bytes: Family::default(),
            throttled: Family::default(),
            available: Family::default(),
            utilisation: Family::default(),
            queue: Family::default(),
            capacity: Family::default(),
            device_latency: Family::default(),
            floors_feasible: Family::default(),
            contended: Family::default(),
            floor_shortfall: Family::default(),
            latency_threshold: Family::default(),
            tenants: Family::default(),
            decision: Histogram::new(exponential_buckets(1e-6, 4.0, 10)),
            // 10 µs .. 2.6 s: a tick of 100 tenants takes about a millisecond.
            tick_duration: Histogram::new(exponential_buckets(1e-5, 2.0, 19)),
            tick_lateness: Histogram::new(exponential_buckets(1e-5, 2.0, 19)),
            overruns: Counter::default(),
            early_ticks: Counter::default(),
            ticks: Counter::default(),
            reloads: Family::default(),
            cluster_allocator: Family::default(),
            cluster_connected: Family::default(),
            cluster_hosts: Family::default(),
            cluster_quiet_hosts: Family::default(),
            cluster_allocation_age: Family::default(),
            cluster_leases_lost: Family::default(),
            cluster_mode: Family::default(),
            registry: Registry::with_labels(std::iter::once((
                std::borrow::Cow::Borrowed("host"),
                std::borrow::Cow::Owned(host.to_string()),
            ))),
        };
        let r = &mut m.registry;
        r.register(
            "iofloor_tenant_iops",
            "I/O operations per second over the last interval",
            m.iops.clone(),
        );
        r.register(
            "iofloor_tenant_bytes_per_second",
            "Bytes per second over the last interval",
            m.bytes.clone(),
        );
        r.register(
            "iofloor_tenant_cost_ratio",
            "Share of the device's capacity used (cost model)",
            m.cost.clone(),
        );
        r.register(
            "iofloor_tenant_latency_seconds",
            "Mean completion latency, where the backend reports it",
            m.latency.clone(),
        );
        r.register(
            "iofloor_tenant_floor",
            "The tenant's floor, in the unit of the `unit` label",
            m.floor.clone(),
        );
        r.register(
            "iofloor_tenant_floor_met",
            "1 if the floor was met over the last interval (docs/config.md)",
            m.floor_met.clone(),
        );
        r.register(
            "iofloor_tenant_cap_iops",
            "IOPS cap in force (absent when none)",
            m.cap_iops.clone(),
        );
        r.register(
            "iofloor_tenant_cap_bytes_per_second",
            "Bandwidth cap in force (absent when none)",
            m.cap_bytes.clone(),
        );
        r.register(
            "iofloor_tenant_throttled_seconds",
            "Seconds the tenant had a cap in force",
            m.throttled.clone(),
        );
        r.register(
            "iofloor_tenant_available",
            "1 if the tenant's counters could be read this interval",
            m.available.clone(),
        );
        r.register(
            "iofloor_device_utilisation_ratio",
            "Share of the interval the device had I/O in flight",
            m.utilisation.clone(),
        );
        r.register(
            "iofloor_device_queue_depth",
            "Mean number of I/Os in flight",
            m.queue.clone(),
        );
        r.register(
            "iofloor_device_capacity_estimate_cost",
            "Capacity the policy believes the device has, in cost units per second",
            m.capacity.clone(),
        );
        r.register(
            "iofloor_device_latency_seconds",
            "Mean time an I/O spent at the device (diskstats, Little's law)",
            m.device_latency.clone(),
        );
        r.register(
            "iofloor_device_floors_feasible",
            "1 if the active tenants' floors fit the learned capacity; 0 while every entitlement is scaled down",
            m.floors_feasible.clone(),
        );
        r.register(
            "iofloor_device_contended",
            "1 if the policy judged the device contended over the last interval: the verdict each tenant's floor_met was judged with",
            m.contended.clone(),
        );
        r.register(
            "iofloor_device_floor_shortfall_cost",
            "How much the active floors exceed what can be handed out, in cost units per second",
            m.floor_shortfall.clone(),
        );
        r.register(
            "iofloor_device_latency_threshold_seconds",
            "Mean device latency above which the policy counts the device as overloaded: latency_target, raised to 1.25 x the device's service time when below it, or the automatic threshold",
            m.latency_threshold.clone(),
        );
        r.register(
            "iofloor_tenants",
            "Tenants under control",
            m.tenants.clone(),
        );
        r.register(
            "iofloor_decision_duration_seconds",
            "Time the policy took to decide",
            m.decision.clone(),
        );
        r.register(
            "iofloor_tick_duration_seconds",
            "Time a whole control interval took: reading counters, deciding, writing caps, publishing",
            m.tick_duration.clone(),
        );
        r.register(
            "iofloor_tick_lateness_seconds",
            "How late a control interval started after its scheduled time (API changes handled first, a busy machine)",
            m.tick_lateness.clone(),
        );
        r.register(
            "iofloor_interval_overruns",
            "Intervals that started late because the last one ran long",
            m.overruns.clone(),
        );
        r.register("iofloor_ticks", "Control intervals run", m.ticks.clone());
        r.register(
            "iofloor_early_ticks",
            "Control intervals cut short because a look at a device between intervals saw an overload (`watch_interval`)",
            m.early_ticks.clone(),
        );
        r.register(
            "iofloor_config_reloads",
            "Config reloads, by result",
            m.reloads.clone(),
        );
        r.register(
            "iofloor_cluster_allocator",
            "1 if this host is the cluster's allocator for the shared device",
            m.cluster_allocator.clone(),
        );
        r.register(
            "iofloor_cluster_connected",
            "1 if etcd answered in the last interval",
            m.cluster_connected.clone(),
        );
        r.register(
            "iofloor_cluster_hosts",
            "Hosts whose agents hold a claim in etcd",
            m.cluster_hosts.clone(),
        );
        r.register(
            "iofloor_cluster_quiet_hosts",
            "On the allocator: hosts gone quiet with their caps in force, whose last load it counts",
            m.cluster_quiet_hosts.clone(),
        );
        r.register(
            "iofloor_cluster_allocation_age_seconds",
            "Age of the allocation in force, by this host's clock",
            m.cluster_allocation_age.clone(),
        );
        r.register(
            "iofloor_cluster_leases_lost",
            "Times this agent lost its lease and rejoined",
            m.cluster_leases_lost.clone(),
        );
        r.register(
            "iofloor_cluster_mode",
            "1 for how the shared device's caps were chosen (allocated, starting, fallback)",
            m.cluster_mode.clone(),
        );
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

    fn labels(t: &TenantView) -> TenantLabels {
        TenantLabels {
            tenant: t.name.clone(),
            device: t.device.clone(),
            class: t.class.as_str().to_string(),
        }
    }

    fn dir(l: &TenantLabels, direction: DirectionLabel) -> DirLabels {
        DirLabels {
            tenant: l.tenant.clone(),
            device: l.device.clone(),
            class: l.class.clone(),
            direction,
        }
    }

    /// Updates a tenant's series after an interval; `dt` is the interval's length.
    pub fn tenant(&self, t: &TenantView, throttled_for: f64) {
        let l = Self::labels(t);
        let (r, w) = (
            Self::dir(&l, DirectionLabel::read),
            Self::dir(&l, DirectionLabel::write),
        );
        self.available
            .get_or_create(&l)
            .set(if t.available { 1.0 } else { 0.0 });
        if let Some(u) = &t.usage {
            self.iops.get_or_create(&r).set(u.read_iops);
            self.iops.get_or_create(&w).set(u.write_iops);
            self.bytes.get_or_create(&r).set(u.read_bytes_per_sec);
            self.bytes.get_or_create(&w).set(u.write_bytes_per_sec);
            self.cost.get_or_create(&l).set(u.cost);
            match u.latency_us {
                Some(us) => {
                    self.latency.get_or_create(&l).set(us / 1e6);
                }
                None => {
                    self.latency.remove(&l);
                }
            }
        }
        self.remove_floor(&l);
        if let Some(f) = t.floor {
            let fl = FloorLabels {
                tenant: l.tenant.clone(),
                device: l.device.clone(),
                class: l.class.clone(),
                unit: unit_label(f).into(),
            };
            self.floor.get_or_create(&fl).set(f.value());
        }
        match t.floor_met {
            Some(met) => {
                self.floor_met
                    .get_or_create(&l)
                    .set(if met { 1.0 } else { 0.0 });
            }
            None => {
                self.floor_met.remove(&l);
            }
        }
        for (labels, iops, bps) in [
            (&r, t.caps.read_iops, t.caps.read_bps),
            (&w, t.caps.write_iops, t.caps.write_bps),
        ] {
            match iops {
                Some(v) => {
                    self.cap_iops.get_or_create(labels).set(v);
                }
                None => {
                    self.cap_iops.remove(labels);
                }
            }
            match bps {
                Some(v) => {
                    self.cap_bytes.get_or_create(labels).set(v);
                }
                None => {
                    self.cap_bytes.remove(labels);
                }
            }
        }
        self.throttled.get_or_create(&l).inc_by(throttled_for);
    }

    fn remove_floor(&self, l: &TenantLabels) {
        for unit in ["iops", "bytes_per_second", "cost"] {
            self.floor.remove(&FloorLabels {
                tenant: l.tenant.clone(),
                device: l.device.clone(),
                class: l.class.clone(),
                unit: unit.into(),
            });
        }
    }

    /// Removes every series of a tenant that went away.
    pub fn forget_tenant(&self, t: &TenantView) {
        let l = Self::labels(t);
        for d in [DirectionLabel::read, DirectionLabel::write] {
            let dl = Self::dir(&l, d);
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

    pub fn device(&self, state: &crate::view::DeviceState, tenants: usize) {
        let l = DeviceLabels {
            device: state.device.clone(),
        };
        for (family, value) in [
            (&self.utilisation, state.utilisation),
            (&self.queue, state.avg_queue),
            (&self.capacity, state.capacity_estimate),
            (&self.device_latency, state.latency_us.map(|us| us / 1e6)),
            (
                &self.floors_feasible,
                state.floors_feasible.map(|f| if f { 1.0 } else { 0.0 }),
            ),
            (&self.floor_shortfall, state.floor_shortfall),
            (
                &self.contended,
                state.contended.map(|c| if c { 1.0 } else { 0.0 }),
            ),
            (
                &self.latency_threshold,
                state.latency_threshold_us.map(|us| us / 1e6),
            ),
        ] {
            match value {
                Some(v) => {
                    family.get_or_create(&l).set(v);
                }
                None => {
                    family.remove(&l);
                }
            }
        }
        self.tenants.get_or_create(&l).set(tenants as f64);
    }

    /// Cluster mode: this agent's place in the cluster.
    pub fn cluster(&self, c: &crate::view::ClusterView) {
        let l = ClusterLabels {
            cluster: c.cluster.clone(),
            device: c.device.clone(),
        };
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        self.cluster_allocator
            .get_or_create(&l)
            .set(flag(c.role == "allocator"));
        self.cluster_connected
            .get_or_create(&l)
            .set(flag(c.connected));
        self.cluster_hosts
            .get_or_create(&l)
            .set(c.hosts.len() as f64);
        self.cluster_quiet_hosts
            .get_or_create(&l)
            .set(c.ghosts.len() as f64);
        self.cluster_leases_lost
            .get_or_create(&l)
            .set(c.leases_lost as f64);
        match c.allocation_age_s {
            Some(age) => {
                self.cluster_allocation_age.get_or_create(&l).set(age);
            }
            None => {
                self.cluster_allocation_age.remove(&l);
            }
        }
        for mode in ["allocated", "starting", "fallback"] {
            self.cluster_mode
                .get_or_create(&ClusterModeLabels {
                    cluster: c.cluster.clone(),
                    device: c.device.clone(),
                    mode: mode.into(),
                })
                .set(flag(c.mode.as_deref() == Some(mode)));
        }
    }

    pub fn tick(&self, timing: &crate::service::TickTiming, overrun: bool) {
        self.ticks.inc();
        self.decision.observe(timing.decision.as_secs_f64());
        self.tick_duration.observe(timing.duration.as_secs_f64());
        self.tick_lateness.observe(timing.lateness.as_secs_f64());
        if overrun {
            self.overruns.inc();
        }
        if timing.early {
            self.early_ticks.inc();
        }
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
            &crate::service::TickTiming {
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
        };
        m.device(&state, 3);
        let text = m.encode();
        assert!(
            text.contains("iofloor_device_latency_threshold_seconds{"),
            "{text}"
        );
        assert!(text.contains("} 0.007875\n"), "{text}");
        state.latency_threshold_us = None;
        m.device(&state, 3);
        let text = m.encode();
        assert!(
            !text.contains("iofloor_device_latency_threshold_seconds{"),
            "a threshold gone is no stale series: {text}"
        );
    }
}
