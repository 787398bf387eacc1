//! Closed-loop capacity: what the device delivers now, learned from the work
//! it served against the I/Os it had in flight, not trusted from the model.
//!
//! Each whole interval is a point of the device's curve X(N), work served
//! against mean I/Os in flight ([`Curve`]; Little's law, N = X·R, gives the
//! latency). The curve rises while more in flight brings more served and is
//! flat at its **plateau**. Overload is in flight rising while served work
//! does not, the device short of what was allowed: the estimate becomes what
//! was served, and the queue drains for an interval. A busy device whose
//! served work grows with its queue is not overloaded, however far its
//! latency rose. A protected tenant short of its floor by latency alone
//! (k I/Os in flight get k ÷ R) steps the device down by half the shortfall.
//! Up is the same model (BBR): regain the level known, probe past it only
//! while learning, keep a probe only while served follows it. Floors are
//! never priced out without proof; bad figures hold the estimate
//! ([`Fault`]). docs/policies.md, "Closed-loop capacity", has the model and
//! its figures; docs/design/capacity-history.md the loop it replaced.

mod curve;

pub use curve::{Curve, CurvePoint, PointKind};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::Duration;

/// Intervals a point of the curve, a ceiling or a proof is remembered: a
/// device that changed unseen is relearned within two minutes.
pub(crate) const MEMORY_INTERVALS: u32 = 120;
/// In-flight counts within this share are one: a steady load's queue moves
/// by a fifth from interval to interval.
pub(crate) const IN_FLIGHT_NOISE: f64 = 0.25;
/// Served within this share is the same: a throttle holds a rate to a few
/// per cent.
pub(crate) const SERVED_NOISE: f64 = 0.03;
/// A probe's first step: what a device at its plateau absorbs in the 3 % the
/// policy does not hand out.
const PROBE_STEP: f64 = 0.01;
/// The largest step, once the device has served past what was known: BBR's
/// startup gain, which finds a 3x pessimistic model in about ten intervals.
const STEP_MAX: f64 = 0.25;
/// Share of the gap to the level known good closed per interval of room:
/// most of the way at once, without overshooting a level that moved.
const REGAIN_SHARE: f64 = 0.4;
/// The deepest drain below what an overload served: a queue larger than
/// this drains over several intervals rather than idling the device.
const DEEPEST_DRAIN: f64 = 0.7;
/// Whole intervals in a row with a floor the device held short and less
/// served than the floors need, before the estimate may price a floor out:
/// one interval's dip is no proof.
pub const PROOF_INTERVALS: usize = 3;
/// The least a latency target is judged at, as a multiple of the device's
/// own latency: below it no cap meets the target.
const TARGET_REACH: f64 = 1.25;

/// What the loop sees of one interval (rates in cost units per second).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Observation {
    /// Mean time an I/O spent at the device (µs).
    pub latency_us: Option<f64>,
    /// Mean I/Os in flight at the device (iostat `aqu-sz`).
    pub avg_queue: Option<f64>,
    /// What the device served of the load the policy knows of.
    pub served: f64,
    /// Some tenant is held below what it asks by a cap of ours.
    pub capped: bool,
    /// What the tenants our caps hold used less than those caps.
    pub capped_shortfall: f64,
    /// A capped tenant used (nearly) all of its cap.
    pub wants_more: bool,
    /// Use ÷ floor of the protected tenant furthest below its floor with no
    /// cap of ours on it, over a whole interval; `None` while all are met.
    pub floor_share: Option<f64>,
    /// What the active floors need (divided by the share handed out).
    pub floors_need: f64,
    /// The share of the estimate handed out while contended.
    pub handed_out: f64,
    #[serde(skip)]
    pub interval: Option<Duration>,
    /// A tenant with a floor active in the last interval is gone.
    pub departed: bool,
    /// Decided on a look between intervals: latency and queue are its
    /// stretch, served the interval's scaled to the device's rate there.
    pub early: bool,
}

/// The loop's verdict on an interval (docs/policies.md has each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Unknown,
    Overloaded,
    LatencyBound,
    Room,
    Idle,
}

/// Why the loop held its estimate without judging an interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    NoDeviceFigures,
    DeviceStopped,
    NoQueueIntegral,
    Absurd,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Fault::NoDeviceFigures => "no device figures (counters gone backwards or unreadable)",
            Fault::DeviceStopped => "tenants were served but the device counted no I/O",
            Fault::NoQueueIntegral => "the device counts completions but no time in queue",
            Fault::Absurd => "a latency or queue no device has (a counter that jumped?)",
        })
    }
}

/// Where the loop stands; its transitions are all in [`CapacityLoop::act`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "phase")]
pub enum Phase {
    /// At the estimate, or regaining the level known good.
    Steady,
    /// Raised past the level known, by `step` last; kept while the device
    /// serves what is handed out.
    Probing { step: f64 },
    /// Cut below `level`, what an overload served, while its queue drains.
    Draining { level: f64 },
}

/// What the loop is still learning of the device's level: from the start
/// (the model holds until the device serves past it), after it showed
/// itself faster, or nothing (a limit is known).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Learning {
    Start,
    Faster,
    Known,
}

/// One interval as the loop judged it, for traces, the status API and logs:
/// what it was shown and what it made of it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CapacityStep {
    pub verdict: Verdict,
    pub phase: Phase,
    /// The estimate after the interval, cost units per second.
    pub estimate: f64,
    /// The level regained fast: the plateau or ceiling known, else the model.
    pub level: f64,
    /// The curve's plateau, where an overload has found one.
    pub plateau: Option<f64>,
    pub learning: Learning,
    /// The operator's latency target as judged (µs), where one is set.
    pub latency_limit_us: Option<f64>,
    /// Why the interval was not judged, if it was not.
    pub fault: Option<Fault>,
    #[serde(flatten)]
    pub seen: Observation,
}

/// Bounds of the estimate and the operator's latency target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CapacitySettings {
    /// Mean device latency (µs) the device is held under, where set.
    pub latency_target_us: Option<f64>,
    /// Bounds of the estimate, as multiples of the model's capacity.
    pub min_factor: f64,
    pub max_factor: f64,
    /// How far above its entitlement a cap holds a tenant (the policy's
    /// enforcement margin): a level held for a floor short by latency may
    /// sit that far below what the floors need, every held tenant's cap
    /// still at its floor.
    pub cap_margin: f64,
}

/// A level the estimate is held under with no full interval to show for it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ceiling {
    level: f64,
    /// Intervals since it was set.
    age: u32,
    /// Set for a floor held short by latency, not for the operator's
    /// target or a level resumed from elsewhere.
    for_a_floor: bool,
}

/// Proof that the device cannot serve the floors: what it served in the
/// last overloads in a row that held a floor short.
#[derive(Debug, Clone, Default)]
struct Proof {
    served: VecDeque<f64>,
    /// Intervals since the proof was last complete (`None`: never).
    age: Option<u32>,
}

impl Proof {
    /// The most the device served while proving itself short, or infinity.
    fn limit(&self) -> f64 {
        match self.age {
            Some(age) if age <= MEMORY_INTERVALS => self.served.iter().copied().fold(0.0, f64::max),
            _ => f64::INFINITY,
        }
    }

    fn record(&mut self, short: Option<f64>) {
        self.age = self.age.map(|a| a.saturating_add(1));
        match short {
            Some(served) => {
                if self.served.len() == PROOF_INTERVALS {
                    self.served.pop_front();
                }
                self.served.push_back(served);
                if self.served.len() == PROOF_INTERVALS {
                    self.age = Some(0);
                }
            }
            None => self.served.clear(),
        }
    }
}

/// The learned capacity and what it remembers.
#[derive(Debug, Clone)]
pub struct CapacityLoop {
    settings: CapacitySettings,
    model: f64,
    estimate: f64,
    phase: Phase,
    curve: Curve,
    /// A level the estimate is held under with no full interval to show for
    /// it (a floor held short by latency there, or a level resumed from
    /// another allocator), and its age.
    ceiling: Option<Ceiling>,
    /// What the loop is still learning, if anything: probes past the level
    /// known are allowed then. Once a limit is found, the level holds until
    /// it is forgotten: a probe into a full device costs the tenants that
    /// live on latency their p99.
    learning: Learning,
    proof: Proof,
    /// The point judged last: whether in-flight rose is asked against it.
    last: Option<CurvePoint>,
    /// The estimate before the last interval stepped it down, restored if
    /// the next shows a tenant gone (its last, partial interval looked short).
    undo: Option<f64>,
    /// What the last look that found the device full served, where it was
    /// not put on the curve: a second look that agrees with it is.
    look_full: Option<f64>,
    verdict: Verdict,
    last_step: Option<CapacityStep>,
}

impl CapacityLoop {
    /// Starts at the model's capacity (cost units per second).
    pub fn new(settings: CapacitySettings, model: f64) -> CapacityLoop {
        CapacityLoop {
            settings,
            model,
            estimate: model,
            phase: Phase::Steady,
            curve: Curve::default(),
            ceiling: None,
            learning: Learning::Start,
            proof: Proof::default(),
            last: None,
            undo: None,
            look_full: None,
            verdict: Verdict::Unknown,
            last_step: None,
        }
    }

    pub fn estimate(&self) -> f64 {
        self.estimate
    }

    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// The last interval as judged; `None` before the first.
    pub fn last_step(&self) -> Option<CapacityStep> {
        self.last_step
    }

    /// The curve's recent points, oldest first.
    pub fn curve(&self) -> &Curve {
        &self.curve
    }

    /// Continues from `estimate`, learned elsewhere (a new cluster allocator
    /// resumes the last allocation's): held as a ceiling, probed past only
    /// after the longest wait. Started fresh, a takeover grew towards the
    /// model at once and the quiet tenant missed its floor 4-8 s after it.
    pub fn resume(&mut self, estimate: f64) {
        if !estimate.is_finite() || estimate <= 0.0 {
            return;
        }
        let (low, high) = self.bounds();
        self.estimate = estimate.clamp(low, high);
        self.ceiling = Some(Ceiling {
            level: self.estimate,
            age: 0,
            for_a_floor: false,
        });
        self.learning = Learning::Known;
        self.phase = Phase::Steady;
    }

    fn bounds(&self) -> (f64, f64) {
        (
            self.model * self.settings.min_factor,
            self.model * self.settings.max_factor,
        )
    }

    /// The device's own latency, unqueued: the least on the curve (µs).
    pub fn least_latency_us(&self) -> Option<f64> {
        self.curve.least_latency_us()
    }

    /// The operator's target as judged: never below [`TARGET_REACH`] × the
    /// device's own latency, which no cap gets under.
    pub fn latency_limit_us(&self) -> Option<f64> {
        let target = self.settings.latency_target_us?;
        Some(
            self.least_latency_us()
                .map_or(target, |least| target.max(TARGET_REACH * least)),
        )
    }

    /// Whether the operator's target is within the device's reach; `None`
    /// without a target.
    pub fn target_in_reach(&self) -> Option<bool> {
        let target = self.settings.latency_target_us?;
        Some(self.latency_limit_us()? <= target)
    }

    /// Whether a look between intervals shows the overload this model
    /// defines starting: in flight at least doubled since the last judged
    /// point while the device completes hardly more (less than a quarter of
    /// the in-flight growth). A burst the device takes is judged at the
    /// interval's end; a queue it cannot take is answered within a look.
    pub fn overloaded_in_part(&self, latency_us: Option<f64>, avg_queue: Option<f64>) -> bool {
        let (Some(l), Some(q), Some(last)) = (latency_us, avg_queue, self.last) else {
            return false;
        };
        if !(l.is_finite() && l > 0.0 && q.is_finite()) {
            return false;
        }
        let in_flight = q / last.in_flight.max(1.0);
        let rate = (q / l) / (last.in_flight / last.latency_us);
        in_flight >= 2.0 && rate - 1.0 < (in_flight - 1.0) / 4.0
    }

    /// Learns from one interval; returns the new estimate.
    pub fn update(&mut self, obs: &Observation) -> f64 {
        self.age();
        self.undo_departure(obs);
        let judged = self.judge(obs);
        let point = judged.ok().flatten();
        self.verdict = match judged {
            Ok(Some((_, verdict))) => verdict,
            _ => Verdict::Unknown,
        };
        if let Some((point, verdict)) = point {
            if !obs.early {
                // The device held a floor short while serving less than the
                // floors need: overloaded, or draining the queue it built.
                let delivered = point.served / share_handed_out(obs);
                let short =
                    (obs.floor_share.is_some() && delivered < obs.floors_need).then_some(delivered);
                self.proof.record(short);
            }
            self.act(verdict, point, obs);
            let (low, high) = self.bounds();
            self.estimate = self.estimate.max(self.guard(obs)).clamp(low, high);
        }
        self.last_step = Some(self.step_of(obs, judged.err()));
        self.estimate
    }

    /// Ages what the loop remembers by one interval.
    fn age(&mut self) {
        self.curve.age();
        if let Some(c) = &mut self.ceiling {
            c.age += 1;
        }
        self.ceiling = self.ceiling.filter(|c| c.age <= MEMORY_INTERVALS);
    }

    /// A tenant that stopped in the last interval was short there, which
    /// looked like the device holding it: the step down for it is undone,
    /// unless the device proved itself short.
    fn undo_departure(&mut self, obs: &Observation) {
        if let Some(before) = self.undo.take() {
            if obs.departed && self.proof.limit().is_infinite() {
                self.estimate = before;
                self.phase = Phase::Steady;
                self.curve.forget_newest_full();
            }
        }
    }

    /// The interval's point and verdict, judged against the last point and
    /// what the loop knows; `Ok(None)` with nothing to judge (no I/O).
    fn judge(&self, obs: &Observation) -> Result<Option<(CurvePoint, Verdict)>, Fault> {
        let Some(mut point) = point_of(obs)? else {
            return Ok(None);
        };
        point.handed = self.estimate * share_handed_out(obs);
        let first = self.last.is_none();
        let last = self.last.unwrap_or(point);
        let (n, x, handed) = (point.in_flight, point.served, point.handed);
        let rose = queue_rose(&last, &point);
        let held = n >= last.in_flight * (1.0 - IN_FLIGHT_NOISE);
        let falling = !held;
        // Served that grew with its queue: a device with room, or an
        // interval that began idle (a burst from idle).
        let grew = x > last.served * (1.0 + SERVED_NOISE) && n > last.in_flight;
        let waiting = self.waiting(&point);
        // Short of what we allowed: the capped tenants materially under
        // their caps at a queue (without one, their own depth held them), or
        // a floor short with less served than handed out (on a FIFO path a
        // full device shows first in the tenants with few I/Os in flight).
        let capped_short = obs.capped_shortfall > SERVED_NOISE * handed && waiting;
        let short =
            capped_short || (obs.floor_share.is_some() && x < handed * (1.0 - SERVED_NOISE));
        // A probe is kept only while served rises with it (by half its step)
        // and no floor goes short: one that grew the queue found the plateau.
        let probe_failed = match self.phase {
            Phase::Probing { step, .. } => {
                obs.floor_share.is_some()
                    || capped_short
                    || (obs.wants_more && rose && x < last.served * (1.0 + step / 2.0))
            }
            _ => false,
        };
        // A queue that grew at a device serving no more, and less than was
        // handed out, is its plateau, shown by a floor or not (an uncapped
        // tenant filling a device slower than its model).
        let below_handed = x < handed * (1.0 - SERVED_NOISE);
        // A floor short behind a queue that holds, past what the device
        // holds unqueued by more than the served noise of an interval's
        // work: a backlog to drain, whatever the estimate handed out (the
        // burst guards of tenants starting together let it in), not a
        // latency to step down to (simulated cluster of 4 hosts × 5: a
        // queue of 194 on 5 slots read so held the device at 0.66).
        let backlog = obs.floor_share.is_some()
            && waiting
            && held
            && !grew
            && self.drain_share(&point, obs) < 1.0 - 2.0 * SERVED_NOISE;
        let overloaded = probe_failed
            || backlog
            || (rose && waiting && !grew && below_handed)
            || (short && (first || rose || (waiting && held)) && (capped_short || !grew));
        // A falling queue is the last step down (or a burst's end) taking
        // hold: no reason for another on latency.
        let verdict = if overloaded {
            Verdict::Overloaded
        } else if obs.capped
            && !obs.early
            && !falling
            && (obs.floor_share.is_some() || self.past_target(&point))
        {
            Verdict::LatencyBound
        } else if obs.wants_more && !capped_short {
            Verdict::Room
        } else {
            Verdict::Idle
        };
        Ok(Some((point, verdict)))
    }

    /// Whether an I/O or more waited beyond what the device holds at its
    /// least latency: a device holding only its own work shows that
    /// latency, whatever its shape.
    fn waiting(&self, point: &CurvePoint) -> bool {
        self.least_latency_us().is_none_or(|least| {
            point.latency_us > (1.0 + IN_FLIGHT_NOISE) * least
                && point.in_flight * (1.0 - least / point.latency_us) >= 1.0
        })
    }

    fn past_target(&self, point: &CurvePoint) -> bool {
        self.latency_limit_us()
            .is_some_and(|limit| point.latency_us > limit)
    }

    /// Every transition of the phase and the estimate, on a judged interval.
    fn act(&mut self, verdict: Verdict, mut point: CurvePoint, obs: &Observation) {
        let before = self.estimate;
        self.lift_ceiling(verdict, &point, obs);
        if let Phase::Draining { level } = self.phase {
            point.kind = PointKind::Draining;
            let falling = self
                .last
                .is_some_and(|last| point.in_flight < last.in_flight * (1.0 - IN_FLIGHT_NOISE));
            if verdict == Verdict::Overloaded {
                // Overloaded again: judged below.
            } else if falling && obs.floor_share.is_some() {
                // A floor still waits on a queue that is falling: the drain
                // goes on.
                self.record(point, obs);
                return;
            } else {
                // Drained, or the queue is not ours to drain: the level at
                // once, and a floor still short is judged as any.
                self.estimate = self.estimate.max(level);
                self.phase = Phase::Steady;
            }
        }
        match verdict {
            Verdict::Overloaded => {
                point.kind = PointKind::Full;
                self.found_limit();
                let drain = self.drain_share(&point, obs);
                self.estimate = point.served * drain;
                self.phase = if drain < 1.0 {
                    Phase::Draining {
                        level: point.served,
                    }
                } else {
                    Phase::Steady
                };
            }
            Verdict::LatencyBound => {
                point.kind = PointKind::Draining;
                self.estimate = self.estimate.min(self.latency_level(&point, obs));
                self.ceiling = Some(Ceiling {
                    level: self.estimate,
                    age: 0,
                    for_a_floor: obs.floor_share.is_some(),
                });
                self.phase = Phase::Steady;
            }
            Verdict::Room => self.room(&point, obs),
            Verdict::Idle => {
                if let Phase::Probing { .. } = self.phase {
                    self.phase = Phase::Steady;
                }
            }
            Verdict::Unknown => {}
        }
        let faster = |p: &CurvePoint| self.curve.shows_faster(p);
        if !obs.early
            && verdict == Verdict::Room
            && faster(&point)
            && self.last.is_some_and(|l| faster(&l))
        {
            // The same work waited a quarter less two intervals in a row
            // (one is a neighbour's pause): what bounded the estimate (a
            // plateau, a ceiling) was a device that is no longer there.
            self.ceiling = None;
            self.learning = Learning::Faster;
            self.curve.forget_all_but_newest();
        }
        self.undo = (self.estimate < before).then_some(before);
        self.record(point, obs);
    }

    /// A ceiling is a latency that held a floor short. With every floor
    /// met, the device disproves it by serving past it (tenants not held by
    /// it) with no queue growing, and it goes; or, with the estimate held
    /// at it, by answering there at the latency it has at clearly less work
    /// (its linear part reaches the ceiling), and it rises by a probe's
    /// step. One set in a transient (a burst's queue draining) otherwise
    /// held the device below what it serves unqueued for two minutes
    /// (simulated cluster of 10 hosts × 100: 0.86 of the device at its
    /// least latency). Without the latency at less work, one latency is no
    /// evidence: parallel queues answer at their own up to their last slot.
    fn lift_ceiling(&mut self, verdict: Verdict, point: &CurvePoint, obs: &Observation) {
        let Some(Ceiling { level: ceiling, .. }) = self.ceiling else {
            return;
        };
        if obs.floor_share.is_some() {
            return;
        }
        let rose = self.last.is_some_and(|last| queue_rose(&last, point));
        if point.shown() > ceiling * (1.0 + SERVED_NOISE) && !rose {
            self.ceiling = None;
        } else if verdict == Verdict::Room
            && self.estimate >= ceiling * (1.0 - 1e-9)
            && !self.waiting(point)
            && self.curve.linear_up_to(point)
        {
            if let Some(c) = &mut self.ceiling {
                c.level = ceiling * (1.0 + PROBE_STEP);
            }
        }
    }

    /// Keeps a judged point: the last one for the next judgement, and on
    /// the curve a whole interval's, or a look's that found the device full
    /// where the last look that did agrees within a look's noise (an eighth
    /// of an interval is about three times noisier: the rig's throttle
    /// showed 1.2 of the device in a burst there, and 0.88 of it full, which
    /// kept as the plateau held a ramp at 0.88 for the rest of its run).
    /// Kept from no look, a level the device lost (another host's load, a
    /// plateau aged out of the memory) was regained and found full by a
    /// look every few intervals, never learned (`cliff`: p99 7.8x alone).
    fn record(&mut self, point: CurvePoint, obs: &Observation) {
        let full = point.kind == PointKind::Full;
        let agrees = self.look_full.is_some_and(|seen| {
            (seen - point.served).abs() <= 3.0 * SERVED_NOISE * seen.max(point.served)
        });
        if !obs.early || (full && agrees) {
            self.curve.add(point);
            if full {
                self.look_full = None;
            }
        } else if full {
            self.look_full = Some(point.served);
        }
        self.last = Some(point);
    }

    /// A limit was found: the loop knows the device's level now.
    fn found_limit(&mut self) {
        self.learning = Learning::Known;
    }

    /// The level known good: the plateau found and any ceiling, the lower;
    /// with neither, the model or what the device served past it (after the
    /// device showed itself faster, the most it delivered lately).
    fn level(&self) -> f64 {
        let known = match (self.curve.plateau(), self.ceiling.map(|c| c.level)) {
            (Some(plateau), Some(ceiling)) => Some(plateau.min(ceiling)),
            (plateau, ceiling) => plateau.or(ceiling),
        };
        known.unwrap_or_else(|| match self.learning {
            // Faster by how much is not known: regained towards the most
            // it delivered lately, probed past.
            Learning::Faster => self.estimate.max(self.curve.most_delivered()),
            _ => self.model.max(self.curve.most_delivered()),
        })
    }

    /// An interval of room: regain the level known, or probe past it.
    fn room(&mut self, point: &CurvePoint, obs: &Observation) {
        let level = self.level();
        if self.estimate < level * (1.0 - 1e-9) {
            let gap = level - self.estimate;
            self.estimate = (self.estimate + REGAIN_SHARE * gap)
                .max(self.estimate * (1.0 + PROBE_STEP))
                .min(level);
            if let Phase::Probing { .. } = self.phase {
                self.phase = Phase::Steady;
            }
            return;
        }
        match self.phase {
            Phase::Probing { step, .. } => {
                if self
                    .last
                    .is_some_and(|last| point.served < last.served * (1.0 + step / 2.0))
                {
                    // Served did not follow the raise, nor did a queue
                    // grow: the tenants took no more. Undone, not a limit.
                    self.estimate /= 1.0 + step;
                    self.phase = Phase::Steady;
                    return;
                }
                // Served what the raise handed out: kept. Steps grow while no
                // plateau is known or the device serves past it.
                let past_known = self
                    .curve
                    .plateau()
                    .is_none_or(|plateau| point.served > plateau * (1.0 + SERVED_NOISE));
                let step = if past_known {
                    (step * 2.0).min(STEP_MAX)
                } else {
                    PROBE_STEP
                };
                self.phase = Phase::Probing { step };
                if self.ceiling.is_some_and(|c| self.estimate > c.level) {
                    // Served past a ceiling with every floor met: it no
                    // longer bounds the device.
                    self.ceiling = None;
                }
                self.estimate *= 1.0 + step;
            }
            Phase::Steady => {
                if self.may_probe(point) {
                    // A model the device served past, below what the
                    // floors need, scales every floor down until it is
                    // learned: probed at BBR's startup gain from the first
                    // step (from 1 %, a 3x pessimistic model took the rig
                    // eleven intervals, 8.8 % of windows missed).
                    let step = match self.learning {
                        Learning::Start if obs.floors_need > self.estimate => STEP_MAX,
                        _ => PROBE_STEP,
                    };
                    self.phase = Phase::Probing { step };
                    self.estimate *= 1.0 + step;
                }
            }
            Phase::Draining { .. } => {}
        }
    }

    /// Whether to probe past the level known: only while still learning.
    /// From the start, only where the device showed more than a model it
    /// never filled (the model is disproved): a device at its plateau shows
    /// nothing else that tells it from one with room (parallel queues
    /// answer at their own latency up to their last slot; probed at their
    /// right model, the simulator's `noisy-20` and `backup` doubled their
    /// p99 and missed floors). After the device showed itself faster, at
    /// once: how much faster is not known. With a plateau known, once it is
    /// half the memory old and the device answers unqueued at the level
    /// handed out: what made it full may have left, and a device at its
    /// plateau answering unqueued shows it only by the probe failing
    /// (simulated `stolen`: a plateau found while another host's load ran
    /// held the device at 0.61 for the minute after it left, at its least
    /// latency; probed a quarter of the memory on, `cliff`'s p99 went from
    /// 2.6x to 6.2x alone).
    fn may_probe(&self, point: &CurvePoint) -> bool {
        match self.learning {
            Learning::Start => {
                point.served.max(self.curve.most_shown()) > self.model * (1.0 + SERVED_NOISE)
            }
            Learning::Faster => true,
            Learning::Known => {
                self.curve
                    .plateau_age()
                    .is_some_and(|age| age >= MEMORY_INTERVALS / 2)
                    && !self.waiting(point)
            }
        }
    }

    /// How far below what an overload served the estimate goes for one
    /// interval, as a factor: deep enough to drain the queue past what the
    /// device holds unqueued within half an interval, never below
    /// [`DEEPEST_DRAIN`].
    fn drain_share(&self, point: &CurvePoint, obs: &Observation) -> f64 {
        let (Some(least), Some(interval)) = (self.least_latency_us(), obs.interval) else {
            return 1.0;
        };
        let rate = point.in_flight / point.latency_us * 1e6;
        let excess = point.in_flight - rate * least / 1e6;
        let secs = interval.as_secs_f64();
        if !(excess > 0.0 && rate > 0.0 && secs > 0.0) {
            return 1.0;
        }
        (1.0 - 2.0 * excess / (rate * secs)).clamp(DEEPEST_DRAIN, 1.0)
    }

    /// Where the device is held for a floor short by latency. A tenant
    /// keeping k I/Os in flight gets k ÷ R: at `share` of its floor it needs
    /// the latency R × share. A device's latency falls faster than its
    /// served work near its plateau (a queue's wait grows as 1 ÷ (1 − load)),
    /// so handing out less by half the shortfall lowers it by at least that
    /// much; repeated while the floor stays short, the steps converge where
    /// it is met. With the operator's target instead of a tenant, the
    /// shortfall is the target over the latency.
    fn latency_level(&self, point: &CurvePoint, obs: &Observation) -> f64 {
        let share = match (obs.floor_share, self.latency_limit_us()) {
            (Some(share), _) => share,
            (None, Some(limit)) => limit / point.latency_us,
            (None, None) => 1.0,
        };
        let share = share.clamp(0.0, 1.0 - PROBE_STEP);
        self.estimate * (1.0 - (1.0 - share) / 2.0)
    }

    /// The least the estimate may be: what the floors need, no more than
    /// the device has shown (the model or the most it served lately), and
    /// less only on proof. Held for a floor short by latency, less by the
    /// caps' margin: the tenants held at their entitlements keep their
    /// floors (or the fallback's share of them) within their caps, and the
    /// queue their margin kept full is the latency the short floor waits
    /// on (the rig cut to 60 %: a QD-1 tenant at 700 of its 768, every
    /// other held 5 % over its share).
    fn guard(&self, obs: &Observation) -> f64 {
        if !obs.floors_need.is_finite() {
            return 0.0;
        }
        let shown = self
            .model
            .max(self.curve.most_delivered() / share_handed_out(obs));
        let least = obs.floors_need.max(0.0).min(shown).min(self.proof.limit());
        match self.ceiling {
            Some(c) if c.for_a_floor && self.settings.cap_margin >= 1.0 => {
                least / self.settings.cap_margin
            }
            _ => least,
        }
    }

    fn step_of(&self, obs: &Observation, fault: Option<Fault>) -> CapacityStep {
        CapacityStep {
            verdict: self.verdict,
            phase: self.phase,
            estimate: self.estimate,
            level: self.level(),
            plateau: self.curve.plateau(),
            learning: self.learning,
            latency_limit_us: self.latency_limit_us(),
            fault,
            seen: *obs,
        }
    }
}

/// Whether the I/Os in flight grew from `last` to `point` past noise (and
/// by one I/O at least).
fn queue_rose(last: &CurvePoint, point: &CurvePoint) -> bool {
    point.in_flight > last.in_flight * (1.0 + IN_FLIGHT_NOISE)
        && point.in_flight >= last.in_flight + 1.0
}

/// The interval as a point of the curve, checked: `Ok(None)` without any
/// I/O, a [`Fault`] where the figures cannot be a device's.
fn point_of(obs: &Observation) -> Result<Option<CurvePoint>, Fault> {
    let served = obs.served;
    if !served.is_finite() || served < 0.0 {
        return Err(Fault::Absurd);
    }
    let Some(in_flight) = obs.avg_queue else {
        return if served > 0.0 {
            Err(Fault::NoDeviceFigures)
        } else {
            Ok(None)
        };
    };
    if !in_flight.is_finite() || !(0.0..=1e6).contains(&in_flight) {
        return Err(Fault::Absurd);
    }
    match obs.latency_us {
        None if served > 0.0 => Err(Fault::DeviceStopped),
        None => Ok(None),
        Some(l) if l == 0.0 && served > 0.0 => Err(Fault::NoQueueIntegral),
        // Under half a microsecond or over a minute an I/O, on average.
        Some(l) if !(0.5..=60e6).contains(&l) => Err(Fault::Absurd),
        Some(_) if served == 0.0 => Ok(None),
        Some(latency_us) => Ok(Some(CurvePoint {
            in_flight,
            served,
            latency_us,
            handed: 0.0,
            capped: obs.capped,
            kind: PointKind::Served,
            age: 0,
        })),
    }
}

/// The share of the estimate handed out while contended, where the
/// observation gives a sensible one.
fn share_handed_out(obs: &Observation) -> f64 {
    if obs.handed_out > 0.0 && obs.handed_out <= 1.0 {
        obs.handed_out
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests;
