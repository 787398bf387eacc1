//! The roster: the tenants the service controls, the changes the API made
//! to their promises (kept across reloads, dropped with the tenant), and the
//! floors set for the whole cluster in etcd; and from these, the spec a
//! tenant is controlled by. Adoption adds and removes tenants, a device's
//! loop hands each its interval's outcome, the API's patches and reloads
//! change their promises. The maps are this type's own; a tenant's record
//! (`Tenant`) is plain data the service's steps read and fill.

use super::adoption;
use super::patch::Patch;
use crate::config::Config;
use crate::discovery::Found;
use crate::view::UsageView;
use iofloor_core::{Caps, Rate, TenantSpec, Usage};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub(super) struct Tenant {
    pub(super) found: Found,
    pub(super) spec: Arc<TenantSpec>,
    pub(super) device: usize,
    pub(super) overridden: bool,
    /// Caps in force (as last applied).
    pub(super) caps: Caps,
    pub(super) throttled_seconds: f64,
    /// Seconds of the last interval under a cap.
    pub(super) throttled_for: f64,
    pub(super) usage: Option<UsageView>,
    /// The last non-idle usage, to price the floor with its real mix.
    pub(super) last_mix: Option<Usage>,
    pub(super) floor_met: Option<bool>,
    pub(super) available: bool,
    pub(super) error: Option<String>,
}

impl Tenant {
    /// A tenant just adopted on device `device`, nothing applied or seen yet.
    pub(super) fn new(found: Found, spec: Arc<TenantSpec>, device: usize) -> Tenant {
        Tenant {
            overridden: false,
            found,
            spec,
            device,
            caps: Caps::NONE,
            throttled_seconds: 0.0,
            throttled_for: 0.0,
            usage: None,
            last_mix: None,
            floor_met: None,
            available: true,
            error: None,
        }
    }
}

#[derive(Default)]
pub(super) struct Roster {
    tenants: BTreeMap<String, Tenant>,
    /// Spec changes made through the API, kept across reloads.
    overrides: HashMap<String, Patch>,
    /// Floors set for the whole cluster in etcd (cluster mode), by tenant
    /// name, for the shared device's tenants; and the mailbox version they
    /// were read at.
    cluster_floors: BTreeMap<String, Option<Rate>>,
    cluster_floors_version: u64,
}

impl Roster {
    pub(super) fn get(&self, name: &str) -> Option<&Tenant> {
        self.tenants.get(name)
    }

    pub(super) fn get_mut(&mut self, name: &str) -> Option<&mut Tenant> {
        self.tenants.get_mut(name)
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        self.tenants.contains_key(name)
    }

    /// Every tenant, by name.
    pub(super) fn tenants(&self) -> impl Iterator<Item = &Tenant> {
        self.tenants.values()
    }

    /// The names of every tenant now, for changes that may add or remove.
    pub(super) fn names(&self) -> Vec<String> {
        self.tenants.keys().cloned().collect()
    }

    /// The tenants of device `di`.
    pub(super) fn on_device_mut(&mut self, di: usize) -> impl Iterator<Item = &mut Tenant> {
        self.tenants.values_mut().filter(move |t| t.device == di)
    }

    pub(super) fn count_on(&self, di: usize) -> usize {
        self.tenants.values().filter(|t| t.device == di).count()
    }

    /// Adds a tenant just adopted; it carries the API's changes made before.
    pub(super) fn insert(&mut self, name: String, mut tenant: Tenant) {
        tenant.overridden = self.overrides.contains_key(&name);
        self.tenants.insert(name, tenant);
    }

    pub(super) fn remove(&mut self, name: &str) -> Option<Tenant> {
        self.tenants.remove(name)
    }

    /// Drops the API's changes to a tenant that is gone: with pods coming
    /// and going, kept changes of departed tenants would grow without end.
    pub(super) fn forget_overrides(&mut self, name: &str) {
        self.overrides.remove(name);
    }

    /// Keeps an API change to a tenant's promise across reloads.
    pub(super) fn add_override(&mut self, name: &str, patch: &Patch) {
        let merged = self.overrides.entry(name.to_string()).or_default();
        if patch.floor.is_some() {
            merged.floor = patch.floor;
        }
        if patch.ceiling.is_some() {
            merged.ceiling = patch.ceiling;
        }
        if patch.weight.is_some() {
            merged.weight = patch.weight;
        }
        if let Some(t) = self.tenants.get_mut(name) {
            t.overridden = true;
        }
    }

    /// Whether the tenant's floor is set for the whole cluster.
    pub(super) fn has_cluster_floor(&self, name: &str) -> bool {
        self.cluster_floors.contains_key(name)
    }

    /// Takes the cluster's floors as read at `version`; false when that
    /// version is the one it has.
    pub(super) fn take_cluster_floors(
        &mut self,
        version: u64,
        floors: &BTreeMap<String, Option<Rate>>,
    ) -> bool {
        if version == self.cluster_floors_version {
            return false;
        }
        self.cluster_floors_version = version;
        self.cluster_floors = floors.clone();
        true
    }

    /// A tenant's promise: its config entry's, then the API's changes, then,
    /// for the cluster's shared device, the floor set for the whole cluster
    /// in etcd. The cluster's floor wins because it is the one decision
    /// every host of the tenant's name must share; the host file still says
    /// which tenants exist and where (a floor in etcd for a tenant no host
    /// runs protects nothing).
    pub(super) fn spec_for(
        &self,
        config: &Config,
        entry: usize,
        found: &Found,
        cgroup_v2: bool,
    ) -> TenantSpec {
        let tenant = &config.tenants[entry];
        let name = found.name.as_str();
        let host = config.cluster.as_ref().map(|c| c.host.as_str());
        let mut spec = adoption::spec_of(tenant, found, self.overrides.get(name), cgroup_v2, host);
        let shared = config.cluster.as_ref().map(|c| c.device);
        if shared == Some(tenant.device) {
            if let Some(floor) = self.cluster_floors.get(name) {
                spec.floor = *floor;
            }
        }
        spec
    }
}
