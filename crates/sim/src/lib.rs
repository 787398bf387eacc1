//! iofloor-sim: a deterministic discrete-event simulator of many tenants
//! sharing one flash device (on one host, or on several hosts of a cluster
//! with the cluster crate's agents and allocator). It models fio-like jobs (closed loop with an
//! iodepth, or rate-limited), Linux blk-throttle, a VM's hypervisor I/O path,
//! and a device with finite internal parallelism whose service times follow a
//! linear cost model (optionally with a write cliff). The policies of
//! iofloor-core run in it through the same controller and backend interface the
//! daemon uses on real cgroups, so a policy can be judged on the seed
//! experiments in seconds, at any scale, in CI.
//!
//! [`Simulator`] is the scenario harness's [`Platform`] for simulated runs:
//! `iofloor_scenario::run_policies(&Simulator::new(threads), ...)` produces
//! records of the same kind, with the same baselines, as a run on a device.

mod cluster;
pub mod engine;
mod scale;

pub use cluster::ExchangeStats;
pub use scale::scale_scenario;

use engine::{Engine, EngineOutput};
use iofloor_scenario::{Control, Platform, RawRun, RunEnvironment, Scenario};

/// Runs one policy (or none at all) on a scenario and returns the raw output.
pub fn simulate(
    scenario: &Scenario,
    control: Option<Control>,
    progress: &dyn Fn(f64),
) -> EngineOutput {
    Engine::new(scenario).run(control, progress)
}

/// The simulator as a platform: runs are deterministic and independent, so
/// they go in parallel on `threads` threads.
#[derive(Debug, Clone, Copy)]
pub struct Simulator {
    pub threads: usize,
}

impl Simulator {
    pub fn new(threads: usize) -> Simulator {
        Simulator {
            threads: threads.max(1),
        }
    }
}

impl Platform for Simulator {
    type Error = std::convert::Infallible;

    fn kind(&self) -> &'static str {
        "simulator"
    }

    fn source(&self) -> String {
        "sim".into()
    }

    fn parallel_runs(&self) -> usize {
        self.threads
    }

    /// Simulation work grows with the tenants' I/O, so a run alone weighs less.
    fn planned_effort(&self, scenario: &Scenario) -> f64 {
        scenario.duration.as_secs_f64() * scenario.tenants.len() as f64
    }

    fn run(
        &self,
        scenario: &Scenario,
        control: Option<Control>,
        _label: &str,
        progress: &(dyn Fn(f64) + Sync),
    ) -> Result<RawRun, Self::Error> {
        let out = simulate(scenario, control, progress);
        Ok(RawRun {
            windows: out.windows,
            latency: out.latency,
            decisions: out.decisions,
            ios_completed: out.ios_completed,
            capacity_trace: out.capacity_trace,
        })
    }

    fn environment(&self, scenario: &Scenario) -> RunEnvironment {
        RunEnvironment {
            device_model: Some(*scenario.device.cost.params()),
            ..RunEnvironment::default()
        }
    }
}
