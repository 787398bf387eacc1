//! iofloor-scenario: what an experiment is and how it is run, independent of
//! where. It holds the scenario format (TOML: the device, the tenants, their
//! fio-like jobs and how the load changes; validated with file, line and key
//! in errors) and the one harness that plays a scenario's policies on a
//! [`Platform`]: the `none` reference run, every tenant alone (its demand and
//! its p99 baseline), the policy runs, and the assembly of the run records the
//! report measures. The simulator and the real-device runner are two
//! implementations of [`Platform`], so their figures compare by construction.

pub mod format;
pub mod harness;
mod locate;
pub mod stats;

pub use format::{Scenario, ScenarioError};
pub use harness::{
    controls, run_controls, run_policies, Control, HarnessError, KernelPeer, KernelRun, Platform,
    RawRun, RunEnvironment,
};
pub use stats::{DecisionStats, LatencyRecorder};
