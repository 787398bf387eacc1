//! The control loop, without the loop: a [`Controller`] turns cumulative
//! counters read through a [`Backend`] into per-interval usage, asks the policy,
//! and writes the caps that changed. The caller owns the clock and the sleep,
//! so the simulator drives it with simulated time and the daemon with real time.

use crate::judge::Verdicts;
use crate::model::{Caps, DeviceSample, DirUsage, Snapshot, TenantSample, TenantSpec, Usage};
use crate::policy::Policy;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Cumulative per-tenant counters, as the kernel and QEMU keep them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Counters {
    pub read_ios: u64,
    pub write_ios: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Sequential I/Os, where the source can tell (else 0).
    pub read_seq_ios: u64,
    pub write_seq_ios: u64,
    /// Sum of completion latencies in nanoseconds, and how many completions it
    /// covers, where the source has them (QEMU blockstats, the simulator).
    pub latency_ns_total: Option<u64>,
    pub completions: Option<u64>,
}

/// Cumulative device counters, as in /proc/diskstats.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct DeviceCounters {
    /// Time with at least one I/O in flight, in nanoseconds (diskstats io_ticks).
    pub busy_ns: u64,
    /// Integral of the queue length over time, in I/O-nanoseconds
    /// (diskstats weighted time in queue).
    pub queue_ns: u64,
    /// Completed I/Os (diskstats reads + writes completed): with `queue_ns`,
    /// the mean time an I/O spends at the device (Little's law).
    #[serde(default)]
    pub completions: u64,
}

/// Where counters come from and caps go to: cgroup v1/v2, QMP, the simulator.
pub trait Backend {
    type Error: std::fmt::Display;

    fn read_counters(&mut self, tenant: &TenantSpec) -> Result<Counters, Self::Error>;

    /// Device-wide counters, if this backend can see the device.
    fn read_device(&mut self) -> Option<DeviceCounters>;

    fn apply_caps(&mut self, tenant: &TenantSpec, caps: &Caps) -> Result<(), Self::Error>;
}

/// Usage over an interval from two counter readings; `None` if any counter
/// went backwards (a recreated cgroup, a restarted VM) or no time passed.
pub fn usage_between(prev: &Counters, cur: &Counters, dt: Duration) -> Option<Usage> {
    let secs = dt.as_secs_f64();
    if secs <= 0.0 {
        return None;
    }
    let d = |a: u64, b: u64| b.checked_sub(a);
    let rate = |a: u64, b: u64| d(a, b).map(|x| x as f64 / secs);
    let read = DirUsage {
        ios: rate(prev.read_ios, cur.read_ios)?,
        bytes: rate(prev.read_bytes, cur.read_bytes)?,
        seq_ios: rate(prev.read_seq_ios, cur.read_seq_ios)?,
    };
    let write = DirUsage {
        ios: rate(prev.write_ios, cur.write_ios)?,
        bytes: rate(prev.write_bytes, cur.write_bytes)?,
        seq_ios: rate(prev.write_seq_ios, cur.write_seq_ios)?,
    };
    let latency_us = match (
        prev.latency_ns_total,
        cur.latency_ns_total,
        prev.completions,
        cur.completions,
    ) {
        (Some(l0), Some(l1), Some(c0), Some(c1)) => match (d(l0, l1), d(c0, c1)) {
            (Some(dl), Some(dc)) if dc > 0 => Some(dl as f64 / dc as f64 / 1e3),
            (Some(_), Some(_)) => None,
            _ => return None,
        },
        _ => None,
    };
    Some(Usage {
        read,
        write,
        latency_us,
    })
}

/// Device sample between two readings.
pub fn device_between(
    prev: &DeviceCounters,
    cur: &DeviceCounters,
    dt: Duration,
) -> Option<DeviceSample> {
    let ns = dt.as_nanos() as f64;
    if ns <= 0.0 {
        return None;
    }
    Some(DeviceSample {
        utilisation: (cur.busy_ns.checked_sub(prev.busy_ns)? as f64 / ns).min(1.0),
        avg_queue: cur.queue_ns.checked_sub(prev.queue_ns)? as f64 / ns,
        iops: cur.completions.checked_sub(prev.completions)? as f64 / ns * 1e9,
    })
}

/// The shortest time between looks (each reads the device's counters).
pub const WATCH_MIN: Duration = Duration::from_millis(20);

/// Looks per interval when `watch_interval` is not given.
pub const WATCH_PER_INTERVAL: u32 = 8;

/// How often to look at the device between ticks, from the configured
/// `watch_interval`: by default an eighth of the interval (at least
/// [`WATCH_MIN`]); zero: never; never in a cluster, whose hosts decide
/// together once an interval (a non-zero value there is refused). An
/// eighth is what was measured (docs/policies.md, "Looks between
/// intervals"): every quarter interval cost `churn` work conservation, every
/// half did nothing for its p99. The error says what is allowed.
pub fn watch_interval(
    interval: Duration,
    given: Option<Duration>,
    cluster: bool,
) -> Result<Option<Duration>, WatchIntervalError> {
    match given {
        None if cluster => Ok(None),
        None => Ok(Some((interval / WATCH_PER_INTERVAL).max(WATCH_MIN)).filter(|&w| w < interval)),
        Some(w) if w.is_zero() => Ok(None),
        Some(_) if cluster => Err(WatchIntervalError::InCluster),
        Some(w) if w < WATCH_MIN || w >= interval => {
            Err(WatchIntervalError::OutOfRange { interval, given: w })
        }
        Some(w) => Ok(Some(w)),
    }
}

/// Why a configured `watch_interval` cannot work; the text says what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatchIntervalError {
    #[error(
        "the hosts of a `[cluster]` decide together once an interval: leave it out or give 0s"
    )]
    InCluster,
    #[error(
        "must be 0s (no looks between intervals) or from {WATCH_MIN:?} to less than the \
         interval ({interval:?}), got {given:?}"
    )]
    OutOfRange { interval: Duration, given: Duration },
}

/// What one tick did, for logs, metrics and reports.
#[derive(Debug, Clone)]
pub struct TickReport {
    pub now: Duration,
    pub samples: Vec<TenantSample>,
    pub device: Option<DeviceSample>,
    pub caps: Vec<Caps>,
    /// The caps in force after the tick, aligned with `samples`: what was
    /// decided where the write succeeded, what was there before where not.
    pub applied: Vec<Caps>,
    /// What the policy judged of the interval (`Policy::verdicts`), its
    /// tenants aligned with `samples`.
    pub verdicts: Verdicts,
    /// Wall time the policy took to decide (measured here, outside the policy).
    pub decision_time: Duration,
    /// Tenants whose read or write failed this tick, with the message.
    pub errors: Vec<(String, String)>,
    /// Tenants whose counters went backwards (a recreated cgroup, a
    /// restarted VM): no sample this tick, and limits may be gone.
    pub counter_resets: Vec<String>,
}

/// What applying news between intervals did ([`Controller::apply_news`]).
#[derive(Debug, Clone)]
pub struct NewsReport {
    /// Each tenant's caps in force after it.
    pub applied: Vec<(String, Caps)>,
    pub decision_time: Duration,
    /// Tenants whose caps could not be written, with the message.
    pub errors: Vec<(String, String)>,
}

struct Tracked {
    spec: Arc<TenantSpec>,
    last: Option<Counters>,
    caps: Caps,
    /// Since when `caps` hold, and the caps in force earlier in the
    /// interval with how long (seconds), where they changed within it.
    caps_since: Duration,
    earlier: Option<(Caps, f64)>,
}

impl Tracked {
    fn new(spec: Arc<TenantSpec>) -> Tracked {
        Tracked {
            spec,
            last: None,
            caps: Caps::NONE,
            caps_since: Duration::ZERO,
            earlier: None,
        }
    }

    /// `caps` in force from `now`.
    fn set_caps(&mut self, caps: Caps, now: Duration) {
        self.earlier = Some(self.held_until(now));
        self.caps = caps;
        self.caps_since = now;
    }

    /// The caps in force over the interval up to `now`, and its length in
    /// seconds. Judged by the caps at its end alone, a noisy tenant held
    /// tighter for the first half looked short of its cap, was taken for
    /// one that wants no more and let go by a release step; ten such at
    /// once filled the device (simulated cluster of 10 hosts × 100, the
    /// allocation half an interval after the reports: 5.7 % of floors
    /// missed).
    fn held_until(&self, now: Duration) -> (Caps, f64) {
        let current = now.saturating_sub(self.caps_since).as_secs_f64();
        match self.earlier {
            Some((caps, before)) => (caps.blended(before, &self.caps, current), before + current),
            None => (self.caps, current),
        }
    }

    /// The interval's caps, read at its end: the next starts at `now`.
    fn close_interval(&mut self, now: Duration) -> Caps {
        let (caps, _) = self.held_until(now);
        self.earlier = None;
        self.caps_since = now;
        caps
    }
}

/// Drives a policy against a backend.
pub struct Controller {
    policy: Box<dyn Policy>,
    tenants: Vec<Tracked>,
    last_time: Option<Duration>,
    last_device: Option<DeviceCounters>,
    /// The device counters at the last look between ticks (or the tick).
    last_look: Option<(Duration, DeviceCounters)>,
    /// The stretch a look judged worth an early decision, for that decision.
    early_seen: Option<DeviceSample>,
    /// A tenant came or went since the last decision: the policy's caps on
    /// news would be for the tenants it saw then, so news waits for a tick.
    roster_changed: bool,
}

impl Controller {
    pub fn new(policy: Box<dyn Policy>, tenants: Vec<Arc<TenantSpec>>) -> Controller {
        Controller {
            policy,
            tenants: tenants.into_iter().map(Tracked::new).collect(),
            last_time: None,
            last_device: None,
            last_look: None,
            early_seen: None,
            roster_changed: false,
        }
    }

    pub fn tenants(&self) -> impl Iterator<Item = &Arc<TenantSpec>> {
        self.tenants.iter().map(|t| &t.spec)
    }

    /// Starts controlling a tenant from the next tick (its first interval
    /// only sets the counters' baseline). A tenant of the same name is replaced.
    pub fn add_tenant(&mut self, spec: Arc<TenantSpec>) {
        self.remove_tenant(&spec.name);
        self.roster_changed = true;
        self.tenants.push(Tracked::new(spec));
    }

    /// Stops controlling a tenant; returns the caps it last had applied.
    pub fn remove_tenant(&mut self, name: &str) -> Option<Caps> {
        let i = self.tenants.iter().position(|t| t.spec.name == name)?;
        self.roster_changed = true;
        Some(self.tenants.remove(i).caps)
    }

    /// Changes a tenant's promise (floor, ceiling, weight) without losing
    /// its counters; false if there is no such tenant.
    pub fn update_spec(&mut self, spec: Arc<TenantSpec>) -> bool {
        match self.tenants.iter_mut().find(|t| t.spec.name == spec.name) {
            Some(t) => {
                t.spec = spec;
                true
            }
            None => false,
        }
    }

    /// Forgets what was applied to a tenant, so the next decision is written
    /// again (after its limits were restored or changed behind our back).
    pub fn forget_caps(&mut self, name: &str) {
        if let Some(t) = self.tenants.iter_mut().find(|t| t.spec.name == name) {
            t.caps = Caps::NONE;
        }
    }

    pub fn capacity_estimate(&self) -> Option<f64> {
        self.policy.capacity_estimate()
    }

    /// How the policy's capacity loop judged the last decision's interval.
    pub fn capacity_step(&self) -> Option<crate::capacity::CapacityStep> {
        self.policy.capacity_step()
    }

    /// The policy's recent points of the device's curve.
    pub fn capacity_curve(&self) -> Vec<crate::capacity::CurvePoint> {
        self.policy.capacity_curve()
    }

    /// Whether the floors fit the device as the policy now sees it.
    pub fn feasibility(&self) -> Option<crate::policy::Feasibility> {
        self.policy.feasibility()
    }

    /// A look at the device between ticks: true when the policy wants to
    /// decide now rather than at the end of the interval
    /// ([`Policy::wants_early_decision`]); the caller then calls
    /// [`Controller::tick_early`] and counts the next interval from it. Reads only
    /// the device's counters, judged over the time since the last look.
    pub fn look<B: Backend>(&mut self, now: Duration, backend: &mut B) -> bool {
        let Some(current) = backend.read_device() else {
            return false;
        };
        let previous = self.last_look.replace((now, current));
        let Some((then, before)) = previous else {
            return false;
        };
        self.early_seen = device_between(&before, &current, now.saturating_sub(then))
            .filter(|sample| self.policy.wants_early_decision(sample));
        self.early_seen.is_some()
    }

    /// Applies the caps the policy decides on news between intervals
    /// ([`Policy::decide_on_news`]: a cluster allocation that arrived),
    /// without reading counters. Applied at the next interval's end
    /// instead, an allocation took effect a whole interval after the report
    /// it answers, and a tenant's floor was missed for that interval at
    /// every step (simulator, `noisy-20-cluster`). `None` without news, and
    /// when a tenant came or went since the last tick (the news waits for it).
    pub fn apply_news<B: Backend>(&mut self, now: Duration, backend: &mut B) -> Option<NewsReport> {
        if self.roster_changed {
            return None;
        }
        let started = Instant::now();
        let caps = self.policy.decide_on_news(now)?;
        let decision_time = started.elapsed();
        let mut errors = Vec::new();
        let applied = self.apply(&caps, now, backend, &mut errors);
        let applied = self
            .tenants
            .iter()
            .map(|t| t.spec.name.clone())
            .zip(applied)
            .collect();
        Some(NewsReport {
            applied,
            decision_time,
            errors,
        })
    }

    /// Writes the caps that changed; returns the caps in force after it.
    fn apply<B: Backend>(
        &mut self,
        caps: &[Caps],
        now: Duration,
        backend: &mut B,
        errors: &mut Vec<(String, String)>,
    ) -> Vec<Caps> {
        for (t, new) in self.tenants.iter_mut().zip(caps) {
            let new = new.rounded();
            if new != t.caps {
                match backend.apply_caps(&t.spec, &new) {
                    Ok(()) => t.set_caps(new, now),
                    Err(e) => errors.push((t.spec.name.clone(), e.to_string())),
                }
            }
        }
        self.tenants.iter().map(|t| t.caps).collect()
    }

    /// Reads counters, decides, applies the caps that changed. `now` is the
    /// caller's clock.
    pub fn tick<B: Backend>(&mut self, now: Duration, backend: &mut B) -> TickReport {
        self.tick_as(now, backend, None)
    }

    /// [`Controller::tick`] before the interval ended, because
    /// [`Controller::look`] said so (without such a look, a plain tick).
    pub fn tick_early<B: Backend>(&mut self, now: Duration, backend: &mut B) -> TickReport {
        let seen = self.early_seen.take();
        self.tick_as(now, backend, seen)
    }

    fn tick_as<B: Backend>(
        &mut self,
        now: Duration,
        backend: &mut B,
        early_seen: Option<DeviceSample>,
    ) -> TickReport {
        let dt = self.last_time.map(|t| now.saturating_sub(t));
        self.last_time = Some(now);
        self.roster_changed = false;
        let Read {
            samples,
            mut errors,
            counter_resets,
        } = self.read_tenants(backend, now, dt);
        let device_now = backend.read_device();
        self.last_look = device_now.map(|d| (now, d));
        self.early_seen = None;
        let device = match (self.last_device, device_now, dt) {
            (Some(a), Some(b), Some(dt)) => device_between(&a, &b, dt),
            _ => None,
        };
        self.last_device = device_now;

        let snapshot = Snapshot {
            now,
            interval: dt.unwrap_or_default(),
            device,
            tenants: &samples,
            foreign_load: 0.0,
        };
        // The one clock read of the control path, to report decision time.
        let started = Instant::now();
        let caps = if let Some(seen) = &early_seen {
            self.policy.decide_early(&snapshot, seen)
        } else {
            self.policy.decide(&snapshot)
        };
        let decision_time = started.elapsed();
        let verdicts = self.policy.verdicts(&snapshot);
        debug_assert_eq!(
            verdicts.tenants.len(),
            samples.len(),
            "{}: one verdict per tenant",
            self.policy.name()
        );
        let applied = self.apply(&caps, now, backend, &mut errors);
        TickReport {
            now,
            samples,
            device,
            caps,
            applied,
            verdicts,
            decision_time,
            errors,
            counter_resets,
        }
    }

    /// Each tenant's usage since the last tick (none for its first, or
    /// when its counters went backwards), with the caps in force.
    fn read_tenants<B: Backend>(
        &mut self,
        backend: &mut B,
        now: Duration,
        dt: Option<Duration>,
    ) -> Read {
        let mut read = Read {
            samples: Vec::with_capacity(self.tenants.len()),
            errors: Vec::new(),
            counter_resets: Vec::new(),
        };
        for t in &mut self.tenants {
            let usage = match backend.read_counters(&t.spec) {
                Ok(cur) => {
                    let usage = match (t.last, dt) {
                        (Some(prev), Some(dt)) => {
                            let usage = usage_between(&prev, &cur, dt);
                            if usage.is_none() && !dt.is_zero() {
                                read.counter_resets.push(t.spec.name.clone());
                            }
                            usage
                        }
                        _ => None,
                    };
                    t.last = Some(cur);
                    usage
                }
                Err(e) => {
                    read.errors.push((t.spec.name.clone(), e.to_string()));
                    t.last = None;
                    None
                }
            };
            let caps = t.close_interval(now);
            read.samples.push(TenantSample {
                spec: t.spec.clone(),
                usage,
                caps,
            });
        }
        read
    }
}

/// What reading the tenants' counters gave ([`Controller::read_tenants`]).
struct Read {
    samples: Vec<TenantSample>,
    /// Tenants whose read failed, with the message.
    errors: Vec<(String, String)>,
    /// Tenants whose counters went backwards.
    counter_resets: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Caps of 300 IOPS for every tenant it last saw, once `news` is set.
    struct OnNews {
        news: Arc<std::sync::atomic::AtomicBool>,
        seen: usize,
    }

    impl Policy for OnNews {
        fn name(&self) -> &'static str {
            "on-news"
        }
        fn decide(&mut self, snapshot: &Snapshot) -> Vec<Caps> {
            self.seen = snapshot.tenants.len();
            vec![Caps::NONE; self.seen]
        }
        fn verdicts(&self, snapshot: &Snapshot) -> crate::judge::Verdicts {
            crate::judge::Verdicts::judge(
                snapshot,
                false,
                &crate::synthetic::iops_only_model(4000.0),
            )
        }
        fn decide_on_news(&mut self, _now: Duration) -> Option<Vec<Caps>> {
            let news = self.news.swap(false, std::sync::atomic::Ordering::SeqCst);
            news.then(|| {
                let caps = Caps {
                    read_iops: Some(300.0),
                    ..Caps::NONE
                };
                vec![caps; self.seen]
            })
        }
    }

    #[derive(Default)]
    struct Writes(Vec<(String, Caps)>);

    impl Backend for Writes {
        type Error = String;
        fn read_counters(&mut self, _: &TenantSpec) -> Result<Counters, String> {
            Ok(Counters::default())
        }
        fn read_device(&mut self) -> Option<DeviceCounters> {
            None
        }
        fn apply_caps(&mut self, tenant: &TenantSpec, caps: &Caps) -> Result<(), String> {
            self.0.push((tenant.name.clone(), *caps));
            Ok(())
        }
    }

    #[test]
    fn news_is_applied_between_ticks_but_waits_for_one_after_a_tenant_came() {
        let news = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let policy = OnNews {
            news: news.clone(),
            seen: 0,
        };
        let spec = |n: &str| Arc::new(TenantSpec::new(n, crate::model::TenantClass::Container));
        let mut c = Controller::new(Box::new(policy), vec![spec("a")]);
        let mut writes = Writes::default();
        c.tick(Duration::from_secs(1), &mut writes);
        assert!(c
            .apply_news(Duration::from_millis(1100), &mut writes)
            .is_none());

        news.store(true, std::sync::atomic::Ordering::SeqCst);
        let report = c
            .apply_news(Duration::from_millis(1200), &mut writes)
            .unwrap();
        assert_eq!(report.applied.len(), 1);
        assert_eq!(report.applied[0].1.read_iops, Some(300.0));
        assert_eq!(writes.0.len(), 1);

        // A tenant the policy has not seen: its caps on news would be for
        // the old roster, so the news waits for the next tick.
        c.add_tenant(spec("b"));
        news.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(c
            .apply_news(Duration::from_millis(1300), &mut writes)
            .is_none());
        assert!(news.load(std::sync::atomic::Ordering::SeqCst), "not taken");
        c.tick(Duration::from_secs(2), &mut writes);
        let report = c
            .apply_news(Duration::from_millis(2100), &mut writes)
            .unwrap();
        assert_eq!(report.applied.len(), 2);
        assert!(report
            .applied
            .iter()
            .all(|(_, c)| c.read_iops == Some(300.0)));
    }

    /// Caps of 100 IOPS at each tick and 300 on news, keeping the caps
    /// each decision was shown.
    struct ShownCaps(Arc<std::sync::Mutex<Vec<Caps>>>, bool);

    impl Policy for ShownCaps {
        fn name(&self) -> &'static str {
            "shown-caps"
        }
        fn decide(&mut self, snapshot: &Snapshot) -> Vec<Caps> {
            let shown = snapshot.tenants.iter().map(|t| t.caps);
            self.0.lock().unwrap().extend(shown);
            let caps = Caps {
                read_iops: Some(100.0),
                ..Caps::NONE
            };
            vec![caps; snapshot.tenants.len()]
        }
        fn verdicts(&self, snapshot: &Snapshot) -> crate::judge::Verdicts {
            crate::judge::Verdicts::judge(
                snapshot,
                false,
                &crate::synthetic::iops_only_model(4000.0),
            )
        }
        fn decide_on_news(&mut self, _now: Duration) -> Option<Vec<Caps>> {
            std::mem::take(&mut self.1).then(|| {
                let caps = Caps {
                    read_iops: Some(300.0),
                    ..Caps::NONE
                };
                vec![caps]
            })
        }
    }

    #[test]
    fn caps_changed_within_an_interval_are_shown_as_their_time_weighted_mean() {
        let shown = Arc::new(std::sync::Mutex::new(Vec::new()));
        let policy = ShownCaps(shown.clone(), true);
        let spec = Arc::new(TenantSpec::new("a", crate::model::TenantClass::Container));
        let mut c = Controller::new(Box::new(policy), vec![spec]);
        let mut writes = Writes::default();
        let at = Duration::from_millis;
        c.tick(at(1000), &mut writes);
        c.apply_news(at(1250), &mut writes).expect("news applied");
        c.tick(at(2000), &mut writes);
        c.tick(at(3000), &mut writes);
        let iops: Vec<Option<f64>> = shown.lock().unwrap().iter().map(|c| c.read_iops).collect();
        // None before the first tick; 100 for a quarter and 300 for the
        // rest; 100 all through.
        assert_eq!(iops, [None, Some(250.0), Some(100.0)]);
        assert_eq!(writes.0.len(), 3, "100, 300 on news, 100 again");
    }

    #[test]
    fn counters_going_backwards_give_no_sample() {
        let a = Counters {
            write_ios: 100,
            write_bytes: 409600,
            ..Default::default()
        };
        let b = Counters {
            write_ios: 5,
            write_bytes: 20480,
            ..Default::default()
        };
        assert_eq!(usage_between(&a, &b, Duration::from_secs(1)), None);
        let u = usage_between(&b, &a, Duration::from_millis(500)).unwrap();
        assert_eq!(u.write.ios, 190.0);
        assert_eq!(usage_between(&b, &a, Duration::ZERO), None);
    }

    #[test]
    fn watch_interval_is_an_eighth_unless_given_and_refuses_what_cannot_work() {
        let second = Duration::from_secs(1);
        let ms = Duration::from_millis;
        assert_eq!(watch_interval(second, None, false), Ok(Some(ms(125))));
        assert_eq!(watch_interval(ms(100), None, false), Ok(Some(WATCH_MIN)));
        assert_eq!(watch_interval(WATCH_MIN, None, false), Ok(None));
        assert_eq!(watch_interval(second, None, true), Ok(None));
        assert_eq!(
            watch_interval(second, Some(Duration::ZERO), false),
            Ok(None)
        );
        assert_eq!(
            watch_interval(Duration::from_millis(100), Some(WATCH_MIN), false),
            Ok(Some(WATCH_MIN))
        );
        assert_eq!(
            watch_interval(second, Some(Duration::from_millis(250)), false),
            Ok(Some(Duration::from_millis(250)))
        );
        assert_eq!(watch_interval(second, Some(Duration::ZERO), true), Ok(None));
        let e = watch_interval(second, Some(Duration::from_millis(125)), true).unwrap_err();
        assert_eq!(e, WatchIntervalError::InCluster);
        assert!(e.to_string().contains("decide together"), "{e}");
        for bad in [Duration::from_millis(5), second, Duration::from_secs(2)] {
            let e = watch_interval(second, Some(bad), false)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("must be 0s") && e.contains(&format!("{bad:?}")),
                "{e}"
            );
        }
    }

    #[test]
    fn latency_from_sums() {
        let a = Counters {
            latency_ns_total: Some(0),
            completions: Some(0),
            ..Default::default()
        };
        let b = Counters {
            read_ios: 10,
            latency_ns_total: Some(1_000_000),
            completions: Some(10),
            ..Default::default()
        };
        assert_eq!(
            usage_between(&a, &b, Duration::from_secs(1))
                .unwrap()
                .latency_us,
            Some(100.0)
        );
    }
}
