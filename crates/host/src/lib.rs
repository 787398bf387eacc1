//! iofloor-host: everything of iofloor that touches the operating system,
//! behind small interfaces so the pure core never does. cgroup v1 `blkio` and
//! v2 `io` controllers (counters in, limits out, root injectable so tests run
//! on recorded trees), device counters from /proc/diskstats, the cgroup
//! implementation of the core's `Backend`, QMP and libvirt for VMs, container
//! runtimes' APIs (names, labels, cgroups), fio's output, and the calibration that measures a device's cost model with fio.
//! The service links all of it; the machinery that stands up devices and
//! hosts for tests and benches lives in `iofloor-testbed`.

pub mod backend;
mod backoff;
pub mod calibrate;
pub mod cgroup;
pub mod containers;
pub mod diskstats;
pub mod error;
pub mod fio;
pub mod kernel_control;
pub mod libvirt;
pub mod qmp;
pub mod qmp_backend;

pub use backend::CgroupBackend;
pub use cgroup::{DevId, IoController, Version};
pub use error::{HostError, Result};
