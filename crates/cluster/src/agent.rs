//! The agent's side of an allocation: which caps a host applies to its own
//! tenants of a shared device, given the last allocation it received and its
//! own clock. Fresh allocations are applied as they are; a lower epoch (a
//! deposed allocator's late write) never is; and when no allocation is
//! fresh, because the allocator died, etcd is unreachable or this host was
//! cut off, the host falls back to a rule it can keep alone: each tenant's
//! floor, plus the host's equal share of the capacity the cluster last had
//! beyond all floors. Never "no caps": an unheld host on shared storage
//! takes the floors of every other host.
//!
//! [`AgentPolicy`] puts this rule behind the core `Policy` trait, so the
//! daemon's controller (counters in, caps out) runs a cluster agent exactly
//! as it runs a local policy; the etcd side only fills and empties its
//! [`Mailbox`].

use crate::wire::{Allocation, HostReport, TenantReport, SCHEMA};
use iofloor_core::judge::{self, Verdicts};
use iofloor_core::{Caps, CostModel, Policy, Rate, Snapshot, TenantSample, Usage};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the caps of an interval were chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// From a fresh allocation.
    Allocated,
    /// No allocation yet (the agent just started): the fallback rule with
    /// the local model's capacity shared by the hosts seen in etcd.
    Starting,
    /// The last allocation went stale: the fallback rule with what it said.
    Fallback,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Allocated => "allocated",
            Mode::Starting => "starting",
            Mode::Fallback => "fallback",
        }
    }
}

/// The pure rule. Time comes from the snapshot.
pub struct AgentRule {
    cost: CostModel,
    /// An allocation older than this (by the agent's own clock, from when it
    /// arrived) is never applied.
    stale_after: Duration,
    received: Option<(Allocation, Duration)>,
    highest_epoch: i64,
    /// Allocations refused for a lower epoch, for the log and metrics.
    pub refused_stale_epochs: u64,
    mixes: HashMap<String, Usage>,
    mode: Mode,
}

/// The least of the capacity the fallback rule shares beyond the floors.
/// With the learned capacity below the floors nothing is left beyond them,
/// and a tenant without a floor was held at the cost model's minimum (1
/// IOPS on the test bed: a cut-off host's fio never finished). 5 % of the
/// capacity over all hosts overcommits a device already short of its floors
/// by at most 5 %, and lets every tenant progress.
pub const FALLBACK_MIN_SHARE: f64 = 0.05;

/// What the fallback rule shares out.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Budget {
    capacity: f64,
    floors: f64,
    hosts: usize,
}

impl AgentRule {
    pub fn new(cost: CostModel, stale_after: Duration) -> AgentRule {
        AgentRule {
            cost,
            stale_after,
            received: None,
            highest_epoch: i64::MIN,
            refused_stale_epochs: 0,
            mixes: HashMap::new(),
            mode: Mode::Starting,
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The allocation in force, if any, with its age at `now`.
    pub fn current(&self, now: Duration) -> Option<(&Allocation, Duration)> {
        self.received
            .as_ref()
            .map(|(a, at)| (a, now.saturating_sub(*at)))
    }

    /// Takes an allocation read from etcd at `now`. The same (epoch, seq)
    /// read again does not make it fresher; a lower epoch is refused.
    pub fn receive(&mut self, allocation: Allocation, now: Duration) {
        if allocation.epoch < self.highest_epoch {
            self.refused_stale_epochs += 1;
            return;
        }
        if let Some((a, _)) = &self.received {
            if a.epoch == allocation.epoch && allocation.seq <= a.seq {
                return;
            }
        }
        self.highest_epoch = allocation.epoch;
        self.received = Some((allocation, now));
    }

    /// Caps for this host's tenants at `snapshot.now`. `hosts_seen` is how
    /// many hosts share the device as far as this agent knows (for the
    /// starting rule).
    pub fn decide(&mut self, snapshot: &Snapshot, hosts_seen: usize) -> Vec<Caps> {
        for t in snapshot.tenants {
            if let Some(u) = t.usage.filter(|u| !u.is_idle()) {
                self.mixes.insert(t.spec.name.clone(), u);
            }
        }
        let fresh = self
            .received
            .as_ref()
            .filter(|(_, at)| snapshot.now.saturating_sub(*at) <= self.stale_after)
            .map(|(a, _)| a);
        let budget = match (&self.received, fresh) {
            (_, Some(_)) => None,
            (Some((a, _)), None) => Some(Budget {
                capacity: a.capacity,
                floors: a.floors,
                hosts: a.hosts.max(1),
            }),
            (None, None) => Some(Budget {
                capacity: 1.0,
                floors: 0.0,
                hosts: hosts_seen.max(1),
            }),
        };
        self.mode = match (&self.received, fresh) {
            (_, Some(_)) => Mode::Allocated,
            (Some(_), None) => Mode::Fallback,
            (None, None) => Mode::Starting,
        };
        let fallback = self.fallback(
            snapshot.tenants,
            budget.unwrap_or(Budget {
                capacity: 1.0,
                floors: 0.0,
                hosts: hosts_seen.max(1),
            }),
        );
        match fresh {
            // A tenant the allocation does not know yet (it appeared after
            // the report) is held by the fallback rule until it does.
            Some(a) => snapshot
                .tenants
                .iter()
                .zip(fallback)
                .map(|(t, fb)| a.caps_of(&t.spec.name).unwrap_or(fb))
                .collect(),
            None => fallback,
        }
    }

    /// Each tenant's floor, plus the host's equal share of what the cluster
    /// had beyond all floors (at least [`FALLBACK_MIN_SHARE`] of the
    /// capacity), shared by weight among all its tenants (an idle one keeps
    /// its share, so it is not stalled when it starts) and held to their
    /// ceilings.
    fn fallback(&self, tenants: &[TenantSample], budget: Budget) -> Vec<Caps> {
        let mix_of = |t: &TenantSample| self.mixes.get(&t.spec.name).copied();
        let floor_cost = |t: &TenantSample| -> f64 {
            match (t.spec.floor, mix_of(t)) {
                (Some(f), Some(mix)) => self.cost.rate_to_cost(f, &mix).unwrap_or(0.0),
                (Some(iofloor_core::Rate::Cost(c)), None) => c,
                _ => 0.0,
            }
        };
        let surplus = (budget.capacity - budget.floors).max(FALLBACK_MIN_SHARE * budget.capacity)
            / budget.hosts as f64;
        let weights: f64 = tenants.iter().map(|t| t.spec.weight).sum();
        tenants
            .iter()
            .map(|t| {
                let share = if weights > 0.0 {
                    surplus * t.spec.weight / weights
                } else {
                    0.0
                };
                let mix = mix_of(t).unwrap_or_default();
                let mut cost = floor_cost(t) + share;
                if let Some(ceiling) = t.spec.ceiling {
                    if let Some(c) = self.cost.rate_to_cost(ceiling, &mix) {
                        cost = cost.min(c);
                    }
                }
                self.cost.caps_for_cost(cost, &mix)
            })
            .collect()
    }
}

/// Between the control thread and the etcd task: the report the agent last
/// made, the allocation it last read, and how many hosts it has seen.
#[derive(Debug, Default)]
pub struct Mailbox {
    pub outgoing: Option<HostReport>,
    pub incoming: Option<Allocation>,
    pub hosts_seen: usize,
    /// How the last caps were chosen, and the age of the allocation they
    /// came from, for the view and metrics.
    pub mode: Option<Mode>,
    pub allocation_age: Option<Duration>,
    /// Floors set for the whole cluster, by tenant name, as last read from
    /// etcd; `floors_version` changes when they do.
    pub floors: BTreeMap<String, Option<Rate>>,
    pub floors_version: u64,
}

/// The agent as a core [`Policy`]: decides with [`AgentRule`] and leaves
/// its report in the mailbox for the etcd task to publish.
pub struct AgentPolicy {
    host: String,
    device: String,
    rule: AgentRule,
    mailbox: Arc<Mutex<Mailbox>>,
    seq: u64,
    /// The last decision's tenants and interval: an allocation that arrives
    /// between decisions is applied to them (`decide_on_news`).
    last: Option<(Vec<TenantSample>, Duration)>,
}

impl AgentPolicy {
    pub fn new(
        host: impl Into<String>,
        device: impl Into<String>,
        rule: AgentRule,
        mailbox: Arc<Mutex<Mailbox>>,
    ) -> AgentPolicy {
        AgentPolicy {
            host: host.into(),
            device: device.into(),
            rule,
            mailbox,
            seq: 0,
            last: None,
        }
    }

    /// The rule's caps, with how they were chosen noted for the view.
    fn decide_and_note(&mut self, snapshot: &Snapshot, hosts_seen: usize) -> Vec<Caps> {
        let caps = self.rule.decide(snapshot, hosts_seen);
        let mut m = self.mailbox.lock().unwrap_or_else(|e| e.into_inner());
        m.mode = Some(self.rule.mode());
        m.allocation_age = self.rule.current(snapshot.now).map(|(_, age)| age);
        caps
    }
}

impl Policy for AgentPolicy {
    fn name(&self) -> &'static str {
        "cluster-agent"
    }

    fn decide(&mut self, snapshot: &Snapshot) -> Vec<Caps> {
        self.seq += 1;
        let report = HostReport {
            schema: SCHEMA,
            host: self.host.clone(),
            device: self.device.clone(),
            seq: self.seq,
            interval_s: snapshot.interval.as_secs_f64(),
            local_device: snapshot.device,
            tenants: snapshot.tenants.iter().map(TenantReport::from).collect(),
        };
        let (incoming, hosts_seen) = {
            let mut m = self.mailbox.lock().unwrap_or_else(|e| e.into_inner());
            m.outgoing = Some(report);
            (m.incoming.take(), m.hosts_seen)
        };
        if let Some(a) = incoming {
            self.rule.receive(a, snapshot.now);
        }
        self.last = Some((snapshot.tenants.to_vec(), snapshot.interval));
        self.decide_and_note(snapshot, hosts_seen)
    }

    fn decide_on_news(&mut self, now: Duration) -> Option<Vec<Caps>> {
        let (incoming, hosts_seen) = {
            let mut m = self.mailbox.lock().unwrap_or_else(|e| e.into_inner());
            (m.incoming.take(), m.hosts_seen)
        };
        let allocation = incoming?;
        self.rule.receive(allocation, now);
        let Some((tenants, interval)) = self.last.take() else {
            // Nothing decided yet: the first interval applies it.
            return None;
        };
        let snapshot = Snapshot {
            now,
            interval,
            device: None,
            tenants: &tenants,
            foreign_load: 0.0,
        };
        let caps = self.decide_and_note(&snapshot, hosts_seen);
        self.last = Some((tenants, interval));
        Some(caps)
    }

    fn capacity_estimate(&self) -> Option<f64> {
        self.rule.received.as_ref().map(|(a, _)| a.capacity)
    }

    /// Contended when the allocator judged the shared device so in the
    /// allocation in force while it is fresh (it sees every host's load, but
    /// of the interval its last reports covered: one interval behind this
    /// host's figures), or when this host's own load at the model's price
    /// is past the border of the capacity last allocated (seen at once, and
    /// all there is once the allocation went stale).
    fn verdicts(&self, snapshot: &Snapshot) -> Verdicts {
        let allocation = self.rule.current(snapshot.now);
        let capacity = allocation.map_or(1.0, |(a, _)| a.capacity);
        let by_allocator = allocation
            .is_some_and(|(a, age)| age <= self.rule.stale_after && a.contended == Some(true));
        let here =
            judge::contended_at_model(snapshot, &self.rule.cost, capacity, judge::DEFAULT_BORDER);
        Verdicts::judge(snapshot, by_allocator || here, &self.rule.cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iofloor_core::{Rate, TenantClass, TenantSpec};

    fn cost() -> CostModel {
        iofloor_core::synthetic::iops_only_model(4000.0)
    }

    use iofloor_core::synthetic::random_reads_4k as reads;

    fn sample(name: &str, floor: Option<f64>, iops: f64) -> TenantSample {
        let mut spec = TenantSpec::new(name, TenantClass::Container);
        spec.floor = floor.map(Rate::Iops);
        TenantSample {
            spec: Arc::new(spec),
            usage: Some(reads(iops)),
            caps: Caps::NONE,
        }
    }

    fn allocation(epoch: i64, seq: u64, db_cap: f64) -> Allocation {
        Allocation {
            schema: SCHEMA,
            host: "h1".into(),
            device: "shared".into(),
            epoch,
            seq,
            interval_s: 1.0,
            capacity: 0.9,
            floors: 0.5,
            hosts: 2,
            caps: vec![(
                "db".into(),
                Caps {
                    read_iops: Some(db_cap),
                    ..Caps::NONE
                },
            )],
            load: 0.0,
            contended: None,
        }
    }

    fn snapshot(now: u64, tenants: &[TenantSample]) -> Snapshot<'_> {
        Snapshot {
            now: Duration::from_secs(now),
            interval: Duration::from_secs(1),
            device: None,
            tenants,
            foreign_load: 0.0,
        }
    }

    #[test]
    fn a_fresh_allocation_is_applied_then_falls_back_when_stale() {
        let mut rule = AgentRule::new(cost(), Duration::from_secs(3));
        let tenants = [
            sample("db", Some(1000.0), 800.0),
            sample("new", None, 100.0),
        ];
        rule.receive(allocation(4, 1, 1234.0), Duration::from_secs(10));
        let caps = rule.decide(&snapshot(12, &tenants), 2);
        assert_eq!(rule.mode(), Mode::Allocated);
        assert_eq!(caps[0].read_iops, Some(1234.0));
        // Not in the allocation: held by the fallback rule, not left open.
        assert!(caps[1].read_iops.is_some());

        // The same allocation read again is no fresher.
        rule.receive(allocation(4, 1, 1234.0), Duration::from_secs(13));
        let caps = rule.decide(&snapshot(14, &tenants), 2);
        assert_eq!(rule.mode(), Mode::Fallback, "4 s old with 3 s allowed");
        // Fallback: 1,000 IOPS floor (0.25) + (0.9 − 0.5) / 2 hosts shared by
        // weight between two active tenants (0.1 each) = 0.35 of 4,000 IOPS.
        let db = caps[0].read_iops.unwrap();
        assert!((db - 1400.0).abs() < 1.0, "{db}");
        let new = caps[1].read_iops.unwrap();
        assert!((new - 400.0).abs() < 1.0, "{new}");
    }

    /// A host shows its floors judged by the allocator's verdict while the
    /// allocation is fresh, and by its own load either way.
    #[test]
    fn floors_are_judged_by_the_allocators_verdict_and_this_hosts_load() {
        let mailbox = Arc::new(Mutex::new(Mailbox::default()));
        let rule = AgentRule::new(cost(), Duration::from_secs(3));
        let mut policy = AgentPolicy::new("h1", "shared", rule, mailbox);
        let quiet = [sample("db", Some(1000.0), 800.0)];
        let verdict = |policy: &AgentPolicy, now: u64, tenants: &[TenantSample]| {
            let v = policy.verdicts(&snapshot(now, tenants));
            (v.contended, v.tenants[0].floor_met)
        };
        assert_eq!(
            verdict(&policy, 1, &quiet),
            (false, Some(true)),
            "no allocation, 0.2 of the device: asked for less"
        );
        let mut contended = allocation(1, 1, 1500.0);
        contended.contended = Some(true);
        policy.rule.receive(contended, Duration::from_secs(10));
        assert_eq!(verdict(&policy, 11, &quiet), (true, Some(false)));
        assert_eq!(
            verdict(&policy, 20, &quiet),
            (false, Some(true)),
            "a stale allocation's verdict is not shown"
        );
        let busy = [sample("db", Some(1000.0), 800.0), sample("x", None, 2800.0)];
        assert_eq!(
            verdict(&policy, 20, &busy),
            (true, Some(false)),
            "this host alone is past the border of the capacity last allocated"
        );
        let mut nonsense = allocation(1, 2, 1500.0);
        nonsense.capacity = 0.0;
        policy.rule.receive(nonsense, Duration::from_secs(30));
        assert_eq!(
            verdict(&policy, 30, &quiet),
            (false, Some(true)),
            "a capacity of 0 is read as the model's"
        );
    }

    /// Counters that grow by 800 reads per call, and the caps written, by
    /// tenant.
    #[derive(Default)]
    struct Recording {
        reads: u64,
        written: Vec<(String, Caps)>,
    }

    impl iofloor_core::Backend for Recording {
        type Error = String;
        fn read_counters(&mut self, _: &TenantSpec) -> Result<iofloor_core::Counters, String> {
            self.reads += 800;
            Ok(iofloor_core::Counters {
                read_ios: self.reads,
                read_bytes: self.reads * 4096,
                ..Default::default()
            })
        }
        fn read_device(&mut self) -> Option<iofloor_core::DeviceCounters> {
            None
        }
        fn apply_caps(&mut self, tenant: &TenantSpec, caps: &Caps) -> Result<(), String> {
            self.written.push((tenant.name.clone(), *caps));
            Ok(())
        }
    }

    #[test]
    fn an_allocation_is_applied_when_it_arrives_not_at_the_next_interval() {
        let mailbox = Arc::new(Mutex::new(Mailbox::default()));
        let rule = AgentRule::new(cost(), Duration::from_secs(3));
        let policy = AgentPolicy::new("h1", "shared", rule, mailbox.clone());
        let mut spec = TenantSpec::new("db", TenantClass::Container);
        spec.floor = Some(Rate::Iops(1000.0));
        let mut controller = iofloor_core::Controller::new(Box::new(policy), vec![Arc::new(spec)]);
        let mut backend = Recording::default();
        let second = Duration::from_secs;

        // Nothing decided yet: an allocation waits for the first interval.
        mailbox.lock().unwrap().incoming = Some(allocation(1, 1, 1500.0));
        assert!(controller.apply_news(second(0), &mut backend).is_none());
        controller.tick(second(1), &mut backend);
        controller.tick(second(2), &mut backend);
        assert_eq!(backend.written.last().unwrap().1.read_iops, Some(1500.0));

        // Between intervals: nothing new, nothing written.
        let writes = backend.written.len();
        assert!(controller.apply_news(second(2), &mut backend).is_none());
        assert_eq!(backend.written.len(), writes);

        // A new allocation is written as soon as it is seen, without a
        // counter read and without a report of its own.
        let reads = backend.reads;
        mailbox.lock().unwrap().incoming = Some(allocation(1, 2, 1200.0));
        let news = controller.apply_news(second(2), &mut backend).unwrap();
        assert_eq!(news.applied[0].0, "db");
        assert_eq!(news.applied[0].1.read_iops, Some(1200.0));
        assert_eq!(backend.written.last().unwrap().1.read_iops, Some(1200.0));
        assert_eq!(backend.reads, reads);
        assert_eq!(mailbox.lock().unwrap().outgoing.as_ref().unwrap().seq, 2);
        assert_eq!(mailbox.lock().unwrap().mode, Some(Mode::Allocated));

        // A deposed allocator's late write changes nothing.
        let writes = backend.written.len();
        mailbox.lock().unwrap().incoming = Some(allocation(0, 9, 4000.0));
        let news = controller.apply_news(second(2), &mut backend).unwrap();
        assert_eq!(news.applied[0].1.read_iops, Some(1200.0));
        assert_eq!(backend.written.len(), writes);
    }

    #[test]
    fn a_lower_epoch_is_never_applied() {
        let mut rule = AgentRule::new(cost(), Duration::from_secs(3));
        let tenants = [sample("db", Some(1000.0), 800.0)];
        rule.receive(allocation(9, 5, 1500.0), Duration::from_secs(1));
        rule.receive(allocation(8, 50, 4000.0), Duration::from_secs(2));
        assert_eq!(rule.refused_stale_epochs, 1);
        let caps = rule.decide(&snapshot(2, &tenants), 1);
        assert_eq!(caps[0].read_iops, Some(1500.0));
        // A new allocator's first allocation (seq 1) is newer than seq 5 of the last.
        rule.receive(allocation(10, 1, 2000.0), Duration::from_secs(3));
        let caps = rule.decide(&snapshot(3, &tenants), 1);
        assert_eq!(caps[0].read_iops, Some(2000.0));
    }

    #[test]
    fn a_starting_agent_shares_the_model_with_the_hosts_it_has_seen() {
        let mut rule = AgentRule::new(cost(), Duration::from_secs(3));
        let tenants = [sample("db", Some(1000.0), 800.0)];
        let caps = rule.decide(&snapshot(1, &tenants), 4);
        assert_eq!(rule.mode(), Mode::Starting);
        // 1,000 floor + (1.0 − 0) / 4 hosts = 0.5 of 4,000 IOPS.
        let db = caps[0].read_iops.unwrap();
        assert!((db - 2000.0).abs() < 1.0, "{db}");
    }

    #[test]
    fn fallback_never_leaves_a_tenant_uncapped_and_honours_ceilings() {
        let mut rule = AgentRule::new(cost(), Duration::from_secs(3));
        let mut capped = sample("capped", Some(100.0), 300.0);
        Arc::make_mut(&mut capped.spec).ceiling = Some(Rate::Iops(200.0));
        let mut idle = sample("idle", None, 0.0);
        idle.usage = Some(Usage::default());
        let tenants = [capped, idle];
        for caps in rule.decide(&snapshot(1, &tenants), 1) {
            assert!(!caps.is_unlimited());
        }
        let caps = rule.decide(&snapshot(2, &tenants), 1);
        assert!((caps[0].read_iops.unwrap() - 200.0).abs() < 1.0);
    }

    #[test]
    fn fallback_below_the_floors_keeps_a_minimum_share_for_tenants_without_one() {
        let mut rule = AgentRule::new(cost(), Duration::from_secs(3));
        let tenants = [
            sample("db", Some(1000.0), 800.0),
            sample("noisy", None, 2000.0),
        ];
        let mut short = allocation(4, 1, 1234.0);
        (short.capacity, short.floors, short.hosts) = (0.4, 0.5, 2);
        rule.receive(short, Duration::from_secs(1));
        let caps = rule.decide(&snapshot(10, &tenants), 2);
        assert_eq!(rule.mode(), Mode::Fallback);
        // 5 % of 0.4 over 2 hosts = 0.01, split by weight: 0.005 each = 20 IOPS.
        let noisy = caps[1].read_iops.unwrap();
        assert!((noisy - 20.0).abs() < 1.0, "{noisy}");
        let db = caps[0].read_iops.unwrap();
        assert!((db - 1020.0).abs() < 1.0, "the floor and its share: {db}");
    }
}
