//! iofloor-cluster: one floor across hosts that share storage. Every host
//! runs an agent: the daemon's controller reads its tenants and applies caps
//! as on a single host, but its policy is [`agent::AgentPolicy`], which
//! publishes a [`wire::HostReport`] and applies the [`wire::Allocation`] the
//! cluster's allocator wrote for it, or a safe local rule when none is fresh.
//! One agent at a time, chosen by an etcd election, is the allocator: it runs
//! the same core policy over every host's tenants ([`allocate::Allocator`]).
//! The coordination sits behind [`coord::Coordinator`], implemented for etcd;
//! [`runtime`] is the task that ties lease, election, reports and
//! allocations together. Decisions stay pure: the allocator and the agent's
//! rule take the time and values in and give caps out, so the simulator
//! plays the same cluster (without the `etcd` feature) deterministically.

pub mod agent;
pub mod allocate;
#[cfg(feature = "etcd")]
pub mod coord;
#[cfg(feature = "etcd")]
pub mod local;
#[cfg(feature = "etcd")]
pub mod runtime;
pub mod view;
pub mod wire;

pub use agent::{AgentPolicy, AgentRule, Mailbox, Mode};
pub use allocate::{Allocator, Conflict, Ghost, Round, DEFAULT_ORPHAN_TIMEOUT};
#[cfg(feature = "etcd")]
pub use coord::{CoordError, Coordinator, Etcd, EtcdOptions, Leadership};
#[cfg(feature = "etcd")]
pub use local::LocalEtcd;
#[cfg(feature = "etcd")]
pub use runtime::{
    start, AgentHandle, AgentSettings, ClusterError, ClusterReader, ClusterStatus, Keys, Role,
};
pub use view::{ClusterView, QuietHost};
pub use wire::{Allocation, HostReport, TenantReport, WireError, SCHEMA};
