//! The measures of docs/metrics.md, computed exactly as defined there.

use crate::record::{RunRecord, TenantWindow};
use serde::{Deserialize, Serialize};

pub use iofloor_core::judge::{entitlement, MISS_THRESHOLD};

fn window_missed(run: &RunRecord, i: usize, w: &TenantWindow) -> Option<bool> {
    let t = &run.tenants[i];
    let floor = t.floor.map(|f| f.value());
    let demand = w.demand.map(|d| d.in_unit(t.unit));
    let active = w.active_share.map_or(1.0, |a| a.clamp(0.0, 1.0));
    // The floor is owed for the part of the window the tenant ran; what it
    // asks (its run alone, in the same window) already covers only that
    // part, so it is not scaled again.
    let entitled = entitlement(floor.map(|f| f * active), demand)?;
    if entitled <= 0.0 {
        return None;
    }
    Some(!iofloor_core::judge::floor_met(
        w.got.in_unit(t.unit),
        entitled,
    ))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantMeasures {
    pub name: String,
    pub class: String,
    pub unit: String,
    pub floor: Option<f64>,
    pub floor_miss_rate: f64,
    pub min: f64,
    pub max: f64,
    pub avg: f64,
    pub p99_latency_ms: f64,
    pub alone_p99_ms: Option<f64>,
    pub noisy: bool,
}

/// A group's figures: its members' added up in each window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupMeasures {
    pub name: String,
    pub unit: String,
    pub floor: Option<f64>,
    pub floor_miss_rate: f64,
    pub min: f64,
    pub max: f64,
    pub avg: f64,
}

/// Each group's window: what its members got and asked for together
/// (demand unknown if any member's is), in every group order of `run`.
fn group_windows(run: &RunRecord, w: &crate::record::Window) -> Vec<TenantWindow> {
    use crate::record::Throughput;
    let add = |a: Throughput, b: Throughput| Throughput {
        iops: a.iops + b.iops,
        bytes_per_s: a.bytes_per_s + b.bytes_per_s,
        cost: a.cost + b.cost,
    };
    let mut out: Vec<TenantWindow> = run
        .groups
        .iter()
        .map(|_| TenantWindow {
            demand: Some(Throughput::default()),
            ..Default::default()
        })
        .collect();
    for (i, t) in run.tenants.iter().enumerate() {
        // Every group on the way up; a chain longer than the groups is a
        // corrupt record, not a reason to loop.
        let mut at = t.group;
        for _ in 0..run.groups.len() {
            let Some(g) = at.filter(|&g| g < out.len()) else {
                break;
            };
            let tw = &w.tenants[i];
            out[g].got = add(out[g].got, tw.got);
            out[g].demand = match (out[g].demand, tw.demand) {
                (Some(a), Some(b)) => Some(add(a, b)),
                _ => None,
            };
            at = run.groups[g].parent;
        }
    }
    out
}

fn group_window_missed(g: &crate::record::GroupInfo, w: &TenantWindow) -> Option<bool> {
    let entitled = entitlement(
        g.floor.map(|f| f.value()),
        w.demand.map(|d| d.in_unit(g.unit)),
    )?;
    (entitled > 0.0).then(|| !iofloor_core::judge::floor_met(w.got.in_unit(g.unit), entitled))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyMeasures {
    pub floor_miss_rate: f64,
    /// Filled in by [`compare`] against the `none` run; 1.0 for `none` itself.
    pub work_conservation: Option<f64>,
    /// Work conservation over the contended windows only (docs/metrics.md),
    /// filled in by [`compare`]; `None` without a `none` run or such windows.
    pub work_conservation_contended: Option<f64>,
    /// Work conservation of the whole device, counting what unmanaged load
    /// was served beside the tenants (docs/metrics.md), filled in by
    /// [`compare`] where the runs record unmanaged load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_work_conservation: Option<f64>,
    pub reaction_time_s: Option<f64>,
    /// Every load step's reaction time, in step order (the distribution
    /// behind `reaction_time_s`, which is its largest).
    pub reaction_times_s: Vec<f64>,
    /// Load steps after which floors were never met again before the end.
    pub unrecovered_steps: usize,
    pub protected_p99_ratio: Option<f64>,
    pub aggregate_iops: f64,
    pub aggregate_bytes_per_s: f64,
    pub aggregate_cost: f64,
    /// Mean cost rate served to unmanaged load, where the run records it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmanaged_cost: Option<f64>,
    pub decision_time_us_max: f64,
    pub windows_counted: usize,
    pub tenants: Vec<TenantMeasures>,
    /// Groups of tenants, where the scenario has them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupMeasures>,
}

fn after_warmup(run: &RunRecord) -> impl Iterator<Item = &crate::record::Window> {
    run.windows
        .iter()
        .filter(move |w| w.t + 1e-9 >= run.warmup_s)
}

/// Computes every measure of one run except work conservation.
pub fn measure(run: &RunRecord) -> PolicyMeasures {
    let counted: Vec<_> = after_warmup(run).collect();
    let mut judged = Judged::default();
    let tenants: Vec<TenantMeasures> = (0..run.tenants.len())
        .map(|i| tenant_measures(run, &counted, i, &mut judged))
        .collect();
    let groups = group_measures(run, &counted, &mut judged);
    let mean = |f: &dyn Fn(&crate::record::Window) -> f64| {
        if counted.is_empty() {
            0.0
        } else {
            counted.iter().map(|w| f(w)).sum::<f64>() / counted.len() as f64
        }
    };
    let aggregate_iops = mean(&|w| w.tenants.iter().map(|t| t.got.iops).sum());
    let aggregate_bytes_per_s = mean(&|w| w.tenants.iter().map(|t| t.got.bytes_per_s).sum());
    let aggregate_cost = mean(&|w| w.tenants.iter().map(|t| t.got.cost).sum());
    let unmanaged_cost = counted
        .iter()
        .any(|w| w.device.unmanaged.is_some())
        .then(|| mean(&|w| w.device.unmanaged.map_or(0.0, |u| u.cost)));
    let (reaction_times_s, unrecovered_steps) = reaction(run);
    PolicyMeasures {
        floor_miss_rate: judged.miss_rate(),
        work_conservation: None,
        work_conservation_contended: None,
        device_work_conservation: None,
        reaction_time_s: reaction_times_s.iter().copied().reduce(f64::max),
        reaction_times_s,
        unrecovered_steps,
        protected_p99_ratio: protected_p99_ratio(&tenants),
        aggregate_iops,
        aggregate_bytes_per_s,
        aggregate_cost,
        unmanaged_cost,
        decision_time_us_max: run.decision_time_us_max,
        windows_counted: counted.len(),
        tenants,
        groups,
    }
}

/// The windows whose floors were judged, and those missed, over every
/// tenant and group of a run.
#[derive(Default)]
struct Judged {
    windows: usize,
    missed: usize,
}

impl Judged {
    /// One tenant's or group's windows, each missed or not; counted in
    /// `all` too.
    fn of(verdicts: impl Iterator<Item = bool>, all: &mut Judged) -> Judged {
        let mut own = Judged::default();
        for missed in verdicts {
            own.count(missed);
            all.count(missed);
        }
        own
    }

    fn count(&mut self, missed: bool) {
        self.windows += 1;
        self.missed += usize::from(missed);
    }

    fn miss_rate(&self) -> f64 {
        if self.windows > 0 {
            self.missed as f64 / self.windows as f64
        } else {
            0.0
        }
    }
}

/// Least, most and mean of a series (0 for an empty one).
fn spread(series: &[f64]) -> (f64, f64, f64) {
    let min = series.iter().copied().reduce(f64::min).unwrap_or(0.0);
    let max = series.iter().copied().reduce(f64::max).unwrap_or(0.0);
    let avg = if series.is_empty() {
        0.0
    } else {
        series.iter().sum::<f64>() / series.len() as f64
    };
    (min, max, avg)
}

/// Tenant `i`'s measures over the `counted` windows; its judged windows
/// are added to `all`.
fn tenant_measures(
    run: &RunRecord,
    counted: &[&crate::record::Window],
    i: usize,
    all: &mut Judged,
) -> TenantMeasures {
    let t = &run.tenants[i];
    let series: Vec<f64> = counted
        .iter()
        .map(|w| w.tenants[i].got.in_unit(t.unit))
        .collect();
    let own = Judged::of(
        counted
            .iter()
            .filter_map(|w| window_missed(run, i, &w.tenants[i])),
        all,
    );
    let (min, max, avg) = spread(&series);
    TenantMeasures {
        name: t.name.clone(),
        class: t.class.as_str().to_string(),
        unit: t.unit.label().to_string(),
        floor: t.floor.map(|f| f.value()),
        floor_miss_rate: own.miss_rate(),
        min,
        max,
        avg,
        p99_latency_ms: run.latency.get(i).map(|l| l.p99_ms).unwrap_or(0.0),
        alone_p99_ms: t.alone_p99_ms,
        noisy: t.noisy,
    }
}

/// Groups' floors are promises like tenants': their windows count too
/// (added to `all`).
fn group_measures(
    run: &RunRecord,
    counted: &[&crate::record::Window],
    all: &mut Judged,
) -> Vec<GroupMeasures> {
    let per_window: Vec<Vec<TenantWindow>> =
        counted.iter().map(|w| group_windows(run, w)).collect();
    run.groups
        .iter()
        .enumerate()
        .map(|(g, info)| {
            let series: Vec<f64> = per_window
                .iter()
                .map(|ws| ws[g].got.in_unit(info.unit))
                .collect();
            let own = Judged::of(
                per_window
                    .iter()
                    .filter_map(|ws| group_window_missed(info, &ws[g])),
                all,
            );
            let (min, max, avg) = spread(&series);
            GroupMeasures {
                name: info.name.clone(),
                unit: info.unit.label().to_string(),
                floor: info.floor.map(|f| f.value()),
                floor_miss_rate: own.miss_rate(),
                min,
                max,
                avg,
            }
        })
        .collect()
}

/// The protected tenants' worst p99 against their p99 alone.
fn protected_p99_ratio(tenants: &[TenantMeasures]) -> Option<f64> {
    tenants
        .iter()
        .filter(|t| !t.noisy)
        .filter_map(|t| {
            t.alone_p99_ms
                .filter(|a| *a > 0.0)
                .map(|a| t.p99_latency_ms / a)
        })
        .fold(None, |acc: Option<f64>, r| {
            Some(acc.map_or(r, |a| a.max(r)))
        })
}

/// Reaction time: for each load step after warm-up, the time from the step to
/// the start of the first window (the one holding the step, or a later one) in
/// which every tenant meets its entitlement, in step order. A step never
/// recovered from counts until the end of the run, and is counted apart.
fn reaction(run: &RunRecord) -> (Vec<f64>, usize) {
    let all_met = |w: &crate::record::Window| {
        w.tenants
            .iter()
            .enumerate()
            .all(|(i, tw)| window_missed(run, i, tw) != Some(true))
            && group_windows(run, w)
                .iter()
                .zip(&run.groups)
                .all(|(gw, g)| group_window_missed(g, gw) != Some(true))
    };
    let mut times = Vec::new();
    let mut unrecovered = 0;
    for &step in run
        .steps
        .iter()
        .filter(|&&s| s > 0.0 && s + 1e-9 >= run.warmup_s)
    {
        let first = run
            .windows
            .iter()
            .filter(|w| w.t + run.window_s > step + 1e-9)
            .find(|w| all_met(w));
        let r = match first {
            Some(w) => (w.t - step).max(0.0),
            None => {
                unrecovered += 1;
                (run.duration_s - step).max(0.0)
            }
        };
        times.push(r);
    }
    (times, unrecovered)
}

/// A window is contended when its tenants together ask for at least
/// [`CONTENDED_DEMAND`] of what the device served at best under `none`: a
/// tenant whose demand is not known (a closed-loop job the alone run did not
/// cover) asks for everything.
const CONTENDED_DEMAND: f64 = 0.9;

/// Indexes of the counted windows of `run` that are contended, judged
/// against `best_cost`, the most the device served in one window.
fn contended_windows(run: &RunRecord, best_cost: f64) -> Vec<usize> {
    run.windows
        .iter()
        .enumerate()
        .filter(|(_, w)| w.t + 1e-9 >= run.warmup_s)
        .filter(|(_, w)| {
            let asked: f64 = w
                .tenants
                .iter()
                .map(|t| t.demand.map_or(f64::INFINITY, |d| d.cost))
                .sum();
            asked >= CONTENDED_DEMAND * best_cost
        })
        .map(|(k, _)| k)
        .collect()
}

/// The policy's aggregate cost over the `none` run's in the windows where
/// the tenants asked for more than the device could serve. Unlike plain work
/// conservation it does not count the windows where nobody asked for more:
/// there `none` serves the backlog that rate-limited jobs built up while a
/// neighbour starved them (fio catches up), which a policy that never let
/// them fall behind has no reason to serve.
fn contended_conservation(policy: &RunRecord, none: &RunRecord) -> Option<f64> {
    let aggregate = |w: &crate::record::Window| w.tenants.iter().map(|t| t.got.cost).sum::<f64>();
    let best = after_warmup(none).map(aggregate).fold(0.0, f64::max);
    let windows = contended_windows(policy, best);
    let (mut served, mut reference) = (0.0, 0.0);
    for k in windows {
        let (Some(p), Some(n)) = (policy.windows.get(k), none.windows.get(k)) else {
            continue;
        };
        served += aggregate(p);
        reference += aggregate(n);
    }
    (reference > 0.0).then(|| served / reference)
}

/// Measures of several policies on one scenario; fills in work conservation
/// against the `none` run when there is one.
pub fn compare(runs: &[RunRecord]) -> Vec<(String, PolicyMeasures)> {
    let mut out: Vec<(String, PolicyMeasures)> = runs
        .iter()
        .map(|r| (r.policy.clone(), measure(r)))
        .collect();
    let reference = out
        .iter()
        .find(|(p, _)| p == "none")
        .map(|(_, m)| m.aggregate_cost);
    if let Some(none_cost) = reference.filter(|c| *c > 0.0) {
        for (_, m) in &mut out {
            m.work_conservation = Some(m.aggregate_cost / none_cost);
        }
    }
    // Capacity a policy takes from a noisy tenant and another host's I/O
    // then uses is not left idle: the device-wide figure counts it.
    let device_work = |m: &PolicyMeasures| m.unmanaged_cost.map(|u| m.aggregate_cost + u);
    let device_reference = out
        .iter()
        .find(|(p, _)| p == "none")
        .and_then(|(_, m)| device_work(m));
    if let Some(none_work) = device_reference.filter(|c| *c > 0.0) {
        for (_, m) in &mut out {
            m.device_work_conservation = device_work(m).map(|w| w / none_work);
        }
    }
    if let Some(none) = runs.iter().find(|r| r.policy == "none") {
        for (run, (_, m)) in runs.iter().zip(&mut out) {
            m.work_conservation_contended = contended_conservation(run, none);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::*;
    use iofloor_core::units::{Rate, RateUnit};
    use iofloor_core::TenantClass;

    fn tw(got: f64, demand: f64) -> TenantWindow {
        TenantWindow {
            got: Throughput {
                iops: got,
                bytes_per_s: got * 4096.0,
                cost: got / 1000.0,
            },
            demand: Some(Throughput {
                iops: demand,
                bytes_per_s: demand * 4096.0,
                cost: demand / 1000.0,
            }),
            mean_latency_ms: None,
            cap_cost: None,
            active_share: None,
        }
    }

    fn run(series: &[(f64, f64)], steps: Vec<f64>) -> RunRecord {
        RunRecord {
            schema_version: crate::record::SCHEMA_VERSION,
            environment: None,
            scenario: "t".into(),
            policy: "floor".into(),
            source: "test".into(),
            window_s: 1.0,
            warmup_s: 1.0,
            duration_s: series.len() as f64,
            control_interval_s: 1.0,
            groups: Vec::new(),
            tenants: vec![TenantInfo {
                name: "a".into(),
                class: TenantClass::Container,
                noisy: false,
                group: None,
                floor: Some(Rate::Iops(100.0)),
                unit: RateUnit::Iops,
                alone_p99_ms: Some(2.0),
                alone_windows: vec![],
            }],
            windows: series
                .iter()
                .enumerate()
                .map(|(k, &(g, d))| Window {
                    t: k as f64,
                    tenants: vec![tw(g, d)],
                    device: Default::default(),
                })
                .collect(),
            steps,
            latency: vec![LatencySummary {
                p99_ms: 3.0,
                ..Default::default()
            }],
            decision_time_us_max: 1.0,
            decision_time_us_mean: 1.0,
            ios_completed: 0,
            capacity_trace: Vec::new(),
        }
    }

    #[test]
    fn floor_miss_uses_entitlement_and_skips_warmup() {
        // Window 0 is warm-up. Then: met; missed (90 < 95); asks 50, gets 48 (met);
        // asks 50, gets 40 (missed).
        let r = run(
            &[
                (0.0, 200.0),
                (100.0, 200.0),
                (90.0, 200.0),
                (48.0, 50.0),
                (40.0, 50.0),
            ],
            vec![],
        );
        let m = measure(&r);
        assert_eq!(m.windows_counted, 4);
        assert!((m.floor_miss_rate - 0.5).abs() < 1e-12);
        assert_eq!(m.tenants[0].min, 40.0);
        assert_eq!(m.tenants[0].max, 100.0);
        assert!((m.protected_p99_ratio.unwrap() - 1.5).abs() < 1e-12);
    }

    #[test]
    fn a_window_the_tenant_began_in_is_judged_on_its_share_of_the_floor() {
        // Floor 100 (see `run`); the I/O began 0.6 s into window 2 and ran
        // at 150 a second there: 60 is met for 40 % of the window, not for
        // 70 %.
        let mut r = run(&[(0.0, 200.0), (100.0, 200.0), (60.0, 200.0)], vec![]);
        r.windows[2].tenants[0].active_share = Some(0.4);
        assert_eq!(measure(&r).floor_miss_rate, 0.0);
        r.windows[2].tenants[0].active_share = Some(0.7);
        assert!((measure(&r).floor_miss_rate - 0.5).abs() < 1e-12);
    }

    #[test]
    fn a_part_window_owes_the_floor_for_that_part_not_less() {
        // Floor 100; the tenant ran 0.5 of window 2, asking 120 a second
        // (60 alone in that window): it is owed 50, not half of the 60 it
        // asked. 45 misses it; 48 meets it.
        let mut r = run(&[(0.0, 200.0), (100.0, 200.0), (45.0, 60.0)], vec![]);
        r.windows[2].tenants[0].active_share = Some(0.5);
        assert!((measure(&r).floor_miss_rate - 0.5).abs() < 1e-12);
        r.windows[2].tenants[0].got.iops = 48.0;
        assert_eq!(measure(&r).floor_miss_rate, 0.0);
    }

    #[test]
    fn reaction_is_time_to_first_window_with_all_floors_met() {
        let r = run(
            &[
                (100.0, 200.0),
                (100.0, 200.0),
                (10.0, 200.0),
                (50.0, 200.0),
                (99.0, 200.0),
            ],
            vec![2.5],
        );
        let (times, unrecovered) = reaction(&r);
        assert_eq!(unrecovered, 0);
        assert_eq!(times.len(), 1);
        assert!((times[0] - 1.5).abs() < 1e-12);
        let never = run(&[(100.0, 200.0), (100.0, 200.0), (10.0, 200.0)], vec![2.0]);
        assert_eq!(reaction(&never), (vec![1.0], 1));
        let none = run(&[(100.0, 200.0)], vec![]);
        assert_eq!(reaction(&none), (vec![], 0));
        let two = run(
            &[
                (100.0, 200.0),
                (10.0, 200.0),
                (100.0, 200.0),
                (100.0, 200.0),
            ],
            vec![1.0, 3.0],
        );
        let m = measure(&two);
        assert_eq!(m.reaction_times_s, vec![1.0, 0.0]);
        assert_eq!(m.reaction_time_s, Some(1.0));
    }

    #[test]
    fn contended_conservation_leaves_out_windows_where_nobody_asked_for_more() {
        // `none`: two contended windows at 1.0 (the device's best), then two
        // where the tenant asks 0.3 but `none` serves a backlog of 0.9.
        let mut none = run(
            &[
                (0.0, 0.0),
                (1000.0, 2000.0),
                (1000.0, 2000.0),
                (900.0, 300.0),
                (900.0, 300.0),
            ],
            vec![],
        );
        none.policy = "none".into();
        // The policy serves 0.95 where contended and all that was asked after.
        let policy = run(
            &[
                (0.0, 0.0),
                (950.0, 2000.0),
                (950.0, 2000.0),
                (300.0, 300.0),
                (300.0, 300.0),
            ],
            vec![],
        );
        let out = compare(&[none, policy]);
        let m = &out[1].1;
        assert!((m.work_conservation.unwrap() - 2500.0 / 3800.0).abs() < 1e-12);
        assert!((m.work_conservation_contended.unwrap() - 0.95).abs() < 1e-12);
        assert_eq!(out[0].1.work_conservation_contended, Some(1.0));
    }

    #[test]
    fn work_conservation_is_against_none() {
        let mut a = run(&[(100.0, 200.0), (100.0, 200.0)], vec![]);
        a.policy = "none".into();
        let b = run(&[(80.0, 200.0), (80.0, 200.0)], vec![]);
        let out = compare(&[a, b]);
        assert_eq!(out[0].1.work_conservation, Some(1.0));
        assert!((out[1].1.work_conservation.unwrap() - 0.8).abs() < 1e-12);
        assert_eq!(out[1].1.device_work_conservation, None);
    }

    #[test]
    fn device_work_conservation_counts_what_unmanaged_load_was_served() {
        let with_unmanaged = |mut r: RunRecord, cost: f64| {
            for w in &mut r.windows {
                w.device.unmanaged = Some(Throughput {
                    cost,
                    ..Default::default()
                });
            }
            r
        };
        // `none` serves the tenant 0.1 and starves another host's load to
        // 0.02; the policy serves the tenant 0.08 and that load 0.03.
        let mut a = with_unmanaged(run(&[(100.0, 200.0), (100.0, 200.0)], vec![]), 0.02);
        a.policy = "none".into();
        let b = with_unmanaged(run(&[(80.0, 200.0), (80.0, 200.0)], vec![]), 0.03);
        let out = compare(&[a, b]);
        let m = &out[1].1;
        assert!((m.work_conservation.unwrap() - 0.8).abs() < 1e-12);
        assert!((m.unmanaged_cost.unwrap() - 0.03).abs() < 1e-12);
        assert!((m.device_work_conservation.unwrap() - 0.11 / 0.12).abs() < 1e-12);
        assert_eq!(out[0].1.device_work_conservation, Some(1.0));
    }
}
