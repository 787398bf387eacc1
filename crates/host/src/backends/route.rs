//! The one place that knows every backend: each tenant goes to the backend
//! that serves it (a libvirt domain's disk, a QEMU drive over QMP, or a
//! cgroup), so no backend names another and a new kind is added here.

use super::cgroup::CgroupBackend;
use super::libvirt::LibvirtBackend;
use super::qmp::QmpBackend;
use crate::error::{HostError, Result};
use iofloor_core::{Backend, Caps, Counters, DeviceCounters, TenantSpec};

/// Containers through cgroups and VMs through QMP or libvirt under one
/// controller: each tenant goes to the backend that knows it; the device
/// comes from cgroups' diskstats.
pub struct HybridBackend {
    pub cgroups: CgroupBackend,
    pub qmp: QmpBackend,
    /// Only where the config names libvirt domains.
    pub libvirt: Option<LibvirtBackend>,
}

impl HybridBackend {
    fn libvirt_for(&mut self, tenant: &str) -> Option<&mut LibvirtBackend> {
        self.libvirt.as_mut().filter(|l| l.has_tenant(tenant))
    }
}

impl Backend for HybridBackend {
    type Error = HostError;

    fn read_counters(&mut self, tenant: &TenantSpec) -> Result<Counters> {
        if let Some(l) = self.libvirt_for(&tenant.name) {
            l.read_counters(tenant)
        } else if self.qmp.has_tenant(&tenant.name) {
            self.qmp.read_counters(tenant)
        } else {
            self.cgroups.read_counters(tenant)
        }
    }

    fn read_device(&mut self) -> Option<DeviceCounters> {
        self.cgroups.read_device()
    }

    fn apply_caps(&mut self, tenant: &TenantSpec, caps: &Caps) -> Result<()> {
        if let Some(l) = self.libvirt_for(&tenant.name) {
            l.apply_caps(tenant, caps)
        } else if self.qmp.has_tenant(&tenant.name) {
            self.qmp.apply_caps(tenant, caps)
        } else {
            self.cgroups.apply_caps(tenant, caps)
        }
    }
}
