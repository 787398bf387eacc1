//! iofloor-sim: a deterministic discrete-event simulator of many tenants
//! sharing one flash device. It models fio-like jobs (closed loop with an
//! iodepth, or rate-limited), Linux blk-throttle, a VM's hypervisor I/O path,
//! and a device with finite internal parallelism whose service times follow a
//! linear cost model (optionally with a write cliff). The policies of
//! iofloor-core run in it through the same controller and backend interface the
//! daemon uses on real cgroups, so a policy can be judged on the seed
//! experiments in seconds, at any scale, in CI.
//!
//! Each tenant also runs alone (no neighbours, no policy): what it gets then is
//! its demand in each window and its "alone" p99 latency, against which the
//! floor-miss rate and the protected p99 ratio are measured.

pub mod engine;
pub mod scenario;

use engine::{Engine, EngineOutput};
use iofloor_core::policy::PolicyKind;
use iofloor_core::units::RateUnit;
use iofloor_report::record::{RunRecord, TenantInfo};
pub use scenario::{Scenario, ScenarioError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Runs one policy (or none at all) on a scenario and returns the raw output.
pub fn simulate(
    scenario: &Scenario,
    policy: Option<PolicyKind>,
    progress: &dyn Fn(f64),
) -> EngineOutput {
    Engine::new(scenario).run(policy, progress)
}

enum Task {
    Alone(usize),
    Policy(PolicyKind),
}

/// Runs every requested policy (plus `none`, the reference for work
/// conservation) and every tenant alone, in parallel on `threads` threads, and
/// returns one record per policy with demand and alone baselines filled in.
/// `progress` receives the overall fraction done.
pub fn run_policies(
    scenario: &Scenario,
    policies: &[PolicyKind],
    threads: usize,
    progress: &(dyn Fn(f64) + Sync),
) -> Vec<RunRecord> {
    let mut kinds: Vec<PolicyKind> = vec![PolicyKind::None];
    for p in policies {
        if !kinds.contains(p) {
            kinds.push(*p);
        }
    }
    let mut tasks: Vec<Task> = (0..scenario.tenants.len()).map(Task::Alone).collect();
    tasks.extend(kinds.iter().map(|k| Task::Policy(*k)));
    let alone_scenarios: Vec<Scenario> = (0..scenario.tenants.len())
        .map(|i| scenario.alone(i))
        .collect();
    // Alone runs have one tenant, so they weigh less in the progress estimate.
    let weights: Vec<f64> = tasks
        .iter()
        .map(|t| match t {
            Task::Alone(_) => 1.0 / scenario.tenants.len().max(1) as f64,
            Task::Policy(_) => 1.0,
        })
        .collect();
    let total_weight: f64 = weights.iter().sum();
    let done = Mutex::new(vec![0.0f64; tasks.len()]);
    let next = AtomicUsize::new(0);
    let outputs: Vec<Mutex<Option<EngineOutput>>> =
        tasks.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::SeqCst);
                if k >= tasks.len() {
                    break;
                }
                let report = |f: f64| {
                    let mut d = done.lock().unwrap_or_else(|e| e.into_inner());
                    d[k] = f * weights[k];
                    progress(d.iter().sum::<f64>() / total_weight);
                };
                let out = match tasks[k] {
                    Task::Alone(i) => simulate(&alone_scenarios[i], None, &report),
                    Task::Policy(kind) => simulate(scenario, Some(kind), &report),
                };
                *outputs[k].lock().unwrap_or_else(|e| e.into_inner()) = Some(out);
            });
        }
    });
    let mut outputs: Vec<EngineOutput> = outputs
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every task ran")
        })
        .collect();
    let policy_outputs = outputs.split_off(scenario.tenants.len());
    let alone = outputs;
    kinds
        .iter()
        .zip(policy_outputs)
        .map(|(kind, out)| record(scenario, kind.as_str(), out, &alone))
        .collect()
}

fn record(
    scenario: &Scenario,
    policy: &str,
    out: EngineOutput,
    alone: &[EngineOutput],
) -> RunRecord {
    let tenants = scenario
        .tenants
        .iter()
        .enumerate()
        .map(|(i, t)| TenantInfo {
            name: t.spec.name.clone(),
            class: t.spec.class,
            noisy: t.noisy,
            floor: t.spec.floor,
            unit: t
                .spec
                .floor
                .map(|f| f.unit())
                .unwrap_or(RateUnit::BytesPerSec),
            alone_p99_ms: alone.get(i).map(|a| a.latency[0].p99_ms),
            alone_windows: alone
                .get(i)
                .map(|a| a.windows.iter().map(|w| w.tenants[0].clone()).collect())
                .unwrap_or_default(),
        })
        .collect();
    let mut windows = out.windows;
    for (k, w) in windows.iter_mut().enumerate() {
        for (i, tw) in w.tenants.iter_mut().enumerate() {
            tw.demand = alone
                .get(i)
                .and_then(|a| a.windows.get(k))
                .map(|aw| aw.tenants[0].got);
        }
    }
    RunRecord {
        scenario: scenario.name.clone(),
        policy: policy.to_string(),
        source: "sim".into(),
        window_s: 1.0,
        warmup_s: scenario.warmup.as_secs_f64(),
        duration_s: scenario.duration.as_secs_f64(),
        control_interval_s: scenario.interval.as_secs_f64(),
        tenants,
        windows,
        steps: scenario.steps().iter().map(|d| d.as_secs_f64()).collect(),
        latency: out.latency,
        decision_time_us_max: out.decision_time_us_max,
        decision_time_us_mean: out.decision_time_us_mean,
        ios_completed: out.ios_completed,
    }
}
