//! Reconciling what the finder found with the roster: adopting new tenants
//! (their limits recorded on disk before anything is written to them) and
//! releasing gone ones (those limits put back).

use super::finder::Finding;
use super::{Patch, Service, Tenant, LIBVIRT_TIMEOUT, QMP_TIMEOUT};
use crate::config::{Share, TenantConfig, TenantSource};
use crate::discovery::{Found, FoundKind};
use crate::ownership::{Entry, Original, Ownership};
use iofloor_core::GroupSpec;
use iofloor_core::{Caps, TenantSpec};
use iofloor_host::backends::libvirt::{DomainInfo, LibvirtBackend};
use iofloor_host::backends::{HybridBackend, QmpBackend, QmpTarget};
use iofloor_host::HostError;
use std::path::Path;
use std::sync::Arc;
use tracing::{debug, info, warn};

/// A found tenant's promise from its config entry and the API's changes.
/// With `share = "vm"` (libvirt) or `kubernetes`, the entry's floor,
/// ceiling and weight are each VM's or pod's: the tenant is a member of a
/// group per domain or pod that holds them, named as the entry (one fixed
/// domain) or `entry/<domain or pod UID>`. A podman pod whose annotations
/// declare a promise is such a group too, `entry/<pod name>`, holding it.
///
/// `cgroup_v2`: the cgroup hierarchy bounds a subtree, so a pod's
/// containers can share one limit on the pod's cgroup (a VM's disks always
/// can, in a QEMU throttle group).
///
/// `host`: in cluster mode, this host's name, which a VM's group name
/// starts with (a VM's name says nothing of other hosts' VMs; a pod's UID
/// is the cluster's own).
pub(super) fn spec_of(
    t: &TenantConfig,
    found: &Found,
    patch: Option<&Patch>,
    cgroup_v2: bool,
    host: Option<&str>,
) -> TenantSpec {
    let mut spec = TenantSpec {
        name: found.name.clone(),
        class: t.class,
        floor: t.floor,
        ceiling: t.ceiling,
        weight: t.weight,
        latency_sensitive: t.latency_sensitive,
        group: t.group.clone(),
    };
    let holder = holder_of(t, found, &mut spec, cgroup_v2, host);
    if let Some((name, shared_limit)) = holder {
        spec.group = Some(Arc::new(GroupSpec {
            name,
            floor: t.floor,
            ceiling: t.ceiling,
            weight: t.weight,
            parent: t.group.clone(),
            shared_limit,
        }));
        spec.floor = None;
        spec.ceiling = None;
        spec.weight = iofloor_core::model::DEFAULT_WEIGHT;
    }
    if let Some(pod) = pod_group(t, found) {
        spec.group = Some(Arc::new(pod));
        spec.floor = None;
        spec.ceiling = None;
        spec.weight = iofloor_core::model::DEFAULT_WEIGHT;
    } else if let Some(d) = found.container.as_ref().and_then(|c| c.declared.as_ref()) {
        // The container's own labels, from a runtime the config trusts,
        // replace the parts of its entry's promise they give; a mix that
        // does not hold (a label's floor above the entry's ceiling) keeps
        // the entry's whole.
        let mut labelled = spec.clone();
        labelled.floor = d.floor.or(spec.floor);
        labelled.ceiling = d.ceiling.or(spec.ceiling);
        labelled.weight = d.weight.unwrap_or(spec.weight);
        if d.group.is_some() {
            labelled.group = d.group.clone();
        }
        match labelled.check_promise() {
            Ok(()) => spec = labelled,
            Err(e) => warn!(
                tenant = %found.name,
                "its labels with its entry's promise: `{}` {}; the entry's promise is kept",
                e.key,
                e.message
            ),
        }
    }
    if let Some(p) = patch {
        super::patch::apply_patch(&mut spec, p);
    }
    spec
}

/// The group a tenant's caps are held on, named, with whether its members
/// share one limit: a VM's disks in a QEMU throttle group, a pod's
/// containers on the pod's cgroup (v2). A plain member of a `[[group]]` with
/// a cgroup it lives under is marked as sharing that group's limit instead.
fn holder_of(
    t: &TenantConfig,
    found: &Found,
    spec: &mut TenantSpec,
    cgroup_v2: bool,
    host: Option<&str>,
) -> Option<(String, bool)> {
    match (&t.source, &found.kind) {
        (
            TenantSource::Libvirt {
                domain: pattern, ..
            },
            FoundKind::Libvirt { domain, .. },
        ) if t.share == Some(Share::Vm) => {
            let name = if pattern.contains(['*', '?', '[']) {
                format!("{}/{domain}", t.name)
            } else {
                t.name.clone()
            };
            let name = match host {
                Some(h) => format!("{h}/{name}"),
                None => name,
            };
            Some((name, true))
        }
        (TenantSource::Kubernetes { .. }, FoundKind::Cgroup(rel)) => {
            crate::kubernetes::pod_of(rel).map(|uid| (format!("{}/{uid}", t.name), cgroup_v2))
        }
        (_, FoundKind::Cgroup(rel)) if cgroup_v2 && group_holds(t, rel).is_some() => {
            // A `[[group]]` with a cgroup this tenant lives under: its
            // members' caps go there, added up (v2 bounds a subtree).
            if let Some(g) = &spec.group {
                spec.group = Some(Arc::new(GroupSpec {
                    shared_limit: true,
                    ..(**g).clone()
                }));
            }
            None
        }
        _ => None,
    }
}

/// The group of a container whose pod's annotations declare a promise:
/// the parts they give replace the entry's. A mix that does not hold keeps
/// the entry's whole.
fn pod_group(t: &TenantConfig, found: &Found) -> Option<GroupSpec> {
    let c = found.container.as_ref()?;
    let (pod, d) = (c.pod.as_ref()?, c.declared.as_ref()?);
    let mut group = GroupSpec {
        name: format!("{}/{pod}", t.name),
        floor: d.floor.or(t.floor),
        ceiling: d.ceiling.or(t.ceiling),
        weight: d.weight.unwrap_or(t.weight),
        parent: d.group.clone().or_else(|| t.group.clone()),
        shared_limit: false,
    };
    if let Err(e) =
        iofloor_core::model::check_promise(group.floor, group.ceiling, Some(group.weight))
    {
        warn!(pod = %group.name, "its annotations with its entry's promise: `{}` {}; the entry's promise is kept", e.key, e.message);
        (group.floor, group.ceiling, group.weight) = (t.floor, t.ceiling, t.weight);
        group.parent = t.group.clone();
    }
    Some(group)
}

/// The state file's key for a pod's own cgroup, whose limits iofloor
/// changes on cgroup v2 (a group's name, never a tenant's).
fn pod_key(group: &str) -> String {
    format!("{group} (pod cgroup)")
}

/// The state file's key for a `[[group]]`'s own cgroup, as for a pod's.
fn group_key(group: &str) -> String {
    format!("{group} (group cgroup)")
}

/// The cgroup of `t`'s `[[group]]` if the tenant at `rel` lives under it
/// (below it, not the group's cgroup itself).
fn group_holds<'a>(t: &'a TenantConfig, rel: &Path) -> Option<&'a Path> {
    t.group_cgroup
        .as_deref()
        .filter(|g| rel != *g && rel.starts_with(g))
}

/// A QEMU throttle group's name for an iofloor group: QEMU takes letters,
/// digits, `-`, `.` and `_`, starting with a letter.
fn throttle_group_name(group: &str) -> String {
    let clean: String = group
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("iofloor-{clean}")
}

/// Restores limits a previous run left behind (after a crash). Returns the
/// entries whose limits could not be put back (libvirt down, a monitor
/// that hangs): they stay the record of those originals, so a tenant found
/// again is not recorded with iofloor's old caps as its "original".
pub fn restore_leftovers(path: &Path) -> anyhow::Result<Vec<Entry>> {
    let Some((pid, entries)) = Ownership::leftovers(path)? else {
        return Ok(Vec::new());
    };
    if pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "iofloor" {
            anyhow::bail!(
                "{}: another iofloor (pid {pid}) is running with this state file",
                path.display()
            );
        }
    }
    let mut kept = Vec::new();
    for e in &entries {
        if let Err(err) = restore(&e.tenant, &e.original, None) {
            warn!(tenant = %e.tenant, "could not restore limits left by pid {pid}: {err}; kept in the state file");
            kept.push(e.clone());
        }
    }
    info!(
        "restored the limits of {} of {} tenants left by a previous run (pid {pid})",
        entries.len() - kept.len(),
        entries.len()
    );
    std::fs::remove_file(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(kept)
}

/// Puts one recorded original back, without a tenant to go with it.
pub(super) fn restore_entry(e: &Entry) -> anyhow::Result<()> {
    restore(&e.tenant, &e.original, None)
}

/// Puts one tenant's original limits back, through the device's backends
/// when the daemon has them (a QMP socket serves one client at a time).
pub(super) fn restore(
    tenant: &str,
    original: &Original,
    backend: Option<&mut HybridBackend>,
) -> anyhow::Result<()> {
    match original {
        Original::Cgroup {
            root,
            cgroup,
            device,
            caps,
        } => {
            if !root.join(cgroup).is_dir() {
                return Ok(());
            }
            let io = iofloor_host::cgroup::controller(root, *device)?;
            io.set_caps(cgroup, caps)?;
        }
        Original::Qmp {
            socket,
            drive,
            limits,
        } => {
            if !socket.exists() {
                return Ok(());
            }
            let result = match backend.map(|b| &mut b.qmp) {
                Some(q) if q.has_tenant(tenant) => q.set_drive_throttle(tenant, limits),
                _ => {
                    let mut q = QmpBackend::new(QMP_TIMEOUT);
                    q.add_tenant(tenant, socket, QmpTarget::Drive { id: drive.clone() });
                    q.set_drive_throttle(tenant, limits)
                }
            };
            match result {
                // A stale socket of a QEMU that is gone: its throttle went with it.
                Err(HostError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::ConnectionRefused => {}
                other => other?,
            }
        }
        Original::Libvirt {
            uri,
            uuid,
            domain,
            disk,
            tune,
        } => {
            let result = match backend.and_then(|b| b.libvirt.as_mut()) {
                Some(l) if l.has_tenant(tenant) => l.set_io_tune(tenant, tune),
                _ => {
                    let mut l = LibvirtBackend::new(uri, LIBVIRT_TIMEOUT)?;
                    let info = DomainInfo {
                        name: domain.clone(),
                        uuid: uuid.clone(),
                        disks: vec![disk.clone()],
                    };
                    l.add_tenant(tenant, &info, disk, None);
                    l.set_io_tune(tenant, tune)
                }
            };
            match result {
                // A domain that is gone or stopped took its live limits
                // with it (they are not in its persistent config).
                Err(HostError::Unavailable(m))
                    if m.contains("not running")
                        || m.contains("Domain not found")
                        || m.contains("no domain") => {}
                other => other?,
            }
        }
    }
    Ok(())
}

impl Service {
    /// Stops controlling a tenant and restores its original limits; false
    /// if they could not be restored (kept in the state file).
    pub(super) fn release(&mut self, name: &str) -> bool {
        let Some(t) = self.roster.remove(name) else {
            return true;
        };
        let d = &mut self.devices[t.device];
        d.stop_deciding(name);
        let restored = match self.ownership.get(name).map(|e| e.original.clone()) {
            Some(original) => match d.restore_limits(name, &original) {
                Ok(()) => true,
                Err(e) => {
                    warn!(tenant = %name, "could not restore its limits: {e}");
                    false
                }
            },
            None => true,
        };
        let mut pod_restored = true;
        // The pod's last container: the pod's cgroup gets its limits back
        // (kept in the state file if that fails, as a tenant's are).
        if let (Some(_), Some(g)) = (d.disconnect(name), &t.spec.group) {
            let key = [pod_key(&g.name), group_key(&g.name)]
                .into_iter()
                .find(|k| self.ownership.get(k).is_some())
                .unwrap_or_default();
            if let Some(e) = self.ownership.get(&key).cloned() {
                match restore(&key, &e.original, None) {
                    Ok(()) => self.ownership.forget(&key),
                    Err(err) => {
                        warn!(group = %g.name, "could not restore the pod cgroup's limits: {err}");
                        pod_restored = false;
                    }
                }
            }
        }
        if restored {
            self.ownership.forget(name);
        }
        let view = {
            let mut view = self.shared.view.lock().unwrap();
            view.history.remove(name);
            view.tenants.remove(name)
        };
        if let Some(v) = view {
            self.shared.metrics.forget_tenant(&v);
        }
        restored && pod_restored
    }

    /// Adopts a found tenant: stages its current limits for the state file,
    /// which [`Service::reconcile`] writes before anything is written to it.
    pub(super) fn adopt(&mut self, found: Found) {
        let device = self.config.tenants[found.entry].device;
        let spec = Arc::new(self.spec_for(found.entry, &found));
        let kept = self.kept_original(&found);
        let original = match self.reach(device, &found, &spec, kept) {
            Ok(original) => original,
            Err(e) => {
                // Gone between discovery and now, its limits unreadable, or
                // its VM's monitor or libvirt not answering: never written
                // to; tried again with the finder's backoff.
                let message = format!("cannot adopt: {e}");
                self.finder
                    .failed(&found.name, &message, self.clock.ticks());
                return;
            }
        };
        // On disk with the reconcile's flush, before the controller's next write.
        self.ownership.stage(Entry {
            tenant: found.name.clone(),
            original,
        });
        if let FoundKind::Cgroup(rel) = &found.kind {
            self.devices[device].connect_cgroup(&found.name, rel.clone());
            self.share_group_limit(device, &found, &spec, rel);
        }
        self.devices[device].start_deciding(spec.clone());
        self.finder.adopted(&found.name);
        info!(tenant = %found.name, path = %found.path(&self.cgroup_root).display(), "adopted");
        self.roster.insert(
            found.name.clone(),
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
            },
        );
    }

    /// The limits the state file keeps for a tenant whose restore failed
    /// when it was released, if it is the same cgroup, drive or disk: what
    /// it has now is iofloor's own caps, which must not become its
    /// "original".
    fn kept_original(&self, found: &Found) -> Option<Original> {
        let e = self.ownership.get(&found.name)?;
        let same = match (&e.original, &found.kind) {
            (Original::Cgroup { cgroup, .. }, FoundKind::Cgroup(rel)) => cgroup == rel,
            (
                Original::Qmp { socket, drive, .. },
                FoundKind::Qmp {
                    socket: s,
                    drive: dr,
                },
            ) => socket == s && drive == dr,
            (
                Original::Libvirt { uuid, disk, .. },
                FoundKind::Libvirt {
                    uuid: u, disk: dk, ..
                },
            ) => uuid == u && disk == dk,
            _ => false,
        };
        same.then(|| e.original.clone())
    }

    /// Connects a found tenant to its device's backend and returns the
    /// limits to put back on release: `kept`, or those it has now. On an
    /// error nothing of it is left in the backend.
    fn reach(
        &mut self,
        device: usize,
        found: &Found,
        spec: &TenantSpec,
        kept: Option<Original>,
    ) -> Result<Original, HostError> {
        match &found.kind {
            FoundKind::Libvirt { domain, uuid, disk } => {
                let disk = DomainInfo {
                    name: domain.clone(),
                    uuid: uuid.clone(),
                    disks: vec![disk.clone()],
                };
                self.reach_libvirt(device, found, spec, kept, disk)
            }
            FoundKind::Qmp { socket, drive } => {
                self.devices[device].connect_qmp(&found.name, socket, drive, kept)
            }
            FoundKind::Cgroup(rel) => match kept {
                Some(kept) => Ok(kept),
                None => {
                    let d = &self.devices[device];
                    Ok(Original::Cgroup {
                        root: self.cgroup_root.clone(),
                        cgroup: rel.clone(),
                        device: d.id(),
                        caps: d.cgroup_caps(rel)?,
                    })
                }
            },
        }
    }

    /// [`Service::reach`] for a libvirt domain's disk: `vm` names the
    /// domain and its one disk that is the tenant.
    fn reach_libvirt(
        &mut self,
        device: usize,
        found: &Found,
        spec: &TenantSpec,
        kept: Option<Original>,
        vm: DomainInfo,
    ) -> Result<Original, HostError> {
        let uri = self.config.libvirt_uri.clone();
        // `share = "vm"`: the VM's disks share one QEMU throttle group
        // holding their caps added up.
        let shared = spec
            .group
            .as_ref()
            .filter(|_| self.config.tenants[found.entry].share.is_some())
            .map(|g| throttle_group_name(&g.name));
        self.devices[device].connect_libvirt(&uri, &found.name, vm, shared.as_deref(), kept)
    }

    /// A pod, or a `[[group]]` with a cgroup of its own, on cgroup v2: its
    /// members' caps go to that cgroup, added up, whose limits are recorded
    /// first as a tenant's. On cgroup v1 blk-throttle is flat: the members
    /// keep their own.
    fn share_group_limit(&mut self, device: usize, found: &Found, spec: &TenantSpec, rel: &Path) {
        let entry = &self.config.tenants[found.entry];
        let holder = match (&entry.source, &spec.group) {
            (TenantSource::Kubernetes { .. }, Some(g)) => {
                crate::kubernetes::pod_cgroup(rel).map(|c| (c, pod_key(&g.name)))
            }
            (_, Some(g)) if g.shared_limit => {
                group_holds(entry, rel).map(|c| (c.to_path_buf(), group_key(&g.name)))
            }
            _ => None,
        };
        if let (Some(group), None, true) = (&entry.group_cgroup, &holder, self.cgroup_v2) {
            warn!(
                tenant = %found.name,
                cgroup = %rel.display(),
                "lives outside its group's cgroup {}: capped on its own",
                group.display()
            );
        }
        let Some((pod_cgroup, key)) = holder.filter(|_| self.cgroup_v2) else {
            return;
        };
        let d = &mut self.devices[device];
        let recorded = self.ownership.get(&key).is_some()
            || match d.cgroup_caps(&pod_cgroup) {
                Ok(caps) => {
                    self.ownership.stage(Entry {
                        tenant: key,
                        original: Original::Cgroup {
                            root: self.cgroup_root.clone(),
                            cgroup: pod_cgroup.clone(),
                            device: d.id(),
                            caps,
                        },
                    });
                    true
                }
                Err(e) => {
                    debug!(tenant = %found.name, "group cgroup limits unreadable ({e}): caps stay on the member");
                    false
                }
            };
        if recorded {
            d.share_cgroup_limit(&found.name, pod_cgroup);
        }
    }

    /// Undoes an adoption whose record never reached the disk: nothing was
    /// written to the tenant, so nothing is restored.
    fn abandon(&mut self, name: &str) {
        if let Some(t) = self.roster.remove(name) {
            let d = &mut self.devices[t.device];
            d.stop_deciding(name);
            d.disconnect(name);
        }
        self.ownership.forget(name);
    }

    /// Finds tenants, adopts new ones, drops vanished ones.
    pub(super) fn reconcile(&mut self) {
        let Finding {
            found,
            libvirt_unknown,
            runtimes_down,
        } = self
            .finder
            .find(&self.config, &self.cgroup_root, self.cgroup_v2);
        let present: std::collections::HashSet<&str> =
            found.iter().map(|f| f.name.as_str()).collect();
        // libvirt that could not be asked says nothing of its domains: its
        // tenants stay (unavailable while it cannot be read), never dropped.
        let gone: Vec<String> = self
            .roster
            .tenants()
            .filter(|t| {
                let kept = (libvirt_unknown && matches!(t.found.kind, FoundKind::Libvirt { .. }))
                    || t.found
                        .container
                        .as_ref()
                        .is_some_and(|c| runtimes_down.contains(&c.runtime));
                !(present.contains(t.found.name.as_str()) || kept)
            })
            .map(|t| t.found.name.clone())
            .collect();
        for name in gone {
            info!(tenant = %name, "gone; dropped");
            self.release(&name);
            self.roster.forget_overrides(&name);
        }
        self.finder.forget_absent(&present);
        let mut adopted = Vec::new();
        for f in found {
            let moved = self.roster.get(&f.name).is_some_and(|t| t.found != f);
            if moved {
                self.release(&f.name);
            }
            if !self.roster.contains(&f.name) && self.finder.due(&f.name, self.clock.ticks()) {
                adopted.push(f.name.clone());
                self.adopt(f);
            }
        }
        if let Err(e) = self.ownership.flush() {
            // Their limits are not on disk: they must not be written to.
            adopted.retain(|n| self.roster.contains(n));
            for name in &adopted {
                warn!(tenant = %name, "not adopted, the state file cannot be written: {e}");
                self.abandon(name);
            }
        }
    }
}
