//! The cgroup backend of the controller: tenants are cgroups, counters come
//! from the I/O controller, the device from /proc/diskstats.

use crate::cgroup::Version;
use crate::cgroup::{IoController, REWRITE_TOLERANCE};
use crate::diskstats::DiskStats;
use crate::error::HostError;
use iofloor_core::{Backend, Caps, Counters, DeviceCounters, TenantSpec};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

pub struct CgroupBackend {
    io: Box<dyn IoController>,
    /// Tenant name → cgroup path relative to the controller's root.
    cgroups: HashMap<String, PathBuf>,
    diskstats: Option<DiskStats>,
    /// Tenant name → the cgroup above it that takes its group's caps added
    /// up (cgroup v2 only: there `io.max` on a parent bounds its subtree).
    shared: HashMap<String, PathBuf>,
    /// The caps last given each such tenant, and those whose own cgroup
    /// holds caps of its own now (while its group's are not summed).
    shared_caps: HashMap<String, Caps>,
    own_caps: HashSet<String>,
    /// Each group cgroup's members, in the order they were shared.
    members: HashMap<PathBuf, Vec<String>>,
}

impl CgroupBackend {
    pub fn new(io: Box<dyn IoController>, diskstats: Option<DiskStats>) -> CgroupBackend {
        CgroupBackend {
            io,
            cgroups: HashMap::new(),
            diskstats,
            shared: HashMap::new(),
            shared_caps: HashMap::new(),
            own_caps: HashSet::new(),
            members: HashMap::new(),
        }
    }

    /// Gives tenant `name`'s caps to `group_cgroup` above it, added up with
    /// those of every tenant shared there: the members share one limit and
    /// one may use what another leaves at once. Only where the hierarchy
    /// enforces it (cgroup v2); false on v1, whose blk-throttle is flat.
    pub fn share_limit(&mut self, name: &str, group_cgroup: PathBuf) -> bool {
        if self.io.version() != Version::V2 {
            return false;
        }
        let members = self.members.entry(group_cgroup.clone()).or_default();
        if !members.iter().any(|m| m == name) {
            members.push(name.to_string());
        }
        self.shared.insert(name.to_string(), group_cgroup);
        true
    }

    /// How many tenants share their caps at `group_cgroup`.
    pub fn sharing(&self, group_cgroup: &Path) -> usize {
        self.shared
            .values()
            .filter(|g| g.as_path() == group_cgroup)
            .count()
    }

    pub fn add_tenant(&mut self, name: &str, cgroup: PathBuf) {
        self.cgroups.insert(name.to_string(), cgroup);
    }

    /// Forgets a tenant; with the cgroup its caps were shared at, if any.
    pub fn remove_tenant(&mut self, name: &str) -> Option<PathBuf> {
        self.shared_caps.remove(name);
        self.own_caps.remove(name);
        let group = self.shared.remove(name);
        if let Some(g) = &group {
            if let Some(members) = self.members.get_mut(g) {
                members.retain(|m| m != name);
                if members.is_empty() {
                    self.members.remove(g);
                }
            }
        }
        self.cgroups.remove(name);
        group
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
        let Some(group) = self.shared.get(&tenant.name).cloned() else {
            return self
                .io
                .adjust_caps(self.cgroup(tenant)?, caps, REWRITE_TOLERANCE);
        };
        self.shared_caps.insert(tenant.name.clone(), *caps);
        let members: Vec<String> = self.members.get(&group).cloned().unwrap_or_default();
        let member_caps: Vec<Caps> = members
            .iter()
            .map(|m| self.shared_caps.get(m).copied().unwrap_or(Caps::NONE))
            .collect();
        let capped = member_caps.iter().filter(|c| !c.is_unlimited()).count();
        // All held back: the group's cgroup holds their caps added up and
        // theirs none. Some free: a sum would free them all, so each gets
        // its own. None held back: no limit anywhere.
        let summed = capped == members.len();
        let total = if summed {
            let sum = |pick: fn(&Caps) -> Option<f64>| -> Option<f64> {
                member_caps.iter().map(pick).sum()
            };
            Caps {
                read_iops: sum(|c| c.read_iops),
                write_iops: sum(|c| c.write_iops),
                read_bps: sum(|c| c.read_bps),
                write_bps: sum(|c| c.write_bps),
            }
        } else {
            Caps::NONE
        };
        self.io.adjust_caps(&group, &total, REWRITE_TOLERANCE)?;
        for (m, c) in members.iter().zip(&member_caps) {
            let own = if summed { Caps::NONE } else { *c };
            let had = self.own_caps.contains(m);
            if had || !own.is_unlimited() || m == &tenant.name {
                let cgroup = self
                    .cgroups
                    .get(m)
                    .cloned()
                    .ok_or_else(|| HostError::UnknownTenant(m.clone()))?;
                self.io.adjust_caps(&cgroup, &own, REWRITE_TOLERANCE)?;
            }
            if own.is_unlimited() {
                self.own_caps.remove(m);
            } else {
                self.own_caps.insert(m.clone());
            }
        }
        Ok(())
    }
}
