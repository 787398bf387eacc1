//! The allocator: one core policy over the union of every host's tenants of
//! a shared device. Each host's report becomes samples of one snapshot
//! (tenant names qualified by host, so two hosts' `web` stay two tenants to
//! the policy's memory), the hosts' views of the device add up to the
//! device's, and the decisions go back out as one [`Allocation`] per host.
//! Pure: reports and the time in, allocations out.

use crate::wire::{Allocation, HostReport, SCHEMA};
use iofloor_core::{
    build_policy, DeviceSample, Policy, PolicyContext, PolicyKind, PolicyParams, Snapshot,
    TenantSample, TenantSpec,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// A tenant name reported by two hosts with different promises. Both stay
/// separate tenants with their own host's promise; the operator is told,
/// because a floor meant once for the cluster is now granted twice.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflict {
    pub tenant: String,
    pub hosts: Vec<String>,
}

/// What one allocation round produced.
#[derive(Debug, Clone)]
pub struct Round {
    pub allocations: Vec<Allocation>,
    pub conflicts: Vec<Conflict>,
    /// The capacity the policy believes in and what the active floors cost
    /// (cost units per second), for admission and metrics.
    pub capacity: f64,
    pub floors: f64,
}

pub struct Allocator {
    device: String,
    policy: Box<dyn Policy>,
    epoch: i64,
    seq: u64,
}

/// The qualified name a host's tenant has in the allocator's snapshot.
fn qualified(host: &str, tenant: &str) -> String {
    format!("{host}/{tenant}")
}

/// A host whose share of the device's completions is below this gives too
/// few I/Os for its latency to say anything about the device.
const LATENCY_WITNESS_SHARE: f64 = 0.05;

/// The shared device as the hosts together see it. Completions add up, and
/// the device is at least as busy as the busiest host. Latency does not add
/// up: each host's latency is the shared device's wait plus what its own
/// initiator queues (an NBD client keeps at most 16 requests in flight, an
/// iSCSI session its queue depth; the rest wait on the host). That local
/// part is the host's own doing and no cap on another host shortens it, so
/// the device's latency is the shortest any host with a fair share of the
/// I/O sees, and its queue follows by Little's law. Measured on the
/// `cluster up` test bed: a noisy host at 8 × QD4 saw 6–11 ms while the
/// quiet host at QD1 saw 1.5 ms on the same device; the mean of the two
/// kept a 3 ms latency target missed, and the learned capacity fell until
/// the noisy tenant got 14 IOPS of a 4,000-IOPS device.
pub fn merge_device(samples: impl IntoIterator<Item = DeviceSample>) -> Option<DeviceSample> {
    let samples: Vec<DeviceSample> = samples.into_iter().collect();
    let first = samples.first()?;
    let iops: f64 = samples.iter().map(|s| s.iops).sum();
    let utilisation = samples
        .iter()
        .map(|s| s.utilisation)
        .fold(first.utilisation, f64::max);
    let shared_latency_us = samples
        .iter()
        .filter(|s| s.iops >= LATENCY_WITNESS_SHARE * iops)
        .filter_map(DeviceSample::mean_latency_us)
        .reduce(f64::min);
    let avg_queue = match shared_latency_us {
        Some(l) => l * 1e-6 * iops,
        None => samples.iter().map(|s| s.avg_queue).sum(),
    };
    Some(DeviceSample {
        utilisation,
        avg_queue,
        iops,
    })
}

impl Allocator {
    /// An allocator for `epoch` (its election key's create revision). A new
    /// allocator resumes from the capacity the previous one had learned
    /// (`resumed`, read from the last allocation) as its level last known
    /// good, rather than the model's; `ctx` keeps the model's capacity, so
    /// the learned capacity's bounds stay where they were.
    pub fn new(
        device: impl Into<String>,
        kind: PolicyKind,
        params: &PolicyParams,
        ctx: PolicyContext,
        resumed: Option<f64>,
        epoch: i64,
    ) -> Allocator {
        let mut policy = build_policy(kind, params, ctx);
        if let Some(capacity) = resumed.filter(|c| c.is_finite() && *c > 0.0) {
            policy.resume_capacity(capacity);
        }
        Allocator {
            device: device.into(),
            policy,
            epoch,
            seq: 0,
        }
    }

    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// One round over the reports of this device's hosts (others are
    /// ignored). Every reporting host gets an allocation, also one without
    /// tenants, so it knows the allocator is alive.
    pub fn allocate(&mut self, now: Duration, reports: &[HostReport]) -> Round {
        let mut reports: Vec<&HostReport> =
            reports.iter().filter(|r| r.device == self.device).collect();
        reports.sort_by(|a, b| a.host.cmp(&b.host));
        reports.dedup_by(|a, b| a.host == b.host);

        let mut samples = Vec::new();
        let mut owners = Vec::new();
        let mut promises: BTreeMap<&str, Vec<(&str, &TenantSpec)>> = BTreeMap::new();
        for r in &reports {
            for t in &r.tenants {
                promises
                    .entry(t.spec.name.as_str())
                    .or_default()
                    .push((r.host.as_str(), &t.spec));
                let mut spec = t.spec.clone();
                spec.name = qualified(&r.host, &t.spec.name);
                samples.push(TenantSample {
                    spec: Arc::new(spec),
                    usage: t.usage,
                    caps: t.caps,
                });
                owners.push((r.host.as_str(), t.spec.name.as_str()));
            }
        }
        let conflicts = promises
            .into_iter()
            .filter(|(_, specs)| {
                specs.windows(2).any(|w| {
                    let (a, b) = (w[0].1, w[1].1);
                    a.floor != b.floor || a.ceiling != b.ceiling || a.weight != b.weight
                })
            })
            .map(|(tenant, specs)| Conflict {
                tenant: tenant.to_string(),
                hosts: specs.iter().map(|(h, _)| h.to_string()).collect(),
            })
            .collect();

        let interval = reports
            .iter()
            .map(|r| r.interval_s)
            .filter(|s| s.is_finite() && *s > 0.0)
            .fold(0.0, f64::max);
        let snapshot = Snapshot {
            now,
            // Reports are checked when read; saturating keeps a report made
            // in memory by a caller from panicking here.
            interval: Duration::try_from_secs_f64(interval).unwrap_or(Duration::MAX),
            device: merge_device(reports.iter().filter_map(|r| r.local_device)),
            tenants: &samples,
        };
        let caps = self.policy.decide(&snapshot);
        self.seq += 1;

        let feasibility = self.policy.feasibility();
        let capacity = self
            .policy
            .capacity_estimate()
            .or(feasibility.map(|f| f.capacity))
            .unwrap_or(1.0);
        let floors = feasibility.map(|f| f.floors).unwrap_or(0.0);
        let allocations = reports
            .iter()
            .map(|r| Allocation {
                schema: SCHEMA,
                host: r.host.clone(),
                device: self.device.clone(),
                epoch: self.epoch,
                seq: self.seq,
                interval_s: interval,
                capacity,
                floors,
                hosts: reports.len(),
                caps: owners
                    .iter()
                    .zip(&caps)
                    .filter(|((host, _), _)| *host == r.host)
                    .map(|((_, tenant), caps)| (tenant.to_string(), *caps))
                    .collect(),
            })
            .collect();
        Round {
            allocations,
            conflicts,
            capacity,
            floors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::TenantReport;
    use iofloor_core::{Caps, Rate, TenantClass};

    pub(crate) fn ctx() -> PolicyContext {
        // 4,000 IOPS of 4 KiB random reads fill the device.
        PolicyContext {
            cost: iofloor_core::synthetic::iops_only_model(4000.0),
            capacity: 1.0,
        }
    }

    use iofloor_core::synthetic::random_reads_4k as reads;

    fn tenant(name: &str, floor: Option<f64>, iops: f64, caps: Caps) -> TenantReport {
        let mut spec = TenantSpec::new(name, TenantClass::Container);
        spec.floor = floor.map(Rate::Iops);
        TenantReport {
            spec,
            usage: Some(reads(iops)),
            caps,
        }
    }

    fn report(host: &str, tenants: Vec<TenantReport>, queue: f64) -> HostReport {
        let iops = tenants
            .iter()
            .map(|t| t.usage.map(|u| u.read.ios).unwrap_or(0.0))
            .sum();
        HostReport {
            schema: SCHEMA,
            host: host.into(),
            device: "shared".into(),
            seq: 1,
            interval_s: 1.0,
            local_device: Some(DeviceSample {
                utilisation: 1.0,
                avg_queue: queue,
                iops,
            }),
            tenants,
        }
    }

    #[test]
    fn completions_add_up_and_latency_is_the_shortest_a_busy_host_sees() {
        let host = |utilisation, avg_queue, iops| DeviceSample {
            utilisation,
            avg_queue,
            iops,
        };
        // h1 at QD1: 1,000 IOPS at 1 ms; h2 queues 20 on its own side: 10 ms.
        let d = merge_device([host(0.5, 1.0, 1000.0), host(0.9, 20.0, 2000.0)]).unwrap();
        assert_eq!(d.utilisation, 0.9);
        assert_eq!(d.iops, 3000.0);
        assert!(
            (d.mean_latency_us().unwrap() - 1000.0).abs() < 1e-6,
            "{d:?}"
        );
        // A host with 1 % of the I/O is no witness: its 0.1 ms is not the device's.
        let d = merge_device([host(0.1, 0.003, 30.0), host(0.9, 6.0, 2970.0)]).unwrap();
        assert!((d.mean_latency_us().unwrap() - 2020.2).abs() < 0.1, "{d:?}");
        // No completions anywhere: queues add up.
        let d = merge_device([host(0.0, 1.0, 0.0), host(0.0, 2.0, 0.0)]).unwrap();
        assert_eq!(d.avg_queue, 3.0);
        assert_eq!(merge_device([]), None);
    }

    /// A noisy tenant on h2 that fills the device is held so that the
    /// protected tenants on h1 and h3 get their floors: the decision the
    /// single-host policy makes, taken over all three hosts.
    #[test]
    fn a_noisy_tenant_on_one_host_is_held_for_floors_on_the_others() {
        let mut a = Allocator::new(
            "shared",
            PolicyKind::Floor,
            &PolicyParams::default(),
            ctx(),
            None,
            5,
        );
        let mut last = None;
        for step in 0..6 {
            let reports = vec![
                report(
                    "h1",
                    vec![tenant("db", Some(1000.0), 300.0, Caps::NONE)],
                    1.0,
                ),
                report("h2", vec![tenant("batch", None, 3700.0, Caps::NONE)], 30.0),
                report(
                    "h3",
                    vec![tenant("web", Some(750.0), 250.0, Caps::NONE)],
                    1.0,
                ),
                report("other", vec![], 0.0),
            ];
            let mut reports = reports;
            reports[3].device = "elsewhere".into();
            last = Some(a.allocate(Duration::from_secs(step + 1), &reports));
        }
        let round = last.unwrap();
        assert_eq!(
            round.allocations.len(),
            3,
            "the other device's host gets nothing"
        );
        let by_host = |h: &str| round.allocations.iter().find(|a| a.host == h).unwrap();
        let batch = by_host("h2").caps_of("batch").unwrap();
        let cap = batch.read_iops.expect("the noisy tenant is capped");
        assert!(
            cap <= 4000.0 * 0.97 - 1000.0 - 750.0 + 1.0,
            "batch may take only what the floors leave: {cap}"
        );
        for (h, t) in [("h1", "db"), ("h3", "web")] {
            let a = by_host(h);
            assert_eq!(a.epoch, 5);
            assert_eq!(a.seq, 6);
            assert_eq!(a.hosts, 3);
            assert_eq!(a.caps.len(), 1, "{h} gets its own tenant only");
            let c = a.caps_of(t).unwrap();
            assert!(c.read_iops.is_none_or(|v| v >= 750.0), "{t}: {c:?}");
        }
        assert!(round.floors > 0.0 && round.capacity > 0.0);
        assert!(round.conflicts.is_empty());
    }

    /// A new allocator carries on from the capacity the last allocation
    /// carried, not from the model's.
    #[test]
    fn a_resumed_allocator_starts_from_the_carried_capacity() {
        let reports = vec![report(
            "h1",
            vec![tenant("db", Some(1000.0), 300.0, Caps::NONE)],
            0.2,
        )];
        let round_of = |resumed| {
            let mut a = Allocator::new(
                "shared",
                PolicyKind::Floor,
                &PolicyParams::default(),
                ctx(),
                resumed,
                2,
            );
            a.allocate(Duration::from_secs(1), &reports).capacity
        };
        assert!((round_of(Some(0.7)) - 0.7).abs() < 1e-9);
        assert!((round_of(None) - 1.0).abs() < 1e-9);
        assert!(
            (round_of(Some(f64::NAN)) - 1.0).abs() < 1e-9,
            "garbage ignored"
        );
    }

    #[test]
    fn one_name_with_two_promises_is_reported_and_kept_apart() {
        let mut a = Allocator::new(
            "shared",
            PolicyKind::Floor,
            &PolicyParams::default(),
            ctx(),
            None,
            1,
        );
        let reports = vec![
            report(
                "h1",
                vec![tenant("db", Some(1000.0), 300.0, Caps::NONE)],
                1.0,
            ),
            report(
                "h2",
                vec![tenant("db", Some(500.0), 300.0, Caps::NONE)],
                1.0,
            ),
            report(
                "h3",
                vec![tenant("web", Some(500.0), 300.0, Caps::NONE)],
                1.0,
            ),
            report(
                "h4",
                vec![tenant("web", Some(500.0), 300.0, Caps::NONE)],
                1.0,
            ),
        ];
        let round = a.allocate(Duration::from_secs(1), &reports);
        assert_eq!(
            round.conflicts,
            vec![Conflict {
                tenant: "db".into(),
                hosts: vec!["h1".into(), "h2".into()]
            }],
            "the same promise on two hosts is no conflict"
        );
        assert!(round.allocations.iter().all(|a| a.caps.len() == 1));
    }
}
