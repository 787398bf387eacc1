//! The core's `Backend` for each kind of tenant, each in its own module:
//! cgroups (v1 `blkio` and v2 `io`, through [`crate::cgroup`]'s files), QEMU
//! drives over QMP, libvirt domains. None names another; [`route`] is the
//! one module that knows them all and sends each tenant to its own.

pub mod cgroup;
pub mod libvirt;
pub mod qmp;
pub mod route;

pub use cgroup::CgroupBackend;
pub use libvirt::LibvirtBackend;
pub use qmp::{QmpBackend, QmpTarget};
pub use route::HybridBackend;
