//! A cluster of hosts on one simulated shared device, played with the
//! cluster crate's own pieces: every host's controller runs the
//! [`AgentPolicy`] over its tenants, and one host's [`Allocator`] runs the
//! core policy over every host's reports, as `iofloor run` with a
//! `[cluster]` section does. What etcd does between them is modelled, not
//! run: reports reach the allocator `delay` after the agents' tick, its
//! allocations are applied at each agent's next tick; a host's report lives
//! as long as its lease (renewed while the host is alive and reachable, then
//! `lease_ttl` more); when the allocator's lease ends, the first live,
//! reachable host (in the scenario's order) takes over, resuming from the
//! capacity the last allocation it received carried, with a higher epoch.
//! Allocations are not bound to a lease: etcd keeps each host's last one,
//! which is how an allocator knows a host that went quiet with its caps in
//! force (a [`iofloor_cluster::Ghost`]).
//! Everything happens at simulated times, so a run is deterministic (but
//! for the allocator's round times, which are measured).

use iofloor_cluster::{AgentPolicy, AgentRule, Allocation, Allocator, HostReport, Mailbox};
use iofloor_core::control::Controller;
use iofloor_core::model::TenantSpec;
use iofloor_core::policy::{PolicyContext, PolicyKind};
use iofloor_scenario::format::{Cluster, ClusterEventKind, Scenario};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The shared device's name in reports and allocations.
const DEVICE: &str = "shared";

struct SimHost {
    controller: Controller,
    mailbox: Arc<Mutex<Mailbox>>,
    alive: bool,
    reachable: bool,
    /// When it was last killed or cut off: its lease ends `lease_ttl` later.
    lost_at: Option<Duration>,
    /// Its last report that reached etcd.
    report: Option<HostReport>,
    /// The capacity its last allocation carried (a new allocator's start).
    last_capacity: Option<f64>,
}

impl SimHost {
    fn lease_valid(&self, now: Duration, ttl: Duration) -> bool {
        self.lost_at.is_none_or(|at| now < at + ttl)
    }
}

/// The specs of host `h`'s tenants; `specs` are the scenario's tenants', in
/// its order.
pub(crate) fn tenants_on(
    scenario: &Scenario,
    specs: &[Arc<TenantSpec>],
    h: usize,
) -> Vec<Arc<TenantSpec>> {
    scenario
        .tenants
        .iter()
        .zip(specs)
        .filter(|(t, _)| t.host == Some(h))
        .map(|(_, s)| s.clone())
        .collect()
}

/// Hosts, the allocator and what etcd would hold between them.
pub(crate) struct SimCluster {
    shape: Cluster,
    hosts: Vec<SimHost>,
    /// The host that allocates and its allocator.
    allocator: Option<(usize, Allocator)>,
    /// Each host's last allocation that reached etcd, read or not.
    standing: Vec<Allocation>,
    epoch: i64,
    kind: PolicyKind,
    params: iofloor_core::PolicyParams,
    ctx: PolicyContext,
    /// The capacity the last round learned, for the windows.
    capacity: Option<f64>,
    /// From when each host allocated (its first round).
    pub takeovers: Vec<(Duration, String)>,
    exchange: ExchangeTotals,
}

/// What the hosts and the allocator exchanged through (modelled) etcd.
#[derive(Debug, Clone, Copy, Default)]
struct ExchangeTotals {
    report_bytes: u64,
    reports: u64,
    allocation_bytes: u64,
    allocations: u64,
    rounds: u64,
    round_total: Duration,
    round_max: Duration,
}

/// A cluster run's exchange, per host and interval, and the allocator's
/// rounds (wall-clock time of [`Allocator::allocate`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExchangeStats {
    /// Mean bytes of a host's report (what it writes per interval) and of
    /// its allocation (what it reads).
    pub report_bytes: f64,
    pub allocation_bytes: f64,
    pub rounds: u64,
    pub round_mean: Duration,
    pub round_max: Duration,
}

impl SimCluster {
    /// The cluster `shape` of `scenario` with `kind` as the allocator's
    /// policy; `specs` are the scenario's tenants, in its order.
    pub fn new(
        scenario: &Scenario,
        shape: &Cluster,
        kind: PolicyKind,
        specs: &[Arc<TenantSpec>],
    ) -> SimCluster {
        let shape = shape.clone();
        let ctx = PolicyContext {
            cost: scenario.policy_model,
            capacity: 1.0,
        };
        let hosts = shape
            .hosts
            .iter()
            .enumerate()
            .map(|(h, name)| {
                let mailbox = Arc::new(Mutex::new(Mailbox::default()));
                let rule = AgentRule::new(scenario.policy_model, shape.stale_after);
                let policy = AgentPolicy::new(name.clone(), DEVICE, rule, mailbox.clone());
                SimHost {
                    controller: Controller::new(Box::new(policy), tenants_on(scenario, specs, h)),
                    mailbox,
                    alive: true,
                    reachable: true,
                    lost_at: None,
                    report: None,
                    last_capacity: None,
                }
            })
            .collect();
        SimCluster {
            standing: Vec::new(),
            shape,
            hosts,
            allocator: None,
            epoch: 0,
            kind,
            params: scenario.policy.clone(),
            ctx,
            capacity: None,
            takeovers: Vec::new(),
            exchange: ExchangeTotals::default(),
        }
    }

    pub fn exchange(&self) -> ExchangeStats {
        let e = &self.exchange;
        let mean = |bytes: u64, n: u64| if n == 0 { 0.0 } else { bytes as f64 / n as f64 };
        ExchangeStats {
            report_bytes: mean(e.report_bytes, e.reports),
            allocation_bytes: mean(e.allocation_bytes, e.allocations),
            rounds: e.rounds,
            round_mean: e.round_total / e.rounds.max(1) as u32,
            round_max: e.round_max,
        }
    }

    pub fn delay(&self) -> Duration {
        self.shape.delay
    }

    pub fn capacity(&self) -> Option<f64> {
        self.capacity
    }

    /// The serving allocator's last capacity step, if one is serving.
    pub fn capacity_step(&self) -> Option<iofloor_core::capacity::CapacityStep> {
        self.allocator.as_ref()?.1.capacity_step()
    }

    /// The agents' tick: `tick_host` runs host `h`'s controller against its
    /// view of the device; what a reachable host reports reaches etcd.
    pub fn tick(&mut self, mut tick_host: impl FnMut(usize, &mut Controller)) {
        for (h, host) in self.hosts.iter_mut().enumerate() {
            if !host.alive {
                continue;
            }
            tick_host(h, &mut host.controller);
            let report = lock(&host.mailbox).outgoing.take();
            if host.reachable {
                if let Some(r) = &report {
                    self.exchange.report_bytes += r.encode().len() as u64;
                    self.exchange.reports += 1;
                }
                host.report = report;
            }
        }
    }

    /// Runs `apply` on the controller of every host still running: after a
    /// round, each applies what it was allocated (`Controller::apply_news`).
    pub fn each_running_host(&mut self, mut apply: impl FnMut(usize, &mut Controller)) {
        for (h, host) in self.hosts.iter_mut().enumerate() {
            if host.alive {
                apply(h, &mut host.controller);
            }
        }
    }

    /// The allocator's round at `now`: reports of hosts whose lease still
    /// holds, a new allocator when the last one's lease ended, allocations
    /// to the hosts that can read them. Returns how long the round took,
    /// if one ran.
    pub fn allocate(&mut self, now: Duration) -> Option<Duration> {
        let ttl = self.shape.lease_ttl;
        for host in &mut self.hosts {
            if !host.lease_valid(now, ttl) {
                host.report = None;
            }
        }
        if let Some((h, _)) = &self.allocator {
            if !self.hosts[*h].lease_valid(now, ttl) {
                self.allocator = None;
            }
        }
        if self.allocator.is_none() {
            // The campaign of the first candidate returns once the last
            // leader's key is gone with its lease.
            if let Some(h) = (0..self.hosts.len()).find(|h| {
                let host = &self.hosts[*h];
                host.alive && host.reachable && host.lease_valid(now, ttl)
            }) {
                self.epoch += 1;
                let allocator = Allocator::new(
                    DEVICE,
                    self.kind,
                    &self.params,
                    self.ctx,
                    self.hosts[h].last_capacity,
                    self.epoch,
                );
                self.takeovers.push((now, self.shape.hosts[h].clone()));
                self.allocator = Some((h, allocator));
            }
        }
        let reports: Vec<HostReport> = self.hosts.iter().filter_map(|h| h.report.clone()).collect();
        let seen = reports.len();
        for host in self.hosts.iter().filter(|h| h.alive && h.reachable) {
            lock(&host.mailbox).hosts_seen = seen;
        }
        let (h, allocator) = self.allocator.as_mut()?;
        let writer = &self.hosts[*h];
        // A cut-off allocator's fenced writes do not reach etcd.
        if !(writer.alive && writer.reachable) || reports.is_empty() {
            return None;
        }
        let started = std::time::Instant::now();
        let round = allocator.allocate(now, &reports, &self.standing);
        let took = started.elapsed();
        self.exchange.rounds += 1;
        self.exchange.round_total += took;
        self.exchange.round_max = self.exchange.round_max.max(took);
        self.capacity = Some(round.capacity);
        for allocation in round.allocations {
            self.deliver(allocation);
        }
        Some(took)
    }

    fn deliver(&mut self, allocation: Allocation) {
        let Some(h) = self.shape.hosts.iter().position(|n| *n == allocation.host) else {
            return;
        };
        match self.standing.iter_mut().find(|a| a.host == allocation.host) {
            Some(standing) => *standing = allocation.clone(),
            None => self.standing.push(allocation.clone()),
        }
        let host = &mut self.hosts[h];
        if host.alive && host.reachable {
            self.exchange.allocation_bytes += allocation.encode().len() as u64;
            self.exchange.allocations += 1;
            host.last_capacity = Some(allocation.capacity);
            lock(&host.mailbox).incoming = Some(allocation);
        }
    }

    /// `[[cluster.event]]` number `index` happens at `now`.
    pub fn event(&mut self, index: usize, now: Duration) {
        let (_, h, kind) = self.shape.events[index];
        let host = &mut self.hosts[h];
        match kind {
            ClusterEventKind::Kill => host.alive = false,
            ClusterEventKind::Partition => host.reachable = false,
            ClusterEventKind::Heal => host.reachable = true,
        }
        if host.alive && host.reachable {
            // A host back in touch grants itself a new lease.
            host.lost_at = None;
        } else {
            host.lost_at.get_or_insert(now);
        }
    }
}

fn lock(mailbox: &Mutex<Mailbox>) -> std::sync::MutexGuard<'_, Mailbox> {
    mailbox.lock().unwrap_or_else(|e| e.into_inner())
}
