//! iofloor-testbed: the machinery that stands up devices and hosts for
//! iofloor's tests and benches, kept out of the service (the daemon and the
//! cluster crate link none of it). A test bed here is one of:
//! - the **rig** ([`rig`]): one block device of known capacity, built from a
//!   qemu-storage-daemon throttle group, a FUSE export and a loop device,
//!   its capacity changeable live;
//! - the **cluster bed** ([`cluster`]): hosts in network namespaces sharing
//!   one such device over NBD, with a 3-member etcd;
//! - the **guest** ([`guest`]): a QEMU guest under TCG booting the project's
//!   image, a VM tenant on a real QEMU;
//! - **libvirt** ([`libvirt`]): the system's libvirtd, started when none
//!   runs, and throwaway domains booting that image;
//! - the **v2 guest** ([`v2guest`]): a QEMU guest under TCG that is a
//!   cgroup v2 host (io controller, io.cost, BFQ) with fio and iofloor in
//!   it, its disk of known capacity, commands run in it from the host.
//!
//! [`needs`] says what a real-kernel test needs and fails it loudly when the
//! machine lacks it. (What a scenario's policies run on, the simulator or a
//! real device, is a `Platform` of `iofloor-scenario`, a different thing.)

pub mod cluster;
pub mod guest;
pub mod libvirt;
pub mod needs;
pub mod rig;
pub mod v2guest;
