//! What changes the device's capacity during a run (a scenario's
//! `device.change`): on this host the rig's throttle group over QMP; in the
//! cgroup v2 test guest its disk's throttle group, set by the host's relay
//! on the guest's capacity port (the guest cannot reach QEMU's monitor).

use crate::Result;
use iofloor_host::cgroup::DevId;
use iofloor_testbed::rig::{Rig, RigSpec};
use iofloor_testbed::v2guest::GuestDisk;
use std::path::Path;

/// A device whose capacity a run can change, as it was found.
#[derive(Debug, Clone)]
pub(crate) enum CapacityKnob {
    Rig(Rig),
    Guest(GuestDisk),
}

impl CapacityKnob {
    /// The rig behind `device`, or the test guest's disk if `device` is it
    /// (the guest has one disk, `vda`, behind the throttle group); `None`
    /// for any other device.
    pub(crate) fn find(device: &Path, rig_state_dir: &Path) -> Result<Option<CapacityKnob>> {
        if let Some(rig) = crate::rig_of(device, rig_state_dir) {
            return Ok(Some(CapacityKnob::Rig(rig)));
        }
        let sys = Path::new("/sys");
        let is_guest_disk = DevId::of_block_device(device)
            .and_then(|dev| dev.kernel_name(sys))
            .is_ok_and(|name| name == "vda");
        if !is_guest_disk {
            return Ok(None);
        }
        Ok(GuestDisk::find(sys)?.map(CapacityKnob::Guest))
    }

    /// The capacity when the device was found.
    pub(crate) fn spec(&self) -> RigSpec {
        match self {
            CapacityKnob::Rig(rig) => rig.spec,
            CapacityKnob::Guest(disk) => disk.spec,
        }
    }

    pub(crate) fn set_limits(&self, spec: &RigSpec) -> iofloor_host::Result<()> {
        match self {
            CapacityKnob::Rig(rig) => rig.set_limits(spec),
            CapacityKnob::Guest(disk) => disk.set_limits(spec),
        }
    }
}
