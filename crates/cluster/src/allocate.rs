//! The allocator: one core policy over the union of every host's tenants of
//! a shared device. Each host's report becomes samples of one snapshot
//! (tenant names qualified by host, so two hosts' `web` stay two tenants to
//! the policy's memory), the hosts' views of the device add up to the
//! device's, and the decisions go back out as one [`Allocation`] per host.
//! Pure: reports and the time in, allocations out.

use crate::wire::{Allocation, HostReport, SCHEMA};
use iofloor_core::{
    build_policy, DeviceSample, Policy, PolicyContext, PolicyKind, PolicyParams, Snapshot,
    TenantSample, TenantSpec, Usage,
};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
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
    /// Hosts that hold an allocation but no longer report, whose last load
    /// this round counted as load it cannot cap.
    pub ghosts: Vec<Ghost>,
}

/// A host gone quiet with its caps in force: an agent killed (its tenants
/// run on at the caps it last wrote) or a host cut off from etcd (it runs
/// its fallback rule). Its report went with its lease, but its allocation
/// stays in etcd, and with it the load the host last reported. Uncounted,
/// that load is capacity the allocator cannot see: it learns a smaller
/// device and probes past it (simulated `noisy-20-cluster`: 0.28 of the
/// device frozen on the killed allocator's host, the new one settled at
/// 0.72 and overshot every ~35 s, a protected p99 of 4.9× alone).
#[derive(Debug, Clone, PartialEq)]
pub struct Ghost {
    pub host: String,
    /// Cost units per second.
    pub load: f64,
}

/// How long a quiet host's last load is counted when the operator sets no
/// `orphan_timeout`: until it reports again or its allocation is removed.
/// A killed agent's tenants run on at the caps it last wrote, as long as
/// nobody restarts it; forgotten after a fixed time (600 s, before), a
/// tenant still there lost its reservation and the noisy tenants elsewhere
/// were handed its share (issue 32: 43 % of windows missed after a 30 %
/// capacity cut). An operator who knows a host can leave without
/// deleting its allocation sets a timeout ([`Allocator::with_orphan_timeout`]).
pub const DEFAULT_ORPHAN_TIMEOUT: Option<Duration> = None;

/// A new allocator's first rounds judge reports made under caps it did not
/// set (a previous allocator's, or a host's fallback rule while there was
/// none), with no memory of its own: they never raise a cap above the one in
/// force. A host that fell back at the takeover held its noisy tenants below
/// their allocation; taken for a device with room, they were let go by half
/// again each, and their burst filled the queue for three windows (simulated
/// `noisy-20-cluster`). Two rounds: the second answers reports made under
/// the first's caps.
const SETTLING_ROUNDS: u64 = 2;

pub struct Allocator {
    device: String,
    policy: Box<dyn Policy>,
    cost: iofloor_core::CostModel,
    epoch: i64,
    seq: u64,
    /// When this allocator first saw each quiet host (its own time).
    quiet_since: BTreeMap<String, Duration>,
    /// How long a quiet host's last load is counted (`None`: until it
    /// reports again or its allocation is removed).
    orphan_timeout: Option<Duration>,
    /// Each reporting host's tenants as it last reported them and as the
    /// policy sees them (named `host/tenant`), kept while the host reports
    /// the same: the policy then meets the same specs round after round and
    /// keeps what it derives from them (its memories' order, the tree of
    /// groups), where specs made afresh every round were a third of a
    /// round at 1,000 hosts.
    specs: HashMap<String, HostSpecs>,
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
            cost: ctx.cost,
            epoch,
            seq: 0,
            quiet_since: BTreeMap::new(),
            specs: HashMap::new(),
            orphan_timeout: DEFAULT_ORPHAN_TIMEOUT,
        }
    }

    /// Counts a quiet host's last load for at most `timeout` (`None`: until
    /// it reports again or its allocation is removed).
    pub fn with_orphan_timeout(mut self, timeout: Option<Duration>) -> Allocator {
        self.orphan_timeout = timeout;
        self
    }

    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// What the policy's capacity loop made of the last round's device, if
    /// it learns capacity (for traces and status).
    pub fn capacity_step(&self) -> Option<iofloor_core::capacity::CapacityStep> {
        self.policy.capacity_step()
    }

    /// One round over the reports of this device's hosts (others are
    /// ignored). Every reporting host gets an allocation, also one without
    /// tenants, so it knows the allocator is alive. `standing` are the
    /// allocations etcd holds for the device: those of hosts that no longer
    /// report are counted as [`Ghost`]s.
    pub fn allocate(
        &mut self,
        now: Duration,
        reports: &[HostReport],
        standing: &[Allocation],
    ) -> Round {
        let mut reports: Vec<&HostReport> =
            reports.iter().filter(|r| r.device == self.device).collect();
        reports.sort_by(|a, b| a.host.cmp(&b.host));
        reports.dedup_by(|a, b| a.host == b.host);
        let ghosts = self.ghosts(now, &reports, standing);
        let (samples, spans) = self.every_tenant(&reports);
        let interval = reports
            .iter()
            .map(|r| r.interval_s)
            .filter(|s| s.is_finite() && *s > 0.0)
            .fold(0.0, f64::max);
        let foreign_load: f64 = ghosts.iter().map(|g| g.load).sum();
        let snapshot = Snapshot {
            now,
            // Reports are checked when read; saturating keeps a report made
            // in memory by a caller from panicking here.
            interval: Duration::try_from_secs_f64(interval).unwrap_or(Duration::MAX),
            device: self.device_seen(&reports, &samples, foreign_load),
            tenants: &samples,
            foreign_load,
        };
        let mut caps = self.policy.decide(&snapshot);
        let contended = self.policy.verdicts(&snapshot).contended;
        if self.seq < SETTLING_ROUNDS {
            for (decided, sample) in caps.iter_mut().zip(&samples) {
                *decided = decided.tighter(&sample.caps);
            }
        }
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
            .zip(spans)
            .map(|(r, span)| Allocation {
                schema: SCHEMA,
                host: r.host.clone(),
                device: self.device.clone(),
                epoch: self.epoch,
                seq: self.seq,
                interval_s: interval,
                capacity,
                floors,
                hosts: reports.len(),
                caps: r
                    .tenants
                    .iter()
                    .zip(&caps[span])
                    .map(|(t, caps)| (t.spec.name.clone(), *caps))
                    .collect(),
                load: self.load_of(r.tenants.iter().map(|t| &t.usage)),
                contended: Some(contended),
            })
            .collect();
        Round {
            allocations,
            conflicts: conflicts(&reports),
            capacity,
            floors,
            ghosts,
        }
    }

    /// Every reporting host's tenants as the policy sees them (named
    /// `host/tenant`), and where each report's tenants lie among them: the
    /// hosts' tenants one after another, so a host's allocation is its
    /// span of the decision (picked out by host among all tenants, 1,000
    /// hosts' allocations took 10⁸ comparisons a round).
    fn every_tenant(&mut self, reports: &[&HostReport]) -> (Vec<TenantSample>, Vec<Range<usize>>) {
        let reporting: HashSet<&str> = reports.iter().map(|r| r.host.as_str()).collect();
        self.specs
            .retain(|host, _| reporting.contains(host.as_str()));
        let mut samples = Vec::with_capacity(reports.iter().map(|r| r.tenants.len()).sum());
        let mut spans = Vec::with_capacity(reports.len());
        for r in reports {
            let known = match self.specs.entry(r.host.clone()) {
                Entry::Occupied(o) if o.get().still(r) => o.into_mut(),
                Entry::Occupied(mut o) => {
                    o.insert(HostSpecs::of(r));
                    o.into_mut()
                }
                Entry::Vacant(v) => v.insert(HostSpecs::of(r)),
            };
            let start = samples.len();
            samples.extend(
                r.tenants
                    .iter()
                    .zip(&known.qualified)
                    .map(|(t, spec)| TenantSample {
                        spec: spec.clone(),
                        usage: t.usage,
                        caps: t.caps,
                    }),
            );
            spans.push(start..samples.len());
        }
        (samples, spans)
    }

    /// The device as the reporting hosts saw it together, with the load of
    /// quiet hosts (`foreign_load`) added to its queue and throughput.
    fn device_seen(
        &self,
        reports: &[&HostReport],
        samples: &[TenantSample],
        foreign_load: f64,
    ) -> Option<DeviceSample> {
        let reported = self.load_of(samples.iter().map(|t| &t.usage));
        merge_device(reports.iter().filter_map(|r| r.local_device)).map(|mut d| {
            // The quiet hosts' I/O waits in the same queue as the reporting
            // hosts' but shows in none of their counters: by Little's law,
            // the device's queue is larger by its share of what is served.
            // Uncounted, a knee judged the device at 0.49 of it, clear room
            // to probe past the model, and every probe overshot (simulated
            // `noisy-20-cluster`, after the allocator's host was killed).
            if foreign_load > 0.0 && reported > 0.0 {
                let whole = (reported + foreign_load) / reported;
                d.avg_queue *= whole;
                d.iops *= whole;
            }
            d
        })
    }

    /// What tenants used, in cost units per second (those without a
    /// trustworthy sample count nothing).
    fn load_of<'a>(&self, usage: impl Iterator<Item = &'a Option<Usage>>) -> f64 {
        usage
            .flatten()
            .map(|u| self.cost.cost_rate(u))
            .filter(|c| c.is_finite())
            .sum()
    }

    /// The standing allocations of this device whose host does not report,
    /// quiet for less than the orphan timeout of this allocator's time.
    fn ghosts(
        &mut self,
        now: Duration,
        reports: &[&HostReport],
        standing: &[Allocation],
    ) -> Vec<Ghost> {
        let reporting: HashSet<&str> = reports.iter().map(|r| r.host.as_str()).collect();
        let quiet: Vec<&Allocation> = standing
            .iter()
            .filter(|a| a.device == self.device && a.load > 0.0)
            .filter(|a| !reporting.contains(a.host.as_str()))
            .collect();
        self.quiet_since
            .retain(|host, _| quiet.iter().any(|a| a.host == *host));
        let mut ghosts: Vec<Ghost> = quiet
            .into_iter()
            .filter(|a| {
                let since = *self.quiet_since.entry(a.host.clone()).or_insert(now);
                self.orphan_timeout
                    .is_none_or(|timeout| now.saturating_sub(since) < timeout)
            })
            .map(|a| Ghost {
                host: a.host.clone(),
                load: a.load,
            })
            .collect();
        ghosts.sort_by(|a, b| a.host.cmp(&b.host));
        ghosts.dedup_by(|a, b| a.host == b.host);
        ghosts
    }
}

/// A host's tenants as it reported them, and as the allocator's policy
/// sees them.
struct HostSpecs {
    reported: Vec<TenantSpec>,
    qualified: Vec<Arc<TenantSpec>>,
}

impl HostSpecs {
    fn of(report: &HostReport) -> HostSpecs {
        HostSpecs {
            reported: report.tenants.iter().map(|t| t.spec.clone()).collect(),
            qualified: report
                .tenants
                .iter()
                .map(|t| {
                    let mut spec = t.spec.clone();
                    spec.name = qualified(&report.host, &t.spec.name);
                    Arc::new(spec)
                })
                .collect(),
        }
    }

    fn still(&self, report: &HostReport) -> bool {
        self.reported.len() == report.tenants.len()
            && self
                .reported
                .iter()
                .zip(&report.tenants)
                .all(|(s, t)| *s == t.spec)
    }
}

/// Tenants that hosts promise differently (floor, ceiling or weight).
fn conflicts(reports: &[&HostReport]) -> Vec<Conflict> {
    // Only names on more than one host can conflict: those alone are
    // gathered in order, the first host's promise with them.
    let mut first: HashMap<&str, (&str, &TenantSpec)> = HashMap::new();
    let mut promises: BTreeMap<&str, Vec<(&str, &TenantSpec)>> = BTreeMap::new();
    for r in reports {
        for t in &r.tenants {
            let name = t.spec.name.as_str();
            let promise = (r.host.as_str(), &t.spec);
            match first.entry(name) {
                Entry::Vacant(v) => {
                    v.insert(promise);
                }
                Entry::Occupied(o) => promises
                    .entry(name)
                    .or_insert_with(|| vec![*o.get()])
                    .push(promise),
            }
        }
    }
    promises
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
        .collect()
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
            last = Some(a.allocate(Duration::from_secs(step + 1), &reports, &[]));
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
        // The device served 4,250 IOPS, past its model of 4,000.
        assert!(
            cap <= 4250.0 * 0.97 - 1000.0 - 750.0 + 1.0,
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
            a.allocate(Duration::from_secs(1), &reports, &[]).capacity
        };
        assert!((round_of(Some(0.7)) - 0.7).abs() < 1e-9);
        assert!((round_of(None) - 1.0).abs() < 1e-9);
        assert!(
            (round_of(Some(f64::NAN)) - 1.0).abs() < 1e-9,
            "garbage ignored"
        );
    }

    fn allocator() -> Allocator {
        Allocator::new(
            "shared",
            PolicyKind::Floor,
            &PolicyParams::default(),
            ctx(),
            None,
            1,
        )
    }

    /// h1 (a protected `db`, and `etl` at 900 IOPS held by its cap) goes
    /// quiet with its caps in force: etcd still holds its allocation, and
    /// with it its last load. The noisy `batch` on h2 is held to what h3's
    /// floor and that load leave, not to what the floor alone leaves; the
    /// quiet host stops counting once it reports again, never on its own by
    /// default (its tenants may run on at its caps), and after the
    /// operator's orphan timeout where one is set.
    #[test]
    fn a_host_gone_quiet_is_counted_at_its_last_load_until_it_reports_or_its_time_is_up() {
        let etl_cap = Caps {
            read_iops: Some(900.0),
            ..Caps::NONE
        };
        let h1 = report(
            "h1",
            vec![
                tenant("db", Some(800.0), 250.0, Caps::NONE),
                tenant("etl", None, 900.0, etl_cap),
            ],
            1.0,
        );
        let h2 = || report("h2", vec![tenant("batch", None, 3000.0, Caps::NONE)], 30.0);
        let h3 = || {
            report(
                "h3",
                vec![tenant("web", Some(750.0), 250.0, Caps::NONE)],
                1.0,
            )
        };
        let mut a = allocator();
        let mut standing = Vec::new();
        for step in 0..4 {
            let round = a.allocate(Duration::from_secs(step), &[h1.clone(), h2(), h3()], &[]);
            assert!(round.ghosts.is_empty());
            standing = round.allocations;
        }
        let load = standing.iter().find(|x| x.host == "h1").unwrap().load;
        assert!((load - 1150.0 / 4000.0).abs() < 1e-9, "{load}");
        let batch_cap = |round: &Round| {
            round.allocations[0]
                .caps_of("batch")
                .and_then(|c| c.read_iops)
                .unwrap_or(f64::INFINITY)
        };
        let mut alone = allocator();
        let mut b = allocator();
        let (mut with_ghost, mut without) = (None, None);
        for step in 0..6 {
            let at = Duration::from_secs(10 + step);
            with_ghost = Some(b.allocate(at, &[h2(), h3()], &standing));
            without = Some(alone.allocate(at, &[h2(), h3()], &standing[1..]));
        }
        let (with_ghost, without) = (with_ghost.unwrap(), without.unwrap());
        assert_eq!(
            with_ghost.ghosts,
            vec![Ghost {
                host: "h1".into(),
                load
            }]
        );
        assert!(without.ghosts.is_empty(), "h2 reports: no ghost");
        assert_eq!(with_ghost.allocations.len(), 2, "nothing written for h1");
        let (held, free) = (batch_cap(&with_ghost), batch_cap(&without));
        // The device served 4,400 IOPS with h1's load, 1.1 of a model of
        // 4,000 (a model found pessimistic): batch gets what h3's floor and
        // that load leave of it.
        assert!(
            held <= 4400.0 * 0.97 - 1150.0 - 750.0 + 1.0 && held < free - 800.0,
            "batch held to what h1's load leaves: {held} (without it {free})"
        );
        let back = b.allocate(
            Duration::from_secs(20),
            &[h1.clone(), h2(), h3()],
            &standing,
        );
        assert!(back.ghosts.is_empty(), "h1 reports again");
        let quiet = b.allocate(Duration::from_secs(21), &[h2(), h3()], &standing);
        assert_eq!(quiet.ghosts.len(), 1, "quiet again, counted again");
        let much_later = b.allocate(Duration::from_secs(21 + 86_400), &[h2(), h3()], &standing);
        assert_eq!(much_later.ghosts.len(), 1, "a day on, still counted");
        let timeout = Duration::from_secs(600);
        let mut c = allocator().with_orphan_timeout(Some(timeout));
        let quiet = c.allocate(Duration::from_secs(30), &[h2(), h3()], &standing);
        assert_eq!(quiet.ghosts.len(), 1);
        let later = c.allocate(Duration::from_secs(30) + timeout, &[h2(), h3()], &standing);
        assert!(later.ghosts.is_empty(), "the operator's timeout is up");
    }

    /// The allocator keeps each host's tenants between rounds while they
    /// stay the same, and decides by a host's new promise the round it
    /// reports one.
    #[test]
    fn a_promise_changed_by_its_host_is_decided_on_in_the_next_round() {
        let reports = |db_floor: f64| {
            [
                report(
                    "h1",
                    vec![tenant("db", Some(db_floor), 900.0, Caps::NONE)],
                    1.0,
                ),
                report("h2", vec![tenant("batch", None, 3000.0, Caps::NONE)], 2.0),
            ]
        };
        let mut a = allocator();
        let mut floors = Vec::new();
        for (step, db_floor) in [(1, 1000.0), (2, 1000.0), (3, 2000.0), (4, 2000.0)] {
            floors.push(
                a.allocate(Duration::from_secs(step), &reports(db_floor), &[])
                    .floors,
            );
        }
        assert_eq!(floors[0], floors[1], "{floors:?}");
        assert!(
            (floors[2] - 2.0 * floors[1]).abs() < 1e-9,
            "the new floor at once: {floors:?}"
        );
        assert_eq!(floors[2], floors[3], "{floors:?}");
        assert_eq!(a.specs["h1"].qualified[0].name, "h1/db");
    }

    /// A new allocator after a takeover: `batch` was held at 1,500 IOPS by
    /// the caps in force (its host's fallback rule) and used 1,200. Its
    /// first rounds never raise a cap above that; later ones may.
    #[test]
    fn a_new_allocators_first_rounds_never_raise_a_cap_above_the_one_in_force() {
        let in_force = Caps {
            read_iops: Some(1500.0),
            ..Caps::NONE
        };
        let reports = [
            report(
                "h1",
                vec![tenant("db", Some(800.0), 250.0, Caps::NONE)],
                1.0,
            ),
            report("h2", vec![tenant("batch", None, 1200.0, in_force)], 2.0),
        ];
        let mut a = allocator();
        let caps: Vec<f64> = (0..4)
            .map(|step| {
                let round = a.allocate(Duration::from_secs(step), &reports, &[]);
                round.allocations[1]
                    .caps_of("batch")
                    .and_then(|c| c.read_iops)
                    .unwrap_or(f64::INFINITY)
            })
            .collect();
        assert!(caps[..2].iter().all(|&c| c <= 1500.0), "{caps:?}");
        assert!(caps[2] > 1500.0, "then the policy's own: {caps:?}");
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
        let round = a.allocate(Duration::from_secs(1), &reports, &[]);
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
