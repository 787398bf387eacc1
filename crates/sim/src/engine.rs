//! The discrete-event engine: fio-like jobs issue I/Os, a blk-throttle model
//! holds them per tenant and direction, a VM's I/O crosses the hypervisor path,
//! and a device with finite parallelism serves a FIFO queue with service times
//! from its cost model. The controller of iofloor-core runs at the control
//! interval against a backend that reads this engine's counters and sets its
//! throttles, exactly as the daemon does against cgroups.

use iofloor_core::control::{Backend, Controller, Counters, DeviceCounters};
use iofloor_core::model::{Caps, Direction, TenantClass, TenantSpec};
use iofloor_core::policy::{self, PolicyContext};
use iofloor_core::units::Rate;
use iofloor_report::record::{
    CapacityTraceEntry, DeviceWindow, LatencySummary, TenantWindow, Throughput, Window,
};
use iofloor_scenario::format::{
    ClusterEventKind, DeviceShape, Job, JobState, RateProcess, Scenario, UnmanagedOrigin,
};
use iofloor_scenario::{Control, DecisionStats, LatencyRecorder};
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rand_distr::Exp1;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::cluster::{tenants_on, ExchangeStats, SimCluster};

const NS: f64 = 1e9;
/// blk-throttle's time slice on non-rotational devices (DFL_THROTL_SLICE_SSD, 20 ms):
/// the most a throttled group can send at once after a pause.
const THROTTLE_SLICE_NS: f64 = 20e6;
/// How far a rate-limited fio job may fall behind and then catch up.
const RATE_BACKLOG_NS: u64 = 1_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Complete,
    PathDone,
    Wake,
    Release,
    Phase,
    Control,
    Window,
    /// Something the scenario or the cluster schedules, told by `b`:
    /// `[[device.change]]` number `a` ([`DEVICE_CHANGE`]), a cluster's
    /// allocator round `delay` after the agents' tick ([`ALLOCATE`]), or
    /// `[[cluster.event]]` number `a` ([`HOST_EVENT`]).
    Scheduled,
}

/// `b` of a [`Kind::Scheduled`] event.
const DEVICE_CHANGE: u32 = 0;
const ALLOCATE: u32 = 1;
const HOST_EVENT: u32 = 2;
const LOOK: u32 = 3;

impl Kind {
    /// Eight kinds: the kind rides in 3 bits of an event's payload.
    const ALL: [Kind; 8] = [
        Kind::Complete,
        Kind::PathDone,
        Kind::Wake,
        Kind::Release,
        Kind::Phase,
        Kind::Control,
        Kind::Window,
        Kind::Scheduled,
    ];
}

/// Bits of an event key that hold the sequence number; the rest hold the time
/// in nanoseconds, which bounds a run to 2^44 ns (4.8 hours).
const SEQ_BITS: u32 = 20;
/// The longest run the event key can represent.
pub const MAX_DURATION: Duration = Duration::from_nanos(1 << (64 - SEQ_BITS));
// Every valid scenario fits the event clock.
const _: () = assert!(iofloor_scenario::format::MAX_DURATION.as_nanos() < MAX_DURATION.as_nanos());

/// A scheduled event in 16 bytes, ordered by one integer: the time, then a
/// sequence number (wrapping every 2^20 events), so events at the same time
/// run in the order they were scheduled. Small and cheap to compare because
/// the heap's comparisons are the simulator's hot path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Event {
    key: u64,
    /// Kind in the top 3 bits, then `a` (32 bits) and `b` (29 bits).
    payload: u64,
}

impl Event {
    fn new(time: u64, seq: u64, kind: Kind, a: u32, b: u32) -> Event {
        debug_assert!(b < 1 << 29);
        Event {
            key: time << SEQ_BITS | (seq & ((1 << SEQ_BITS) - 1)),
            payload: (kind as u64) << 61 | (a as u64) << 29 | b as u64,
        }
    }

    fn time(&self) -> u64 {
        self.key >> SEQ_BITS
    }

    fn kind(&self) -> Kind {
        Kind::ALL[(self.payload >> 61) as usize]
    }

    fn a(&self) -> u32 {
        (self.payload >> 29) as u32
    }

    fn b(&self) -> u32 {
        (self.payload & ((1 << 29) - 1)) as u32
    }
}

impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Event {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Reversed: BinaryHeap is a max-heap and the earliest event goes first.
        other.key.cmp(&self.key)
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Io {
    tenant: u32,
    instance: u32,
    write: bool,
    seq: bool,
    bytes: u32,
    issued: u64,
    cost: f64,
    /// What the policies' model says it costs (`cost` is the true device's).
    model_cost: f64,
    /// From another host: served by the device, absent from this host's counters.
    hidden: bool,
    /// The cluster host whose disk counters it shows in ([`NO_HOST`]: none).
    host: u32,
}

const NO_HOST: u32 = u32::MAX;

/// One fio process of a job.
#[derive(Debug, Clone)]
struct Instance {
    job: u32,
    active: bool,
    outstanding: u32,
    next_at: u64,
    wake_pending: bool,
}

#[derive(Debug, Clone)]
struct JobRt {
    tenant: u32,
    bs: u32,
    read_share: f64,
    seq: bool,
    spacing_ns: Option<f64>,
    /// Gaps drawn at random around `spacing_ns` (fio `rate_process=poisson`).
    poisson: bool,
    iodepth: u32,
    instances: Vec<u32>,
}

/// A token bucket as blk-throttle behaves: `rate` per ns, at most one slice of credit.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    rate: Option<f64>,
    tokens: f64,
    last: u64,
}

impl Bucket {
    fn burst(&self) -> f64 {
        self.rate
            .map(|r| r * THROTTLE_SLICE_NS)
            .unwrap_or(f64::INFINITY)
    }

    fn refill(&mut self, now: u64) {
        if let Some(r) = self.rate {
            self.tokens = (self.tokens + r * (now - self.last) as f64).min(self.burst());
        }
        self.last = now;
    }

    /// An I/O larger than a slice's credit goes when the bucket is full, into debt.
    fn fits(&self, need: f64) -> bool {
        self.rate.is_none() || self.tokens >= need.min(self.burst())
    }

    fn wait_ns(&self, need: f64) -> f64 {
        match self.rate {
            Some(r) if r > 0.0 => ((need.min(self.burst()) - self.tokens) / r).max(0.0),
            Some(_) => f64::INFINITY,
            None => 0.0,
        }
    }

    fn set_rate(&mut self, rate: Option<f64>, now: u64) {
        self.refill(now);
        match (self.rate, rate) {
            (None, Some(_)) => self.tokens = 0.0,
            (_, None) => self.tokens = 0.0,
            _ => {}
        }
        self.rate = rate;
        self.tokens = self.tokens.min(self.burst());
    }
}

#[derive(Debug, Clone, Default)]
struct Throttle {
    iops: Bucket,
    bps: Bucket,
    queue: VecDeque<u32>,
    generation: u32,
}

/// A set of servers with a FIFO queue: the device, or a VM's I/O path.
#[derive(Debug, Clone, Default)]
struct Stage {
    slots: u32,
    busy: u32,
    queue: VecDeque<u32>,
}

#[derive(Debug, Clone, Default)]
struct WindowAcc {
    ios: u64,
    bytes: u64,
    cost: f64,
    latency_ns: u64,
}

impl WindowAcc {
    /// What was served over a window of `secs` seconds, as rates.
    fn rates(&self, secs: f64) -> Throughput {
        Throughput {
            iops: self.ios as f64 / secs,
            bytes_per_s: self.bytes as f64 / secs,
            cost: self.cost / secs,
        }
    }
}

struct TenantRt {
    spec: Arc<TenantSpec>,
    throttle: [Throttle; 2],
    path: Option<(Stage, u64)>,
    counters: Counters,
    acc: WindowAcc,
    latency: LatencyRecorder,
    /// Unmanaged load: no policy sees or throttles it; windows report it
    /// only as the device's unmanaged work.
    managed: bool,
    /// Unmanaged load from another host (absent from the device's counters).
    hidden: bool,
    /// Its cluster host, or [`NO_HOST`].
    host: u32,
    activity: Activity,
}

/// When a tenant had jobs running, for the window being filled: a tenant
/// that starts or stops within a window is owed its floor for the part of
/// it it ran (`TenantWindow::active_share`), as the bench judges a start.
#[derive(Debug, Clone, Copy, Default)]
struct Activity {
    /// Running since then (or since the window began, if later).
    since: Option<u64>,
    /// Running time in the window before `since`, in ns.
    ran_ns: u64,
}

impl Activity {
    fn set(&mut self, running: bool, now: u64) {
        match (self.since, running) {
            (None, true) => self.since = Some(now),
            (Some(since), false) => {
                self.ran_ns += now.saturating_sub(since);
                self.since = None;
            }
            _ => {}
        }
    }

    /// The share of the window `(now - window_ns, now]` it ran, where that
    /// is neither none nor all of it; starts the next window.
    fn close(&mut self, now: u64, window_ns: u64) -> Option<f64> {
        let start = now.saturating_sub(window_ns);
        if let Some(since) = self.since.as_mut() {
            self.ran_ns += now.saturating_sub((*since).max(start));
            *since = now;
        }
        let share = std::mem::take(&mut self.ran_ns) as f64 / window_ns.max(1) as f64;
        (share > 0.0 && share < 1.0 - 1e-9).then_some(share)
    }
}

/// One cluster host's view of the shared device: its own I/Os at the
/// device, as its /proc/diskstats counts them (another host's are not there).
#[derive(Debug, Clone, Copy, Default)]
struct DiskView {
    depth: u64,
    completions: u64,
    queue_area: u128,
    busy_ns: u64,
    last_change: u64,
}

impl DiskView {
    fn account(&mut self, now: u64) {
        let dt = now - self.last_change;
        self.queue_area += self.depth as u128 * dt as u128;
        if self.depth > 0 {
            self.busy_ns += dt;
        }
        self.last_change = now;
    }

    fn counters(&self) -> DeviceCounters {
        DeviceCounters {
            busy_ns: self.busy_ns,
            queue_ns: self.queue_area.min(u64::MAX as u128) as u64,
            completions: self.completions,
        }
    }
}

struct DeviceRt {
    stage: Stage,
    /// The share of its declared speed the device has now (`[[device.change]]`).
    capacity_factor: f64,
    /// I/Os of this host at the device (queued or in service): what
    /// /proc/diskstats counts, unlike another host's.
    local_depth: u64,
    completions: u64,
    queue_area: u128,
    busy_ns: u64,
    last_change: u64,
    written: u64,
    win_area: u128,
    win_busy: u64,
    win_latency_ns: u64,
    win_ios: u64,
    /// The window's I/Os started at the device: what the policies' model
    /// says they cost, and what they took of the device as it is now.
    win_model_cost: f64,
    win_true_cost: f64,
    /// The device's capacity in the policies' model's units, last seen.
    true_capacity: Option<f64>,
    /// A rate-limited device's bucket: the theoretical time (ns) at which
    /// it next lets an I/O through at its rate (GCRA's virtual clock).
    bucket_tat: f64,
}

impl DeviceRt {
    fn new(parallelism: u32) -> DeviceRt {
        DeviceRt {
            stage: Stage {
                slots: parallelism,
                ..Default::default()
            },
            capacity_factor: 1.0,
            local_depth: 0,
            completions: 0,
            queue_area: 0,
            busy_ns: 0,
            last_change: 0,
            written: 0,
            win_area: 0,
            win_busy: 0,
            win_latency_ns: 0,
            win_ios: 0,
            win_model_cost: 0.0,
            win_true_cost: 0.0,
            true_capacity: None,
            bucket_tat: 0.0,
        }
    }
}

/// What one simulated run produced.
pub struct EngineOutput {
    pub windows: Vec<Window>,
    pub latency: Vec<LatencySummary>,
    pub decisions: DecisionStats,
    /// The capacity loop's judgement of each decision (one host only).
    pub capacity_trace: Vec<CapacityTraceEntry>,
    pub ios_completed: u64,
    pub ios_issued: u64,
    pub ios_in_flight: u64,
    /// In a cluster run: from when each host was the allocator (its first round).
    pub allocators: Vec<(Duration, String)>,
    /// In a cluster run: what went through etcd, and the allocator's rounds.
    pub exchange: Option<ExchangeStats>,
}

pub struct Engine<'s> {
    sc: &'s Scenario,
    now: u64,
    seq: u64,
    events: BinaryHeap<Event>,
    ios: Vec<Io>,
    free: Vec<u32>,
    instances: Vec<Instance>,
    jobs: Vec<JobRt>,
    job_specs: Vec<&'s Job>,
    tenants: Vec<TenantRt>,
    by_name: HashMap<String, u32>,
    dev: DeviceRt,
    rng: ChaCha8Rng,
    windows: Vec<Window>,
    issued: u64,
    completed: u64,
    warmup_ns: u64,
    window_ns: u64,
    /// The controller's capacity estimate after its last decision.
    capacity_estimate: Option<f64>,
    /// Per cluster host (empty on one host).
    host_views: Vec<DiskView>,
}

impl<'s> Engine<'s> {
    pub fn new(sc: &'s Scenario) -> Engine<'s> {
        let mut e = Engine {
            sc,
            now: 0,
            seq: 0,
            events: BinaryHeap::with_capacity(1024),
            ios: Vec::new(),
            free: Vec::new(),
            instances: Vec::new(),
            jobs: Vec::new(),
            job_specs: Vec::new(),
            tenants: Vec::new(),
            by_name: HashMap::new(),
            dev: DeviceRt::new(sc.device.parallelism),
            rng: ChaCha8Rng::seed_from_u64(sc.seed),
            windows: Vec::new(),
            issued: 0,
            completed: 0,
            warmup_ns: sc.warmup.as_nanos() as u64,
            window_ns: 1_000_000_000,
            capacity_estimate: None,
            host_views: vec![DiskView::default(); sc.cluster.as_ref().map_or(0, |c| c.hosts.len())],
        };
        let unmanaged = sc.unmanaged.iter().map(|u| {
            let spec = TenantSpec::new(u.name.clone(), TenantClass::Container);
            let hidden = u.origin == UnmanagedOrigin::OtherHost;
            (spec, None, &u.jobs, false, hidden, NO_HOST)
        });
        let sources = sc
            .tenants
            .iter()
            .map(|t| {
                let host = t.host.map_or(NO_HOST, |h| h as u32);
                (t.spec.clone(), t.vm_path, &t.jobs, true, false, host)
            })
            .chain(unmanaged);
        for (ti, (spec, vm_path, jobs, managed, hidden, host)) in sources.enumerate() {
            if managed {
                e.by_name.insert(spec.name.clone(), ti as u32);
            }
            let vm = spec.class == TenantClass::Vm;
            e.tenants.push(TenantRt {
                spec: Arc::new(spec),
                throttle: Default::default(),
                path: vm_path.map(|p| {
                    (
                        Stage {
                            slots: p.threads,
                            ..Default::default()
                        },
                        p.overhead.as_nanos().max(1) as u64,
                    )
                }),
                counters: Counters {
                    latency_ns_total: vm.then_some(0),
                    completions: vm.then_some(0),
                    ..Default::default()
                },
                acc: WindowAcc::default(),
                latency: LatencyRecorder::default(),
                managed,
                hidden,
                host,
                activity: Activity::default(),
            });
            for job in jobs {
                e.add_job(ti as u32, job);
            }
        }
        for (ci, (at, _)) in sc.device.changes.iter().enumerate() {
            e.push(
                at.as_nanos() as u64,
                Kind::Scheduled,
                ci as u32,
                DEVICE_CHANGE,
            );
        }
        e
    }

    /// One job of tenant `tenant`, its phases on the queue.
    fn add_job(&mut self, tenant: u32, job: &'s Job) {
        let ji = self.jobs.len() as u32;
        self.job_specs.push(job);
        let spacing_ns = job.rate.map(|r| match r {
            Rate::Iops(n) => NS / n,
            Rate::BytesPerSec(b) => job.bs as f64 * NS / b,
            Rate::Cost(_) => unreachable!("validated: job rates are bytes or IOPS"),
        });
        self.jobs.push(JobRt {
            tenant,
            bs: job.bs as u32,
            read_share: job.read_share,
            seq: job.rw.sequential(),
            spacing_ns,
            poisson: job.rate_process == RateProcess::Poisson,
            iodepth: 1,
            instances: Vec::new(),
        });
        for (si, (at, _)) in job.schedule.iter().enumerate() {
            self.push(at.as_nanos() as u64, Kind::Phase, ji, si as u32);
        }
    }

    fn push(&mut self, time: u64, kind: Kind, a: u32, b: u32) {
        self.seq += 1;
        self.events.push(Event::new(time, self.seq, kind, a, b));
    }

    fn dir(write: bool) -> usize {
        write as usize
    }

    // ---- jobs ----

    fn apply_phase(&mut self, job: u32, index: u32) {
        let JobState { numjobs, iodepth } = self.job_specs[job as usize].schedule[index as usize].1;
        self.jobs[job as usize].iodepth = iodepth;
        while (self.jobs[job as usize].instances.len() as u32) < numjobs {
            let id = self.instances.len() as u32;
            // fio processes start at slightly different moments.
            let phase = match self.jobs[job as usize].spacing_ns {
                Some(s) => (self.rng.random::<f64>() * s) as u64,
                None => 0,
            };
            self.instances.push(Instance {
                job,
                active: false,
                outstanding: 0,
                next_at: self.now + phase,
                wake_pending: false,
            });
            self.jobs[job as usize].instances.push(id);
        }
        let ids = self.jobs[job as usize].instances.clone();
        for (k, &id) in ids.iter().enumerate() {
            let inst = &mut self.instances[id as usize];
            let was = inst.active;
            inst.active = (k as u32) < numjobs;
            if inst.active && !was {
                inst.next_at = inst.next_at.max(self.now);
            }
            if inst.active {
                self.try_issue(id);
            }
        }
        let tenant = self.jobs[job as usize].tenant;
        let running = self
            .jobs
            .iter()
            .filter(|j| j.tenant == tenant)
            .flat_map(|j| &j.instances)
            .any(|&i| self.instances[i as usize].active);
        self.tenants[tenant as usize]
            .activity
            .set(running, self.now);
    }

    fn try_issue(&mut self, id: u32) {
        loop {
            let inst = &self.instances[id as usize];
            let job = &self.jobs[inst.job as usize];
            if !inst.active || inst.outstanding >= job.iodepth {
                return;
            }
            if let Some(spacing) = job.spacing_ns {
                if self.now < inst.next_at {
                    if !inst.wake_pending {
                        let at = inst.next_at;
                        self.instances[id as usize].wake_pending = true;
                        self.push(at, Kind::Wake, id, 0);
                    }
                    return;
                }
                let gap = if job.poisson {
                    spacing * self.rng.sample::<f64, _>(Exp1)
                } else {
                    spacing
                };
                let inst = &mut self.instances[id as usize];
                let behind = self.now.saturating_sub(RATE_BACKLOG_NS);
                inst.next_at = inst.next_at.max(behind) + gap as u64;
            }
            let (tenant, bs, read_share, seq) = (job.tenant, job.bs, job.read_share, job.seq);
            let write =
                !(read_share >= 1.0 || (read_share > 0.0 && self.rng.random::<f64>() < read_share));
            let dir = if write {
                Direction::Write
            } else {
                Direction::Read
            };
            let cost = self.sc.device.cost.io_cost(dir, bs as f64, seq);
            let model_cost = self.sc.policy_model.io_cost(dir, bs as f64, seq);
            let io = Io {
                tenant,
                instance: id,
                write,
                seq,
                bytes: bs,
                issued: self.now,
                cost,
                model_cost,
                hidden: self.tenants[tenant as usize].hidden,
                host: self.tenants[tenant as usize].host,
            };
            let idx = match self.free.pop() {
                Some(i) => {
                    self.ios[i as usize] = io;
                    i
                }
                None => {
                    self.ios.push(io);
                    (self.ios.len() - 1) as u32
                }
            };
            self.instances[id as usize].outstanding += 1;
            self.issued += 1;
            self.throttle_submit(idx);
        }
    }

    // ---- blk-throttle ----

    fn throttle_submit(&mut self, idx: u32) {
        let io = self.ios[idx as usize];
        let now = self.now;
        let th = &mut self.tenants[io.tenant as usize].throttle[Self::dir(io.write)];
        if th.queue.is_empty() {
            if th.iops.rate.is_none() && th.bps.rate.is_none() {
                return self.after_throttle(idx);
            }
            th.iops.refill(now);
            th.bps.refill(now);
            if th.iops.fits(1.0) && th.bps.fits(io.bytes as f64) {
                th.iops.tokens -= 1.0;
                th.bps.tokens -= io.bytes as f64;
                return self.after_throttle(idx);
            }
        }
        th.queue.push_back(idx);
        if th.queue.len() == 1 {
            self.schedule_release(io.tenant, Self::dir(io.write));
        }
    }

    fn schedule_release(&mut self, tenant: u32, dir: usize) {
        let th = &self.tenants[tenant as usize].throttle[dir];
        let Some(&head) = th.queue.front() else {
            return;
        };
        let bytes = self.ios[head as usize].bytes as f64;
        let wait = th
            .iops
            .wait_ns(1.0)
            .max(th.bps.wait_ns(bytes))
            .ceil()
            .max(1.0);
        let generation = th.generation;
        self.push(
            self.now + wait as u64,
            Kind::Release,
            tenant,
            (dir as u32) | (generation << 1),
        );
    }

    fn release(&mut self, tenant: u32, tag: u32) {
        let dir = (tag & 1) as usize;
        let now = self.now;
        if self.tenants[tenant as usize].throttle[dir].generation != tag >> 1 {
            return;
        }
        loop {
            let th = &mut self.tenants[tenant as usize].throttle[dir];
            th.iops.refill(now);
            th.bps.refill(now);
            let Some(&head) = th.queue.front() else {
                return;
            };
            let bytes = self.ios[head as usize].bytes as f64;
            if !(th.iops.fits(1.0) && th.bps.fits(bytes)) {
                break;
            }
            th.queue.pop_front();
            if th.iops.rate.is_some() {
                th.iops.tokens -= 1.0;
            }
            if th.bps.rate.is_some() {
                th.bps.tokens -= bytes;
            }
            self.after_throttle(head);
        }
        self.schedule_release(tenant, dir);
    }

    fn set_caps(&mut self, tenant: u32, caps: &Caps) {
        let now = self.now;
        for (dir, d) in [(0usize, Direction::Read), (1, Direction::Write)] {
            let th = &mut self.tenants[tenant as usize].throttle[dir];
            th.iops.set_rate(caps.iops(d).map(|v| v / NS), now);
            th.bps.set_rate(caps.bps(d).map(|v| v / NS), now);
            // The generation rides in 28 bits of a release event's tag.
            th.generation = th.generation.wrapping_add(1) & 0x0fff_ffff;
            if !th.queue.is_empty() {
                let tag = dir as u32 | (th.generation << 1);
                self.release(tenant, tag);
            }
        }
    }

    // ---- VM path and device ----

    fn after_throttle(&mut self, idx: u32) {
        let tenant = self.ios[idx as usize].tenant as usize;
        match &mut self.tenants[tenant].path {
            Some((stage, overhead)) => {
                if stage.busy < stage.slots {
                    stage.busy += 1;
                    let at = self.now + *overhead;
                    self.push(at, Kind::PathDone, idx, 0);
                } else {
                    stage.queue.push_back(idx);
                }
            }
            None => self.device_submit(idx),
        }
    }

    fn path_done(&mut self, idx: u32) {
        let tenant = self.ios[idx as usize].tenant as usize;
        let (stage, overhead) = self.tenants[tenant]
            .path
            .as_mut()
            .expect("path event for a VM");
        let overhead = *overhead;
        if let Some(next) = stage.queue.pop_front() {
            let at = self.now + overhead;
            self.push(at, Kind::PathDone, next, 0);
        } else {
            stage.busy -= 1;
        }
        self.device_submit(idx);
    }

    fn account_device(&mut self) {
        let dt = self.now - self.dev.last_change;
        let depth = self.dev.local_depth;
        self.dev.queue_area += depth as u128 * dt as u128;
        if depth > 0 {
            self.dev.busy_ns += dt;
        }
        self.dev.last_change = self.now;
    }

    fn device_submit(&mut self, idx: u32) {
        self.account_device();
        let io = self.ios[idx as usize];
        if !io.hidden {
            self.dev.local_depth += 1;
        }
        if let Some(view) = self.host_views.get_mut(io.host as usize) {
            view.account(self.now);
            view.depth += 1;
        }
        if let DeviceShape::RateLimited {
            idle_latency,
            burst,
        } = self.sc.device.shape
        {
            self.through_bucket(idx, idle_latency, burst);
        } else if self.dev.stage.busy < self.dev.stage.slots {
            self.dev.stage.busy += 1;
            self.device_start(idx);
        } else {
            self.dev.stage.queue.push_back(idx);
        }
    }

    /// What one I/O takes of the device as it is now (ns of the whole
    /// device: its cost, slowed by a capacity change and a write cliff),
    /// and that cost in the model's units; counts what was written.
    fn true_cost(&mut self, io: &Io) -> (f64, f64) {
        let d = &self.sc.device;
        let mut cost = io.cost / self.dev.capacity_factor;
        if io.write {
            if let Some((after, factor)) = d.write_cliff {
                if self.dev.written >= after {
                    cost *= factor;
                }
            }
            self.dev.written += io.bytes as u64;
        }
        self.dev.win_model_cost += io.model_cost;
        self.dev.win_true_cost += cost;
        (cost * NS, cost)
    }

    /// A rate-limited device: the bucket lets the I/O through at its rate
    /// (in arrival order, `burst` ns ahead of it at most), then the fast
    /// device behind it takes `idle_latency`.
    fn through_bucket(&mut self, idx: u32, idle_latency: f64, burst: f64) {
        let io = self.ios[idx as usize];
        let (spacing, _) = self.true_cost(&io);
        let now = self.now as f64;
        let start = now.max(self.dev.bucket_tat - burst);
        self.dev.bucket_tat = self.dev.bucket_tat.max(start) + spacing;
        let mut service = idle_latency;
        if self.sc.device.jitter > 0.0 {
            let tail: f64 = self.rng.sample(Exp1);
            let j = self.sc.device.jitter;
            service *= 1.0 - j + j * tail;
        }
        self.push(
            (start + service).max(now + 1.0) as u64,
            Kind::Complete,
            idx,
            0,
        );
    }

    fn device_start(&mut self, idx: u32) {
        let io = self.ios[idx as usize];
        let d = &self.sc.device;
        let (cost_ns, _) = self.true_cost(&io);
        let mut service = cost_ns * d.parallelism as f64;
        if let DeviceShape::Gc { depth, slowdown } = d.shape {
            // `depth` channels at the model's rate; past them in service,
            // every I/O takes longer: more in flight, less served.
            let past = self.dev.stage.busy.saturating_sub(depth) as f64;
            service = cost_ns * depth as f64 * (1.0 + slowdown * past / depth as f64);
        }
        if d.jitter > 0.0 {
            let tail: f64 = self.rng.sample(Exp1);
            service *= 1.0 - d.jitter + d.jitter * tail;
        }
        self.push(self.now + service.max(1.0) as u64, Kind::Complete, idx, 0);
    }

    fn complete(&mut self, idx: u32) {
        self.account_device();
        if !matches!(self.sc.device.shape, DeviceShape::RateLimited { .. }) {
            if let Some(next) = self.dev.stage.queue.pop_front() {
                self.device_start(next);
            } else {
                self.dev.stage.busy -= 1;
            }
        }
        let io = self.ios[idx as usize];
        self.free.push(idx);
        self.completed += 1;
        if !io.hidden {
            self.dev.local_depth -= 1;
            self.dev.completions += 1;
        }
        if let Some(view) = self.host_views.get_mut(io.host as usize) {
            view.account(self.now);
            view.depth -= 1;
            view.completions += 1;
        }
        let latency = self.now - io.issued;
        let t = &mut self.tenants[io.tenant as usize];
        let c = &mut t.counters;
        if io.write {
            c.write_ios += 1;
            c.write_bytes += io.bytes as u64;
            c.write_seq_ios += io.seq as u64;
        } else {
            c.read_ios += 1;
            c.read_bytes += io.bytes as u64;
            c.read_seq_ios += io.seq as u64;
        }
        if let (Some(total), Some(n)) = (c.latency_ns_total.as_mut(), c.completions.as_mut()) {
            *total += latency;
            *n += 1;
        }
        t.acc.ios += 1;
        t.acc.bytes += io.bytes as u64;
        t.acc.cost += io.cost;
        t.acc.latency_ns += latency;
        if !io.hidden {
            self.dev.win_latency_ns += latency;
            self.dev.win_ios += 1;
        }
        if t.managed && io.issued >= self.warmup_ns {
            t.latency.record_ns(latency);
        }
        self.instances[io.instance as usize].outstanding -= 1;
        self.try_issue(io.instance);
    }

    // ---- windows ----

    fn close_window(&mut self) {
        self.account_device();
        let w = self.window_ns as f64 / NS;
        let t = (self.now - self.window_ns) as f64 / NS;
        let (now, window_ns) = (self.now, self.window_ns);
        let tenants = self
            .tenants
            .iter_mut()
            .filter(|t| t.managed)
            .map(|t| {
                let acc = std::mem::take(&mut t.acc);
                let active_share = t.activity.close(now, window_ns);
                TenantWindow {
                    got: acc.rates(w),
                    demand: None,
                    mean_latency_ms: (acc.ios > 0)
                        .then(|| acc.latency_ns as f64 / acc.ios as f64 / 1e6),
                    cap_cost: None,
                    active_share,
                }
            })
            .collect();
        let unmanaged = self
            .tenants
            .iter_mut()
            .filter(|t| !t.managed)
            .map(|t| std::mem::take(&mut t.acc))
            .reduce(|a, b| WindowAcc {
                ios: a.ios + b.ios,
                bytes: a.bytes + b.bytes,
                cost: a.cost + b.cost,
                latency_ns: a.latency_ns + b.latency_ns,
            })
            .map(|acc| acc.rates(w));
        if self.dev.win_true_cost > 0.0 {
            self.dev.true_capacity = Some(self.dev.win_model_cost / self.dev.win_true_cost);
        }
        self.dev.win_model_cost = 0.0;
        self.dev.win_true_cost = 0.0;
        let area = self.dev.queue_area - self.dev.win_area;
        let busy = self.dev.busy_ns - self.dev.win_busy;
        let device = DeviceWindow {
            avg_queue: area as f64 / self.window_ns as f64,
            utilisation: busy as f64 / self.window_ns as f64,
            mean_latency_ms: (self.dev.win_ios > 0)
                .then(|| self.dev.win_latency_ns as f64 / self.dev.win_ios as f64 / 1e6),
            capacity: self.capacity_estimate,
            true_capacity: self.dev.true_capacity,
            unmanaged,
        };
        self.dev.win_area = self.dev.queue_area;
        self.dev.win_busy = self.dev.busy_ns;
        self.dev.win_latency_ns = 0;
        self.dev.win_ios = 0;
        self.windows.push(Window { t, tenants, device });
    }

    /// One control interval of whatever drives the throttles; `early`: cut
    /// short by a look (one host only).
    fn control(
        &mut self,
        driver: &mut Driver,
        decisions: &mut DecisionStats,
        trace: &mut Vec<CapacityTraceEntry>,
        early: bool,
    ) {
        let now = Duration::from_nanos(self.now);
        match driver {
            Driver::Nothing => {}
            Driver::OneHost(c) => {
                let mut backend = SimBackend {
                    engine: &mut *self,
                    view: None,
                };
                let report = if early {
                    c.tick_early(now, &mut backend)
                } else {
                    c.tick(now, &mut backend)
                };
                decisions.record(report.decision_time);
                self.capacity_estimate = c.capacity_estimate();
                if let Some(step) = c.capacity_step() {
                    trace.push(CapacityTraceEntry {
                        t: now.as_secs_f64(),
                        step,
                    });
                }
            }
            Driver::HostsAlone(controllers) => {
                for (h, c) in controllers.iter_mut().enumerate() {
                    let Some(c) = c else { continue };
                    let view = Some(h);
                    let report = c.tick(now, &mut SimBackend { engine: self, view });
                    decisions.record(report.decision_time);
                }
            }
            Driver::Cluster(cluster) => {
                cluster.tick(|h, c| {
                    let view = Some(h);
                    let report = c.tick(now, &mut SimBackend { engine: self, view });
                    decisions.record(report.decision_time);
                });
                let at = self.now + cluster.delay().as_nanos() as u64;
                self.push(at, Kind::Scheduled, 0, ALLOCATE);
            }
        }
    }

    /// Runs to the end. `control` None runs no controller at all.
    pub fn run(mut self, control: Option<Control>, progress: &dyn Fn(f64)) -> EngineOutput {
        let end = self.sc.duration.as_nanos() as u64;
        let mut run = Run {
            driver: self.driver(control),
            decisions: DecisionStats::default(),
            capacity_trace: Vec::new(),
            generation: 0,
            end,
            interval: self.sc.interval.as_nanos() as u64,
            look_every: 0,
        };
        self.schedule_first(&mut run);
        while let Some(ev) = self.events.pop() {
            if ev.time() > end {
                break;
            }
            self.now = ev.time();
            let (a, b) = (ev.a(), ev.b());
            match ev.kind() {
                Kind::Complete => self.complete(a),
                Kind::PathDone => self.path_done(a),
                Kind::Wake => {
                    self.instances[a as usize].wake_pending = false;
                    self.try_issue(a);
                }
                Kind::Release => self.release(a, b),
                Kind::Phase => self.apply_phase(a, b),
                Kind::Scheduled if b == DEVICE_CHANGE => {
                    self.dev.capacity_factor = self.sc.device.changes[a as usize].1;
                }
                Kind::Control if a == run.generation => self.decide(&mut run, false),
                Kind::Control => {}
                Kind::Scheduled if b == LOOK => self.look(&mut run),
                Kind::Scheduled if b == ALLOCATE => self.allocate(&mut run),
                Kind::Scheduled => self.host_event(&mut run.driver, a as usize),
                Kind::Window => {
                    self.close_window();
                    progress(self.now as f64 / end as f64);
                    if self.now + self.window_ns <= end {
                        self.push(self.now + self.window_ns, Kind::Window, 0, 0);
                    }
                }
            }
        }
        self.output(run)
    }

    /// What drives the throttles: `control` on one host, the cluster or
    /// each cluster host alone, as the scenario has hosts.
    fn driver(&self, control: Option<Control>) -> Driver {
        let specs: Vec<Arc<TenantSpec>> = self
            .tenants
            .iter()
            .filter(|t| t.managed)
            .map(|t| t.spec.clone())
            .collect();
        let ctx = PolicyContext {
            cost: self.sc.policy_model,
            capacity: 1.0,
        };
        match (control, &self.sc.cluster) {
            // The simulator models no kernel controller; only a real
            // device's bench asks for one (`iofloor sim` refuses them).
            (None | Some(Control::Kernel(_)), _) => Driver::Nothing,
            (Some(c), None) => Driver::OneHost(Controller::new(
                policy::build(c.kind(), &self.sc.policy, ctx),
                specs,
            )),
            (Some(Control::Policy(kind)), Some(shape)) => {
                Driver::Cluster(Box::new(SimCluster::new(self.sc, shape, kind, &specs)))
            }
            (Some(Control::HostsAlone(kind)), Some(cluster)) => Driver::HostsAlone(
                (0..cluster.hosts.len())
                    .map(|h| {
                        let policy = policy::build(kind, &self.sc.policy, ctx);
                        Some(Controller::new(policy, tenants_on(self.sc, &specs, h)))
                    })
                    .collect(),
            ),
        }
    }

    /// The first decision, look, host events and window on the queue.
    fn schedule_first(&mut self, run: &mut Run) {
        if !matches!(run.driver, Driver::Nothing) {
            self.push(0, Kind::Control, run.generation, 0);
        }
        if let (Some(every), Driver::OneHost(_)) = (self.sc.watch_interval, &run.driver) {
            run.look_every = every.as_nanos() as u64;
            self.push(run.look_every, Kind::Scheduled, 0, LOOK);
        }
        if matches!(run.driver, Driver::Cluster(_) | Driver::HostsAlone(_)) {
            if let Some(c) = &self.sc.cluster {
                for (ei, (at, _, _)) in c.events.iter().enumerate() {
                    self.push(at.as_nanos() as u64, Kind::Scheduled, ei as u32, HOST_EVENT);
                }
            }
        }
        self.push(self.window_ns, Kind::Window, 0, 0);
    }

    /// A decision (an early one after a look), and the next one an
    /// interval from now.
    fn decide(&mut self, run: &mut Run, early: bool) {
        self.control(
            &mut run.driver,
            &mut run.decisions,
            &mut run.capacity_trace,
            early,
        );
        if self.now + run.interval <= run.end {
            self.push(self.now + run.interval, Kind::Control, run.generation, 0);
        }
    }

    /// A look between intervals; one that sees an overload decides now,
    /// and the interval pending is replaced by one counted from here.
    fn look(&mut self, run: &mut Run) {
        let now = Duration::from_nanos(self.now);
        let early = match &mut run.driver {
            Driver::OneHost(c) => c.look(
                now,
                &mut SimBackend {
                    engine: &mut *self,
                    view: None,
                },
            ),
            _ => false,
        };
        if early {
            run.generation += 1;
            self.decide(run, true);
        }
        if self.now + run.look_every <= run.end {
            self.push(self.now + run.look_every, Kind::Scheduled, 0, LOOK);
        }
    }

    /// The cluster's allocation, which the hosts apply as it arrives.
    fn allocate(&mut self, run: &mut Run) {
        let Driver::Cluster(c) = &mut run.driver else {
            return;
        };
        let now = Duration::from_nanos(self.now);
        if let Some(took) = c.allocate(now) {
            run.decisions.record(took);
            if let Some(step) = c.capacity_step() {
                run.capacity_trace.push(CapacityTraceEntry {
                    t: now.as_secs_f64(),
                    step,
                });
            }
        }
        self.capacity_estimate = c.capacity();
        let decisions = &mut run.decisions;
        c.each_running_host(|h, controller| {
            let backend = &mut SimBackend {
                engine: &mut *self,
                view: Some(h),
            };
            if let Some(news) = controller.apply_news(now, backend) {
                decisions.record(news.decision_time);
            }
        });
    }

    /// The scenario's host event number `event` (a daemon killed, cut off
    /// or back).
    fn host_event(&mut self, driver: &mut Driver, event: usize) {
        match driver {
            Driver::Cluster(c) => c.event(event, Duration::from_nanos(self.now)),
            Driver::HostsAlone(controllers) => {
                // A killed daemon's caps stay as it last wrote them; hosts
                // alone have no etcd to be cut off from.
                let event = self.sc.cluster.as_ref().map(|c| c.events[event]);
                if let Some((_, h, ClusterEventKind::Kill)) = event {
                    controllers[h] = None;
                }
            }
            _ => {}
        }
    }

    fn output(self, run: Run) -> EngineOutput {
        let latency = self
            .tenants
            .iter()
            .filter(|t| t.managed)
            .map(|t| t.latency.summary())
            .collect();
        let in_flight: u64 = self.instances.iter().map(|i| i.outstanding as u64).sum();
        let (exchange, allocators) = match run.driver {
            Driver::Cluster(c) => (Some(c.exchange()), c.takeovers),
            _ => (None, Vec::new()),
        };
        EngineOutput {
            windows: self.windows,
            latency,
            decisions: run.decisions,
            capacity_trace: run.capacity_trace,
            ios_completed: self.completed,
            ios_issued: self.issued,
            ios_in_flight: in_flight,
            exchange,
            allocators,
        }
    }
}

/// A run's control: what drives the throttles, its decisions' times, the
/// generation of the pending decision (an early one replaces it), and the
/// run's end, interval and look period (0: no looks), in ns.
struct Run {
    driver: Driver,
    decisions: DecisionStats,
    capacity_trace: Vec<CapacityTraceEntry>,
    generation: u32,
    end: u64,
    interval: u64,
    look_every: u64,
}

/// What drives the throttles of a run.
enum Driver {
    Nothing,
    OneHost(Controller),
    /// One controller per cluster host, each over its own tenants (None
    /// once its daemon was killed).
    HostsAlone(Vec<Option<Controller>>),
    Cluster(Box<SimCluster>),
}

/// The engine seen through the same interface as a host: cumulative counters
/// in, kernel-style caps out. `view` is the cluster host whose disk counters
/// it reads (None: every I/O this host sees).
struct SimBackend<'e, 's> {
    engine: &'e mut Engine<'s>,
    view: Option<usize>,
}

#[derive(Debug)]
struct UnknownTenant(String);

impl std::fmt::Display for UnknownTenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no simulated tenant `{}`", self.0)
    }
}

impl Backend for SimBackend<'_, '_> {
    type Error = UnknownTenant;

    fn read_counters(&mut self, tenant: &TenantSpec) -> Result<Counters, UnknownTenant> {
        let i = *self
            .engine
            .by_name
            .get(&tenant.name)
            .ok_or_else(|| UnknownTenant(tenant.name.clone()))?;
        Ok(self.engine.tenants[i as usize].counters)
    }

    fn read_device(&mut self) -> Option<DeviceCounters> {
        if let Some(h) = self.view {
            let view = self.engine.host_views.get_mut(h)?;
            view.account(self.engine.now);
            return Some(view.counters());
        }
        self.engine.account_device();
        Some(DeviceCounters {
            busy_ns: self.engine.dev.busy_ns,
            queue_ns: self.engine.dev.queue_area.min(u64::MAX as u128) as u64,
            completions: self.engine.dev.completions,
        })
    }

    fn apply_caps(&mut self, tenant: &TenantSpec, caps: &Caps) -> Result<(), UnknownTenant> {
        let i = *self
            .engine
            .by_name
            .get(&tenant.name)
            .ok_or_else(|| UnknownTenant(tenant.name.clone()))?;
        self.engine.set_caps(i, caps);
        Ok(())
    }
}
