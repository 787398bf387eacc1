//! The cgroup backend of the controller: tenants are cgroups, counters come
//! from the I/O controller, the device from /proc/diskstats.

use crate::cgroup::IoController;
use crate::diskstats::DiskStats;
use crate::error::HostError;
use iofloor_core::{Backend, Caps, Counters, DeviceCounters, TenantSpec};
use std::collections::HashMap;
use std::path::PathBuf;

pub struct CgroupBackend {
    io: Box<dyn IoController>,
    /// Tenant name → cgroup path relative to the controller's root.
    cgroups: HashMap<String, PathBuf>,
    diskstats: Option<DiskStats>,
}

impl CgroupBackend {
    pub fn new(io: Box<dyn IoController>, diskstats: Option<DiskStats>) -> CgroupBackend {
        CgroupBackend {
            io,
            cgroups: HashMap::new(),
            diskstats,
        }
    }

    pub fn add_tenant(&mut self, name: &str, cgroup: PathBuf) {
        self.cgroups.insert(name.to_string(), cgroup);
    }

    pub fn remove_tenant(&mut self, name: &str) -> Option<PathBuf> {
        self.cgroups.remove(name)
    }

    pub fn controller(&self) -> &dyn IoController {
        self.io.as_ref()
    }

    fn cgroup(&self, tenant: &TenantSpec) -> Result<&PathBuf, HostError> {
        self.cgroups
            .get(&tenant.name)
            .ok_or_else(|| HostError::UnknownTenant(tenant.name.clone()))
    }
}

impl Backend for CgroupBackend {
    type Error = HostError;

    fn read_counters(&mut self, tenant: &TenantSpec) -> Result<Counters, HostError> {
        self.io.read(self.cgroup(tenant)?)
    }

    fn read_device(&mut self) -> Option<DeviceCounters> {
        self.diskstats
            .as_ref()
            .and_then(|d| d.read().ok())
            .map(|s| s.counters())
    }

    fn apply_caps(&mut self, tenant: &TenantSpec, caps: &Caps) -> Result<(), HostError> {
        self.io.set_caps(self.cgroup(tenant)?, caps)
    }
}
