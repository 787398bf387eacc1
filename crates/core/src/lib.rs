//! iofloor-core: the pure heart of iofloor. It holds the model of tenants and
//! their usage, the device cost model (the linear io.cost form), the throttle
//! policies (`none`, `static`, `top-throttle` from seed 001, and iofloor's own
//! `floor`), admission control, and a controller that turns backend counters
//! into policy decisions. Nothing here reads a clock for a decision, touches a
//! file or talks to a process: time and counters come in, caps go out, so the
//! simulator, the fio benchmark runner and the daemon share exactly this code.

pub mod admission;
pub mod capacity;
pub mod control;
pub mod cost;
pub mod error;
pub mod hierarchy;
pub mod judge;
pub mod model;
pub mod policy;
pub mod synthetic;
pub mod units;

pub use control::{Backend, Controller, Counters, DeviceCounters, NewsReport, TickReport};
pub use cost::{CostModel, CostParams};
pub use error::ValidationError;
pub use model::{
    Caps, DeviceSample, DirUsage, Direction, GroupSpec, Snapshot, TenantClass, TenantSample,
    TenantSpec, Usage,
};
pub use policy::{build as build_policy, Policy, PolicyContext, PolicyKind, PolicyParams};
pub use units::Rate;
