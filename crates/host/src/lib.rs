//! iofloor-host: everything of iofloor that touches the operating system,
//! behind small interfaces so the pure core never does. cgroup v1 `blkio` and
//! v2 `io` controllers (counters in, limits out, root injectable so tests run
//! on recorded trees), device counters from /proc/diskstats, the core's
//! `Backend` for each kind of tenant in [`backends`] (cgroups, QMP, libvirt,
//! and the router that knows them all), the QMP client, container runtimes'
//! APIs (names, labels, cgroups), fio's output, and the calibration that
//! measures a device's cost model with fio.
//! The service links all of it; the machinery that stands up devices and
//! hosts for tests and benches lives in `iofloor-testbed`.

pub mod backends;
mod backoff;
pub mod calibrate;
pub mod cgroup;
pub mod containers;
pub mod diskstats;
pub mod error;
pub mod fio;
pub mod kernel_control;
pub mod qmp;

pub use backends::CgroupBackend;
pub use cgroup::{DevId, IoController, Version};
pub use error::{HostError, Result};
