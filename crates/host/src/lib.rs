//! iofloor-host: everything of iofloor that touches the operating system,
//! behind small interfaces so the pure core never does. cgroup v1 `blkio` and
//! v2 `io` controllers (counters in, limits out, root injectable so tests run
//! on recorded trees), device counters from /proc/diskstats, the cgroup
//! implementation of the core's `Backend`, and the test rig: a block device of
//! known capacity built from qemu-storage-daemon, FUSE and a loop device, and
//! the calibration that measures a device's cost model with fio.

pub mod backend;
pub mod calibrate;
pub mod cgroup;
pub mod cluster_bed;
pub mod diskstats;
pub mod error;
pub mod fio;
pub mod guest;
pub mod libvirt;
pub mod qmp;
pub mod qmp_backend;
pub mod rig;
pub mod testenv;

pub use backend::CgroupBackend;
pub use cgroup::{DevId, IoController, Version};
pub use error::{HostError, Result};
