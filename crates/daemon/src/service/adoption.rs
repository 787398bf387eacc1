//! Reconciling what the finder found with the roster: adopting new tenants
//! (their limits recorded on disk before anything is written to them) and
//! releasing gone ones (those limits put back).

use super::{Patch, LIBVIRT_TIMEOUT, QMP_TIMEOUT};
use crate::config::{Share, TenantConfig, TenantSource};
use crate::discovery::{Found, FoundKind};
use crate::ownership::{Entry, Original, Ownership};
use iofloor_core::GroupSpec;
use iofloor_core::TenantSpec;
use iofloor_host::backends::libvirt::{DomainInfo, LibvirtBackend};
use iofloor_host::backends::{HybridBackend, QmpBackend, QmpTarget};
use iofloor_host::HostError;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing::{info, warn};

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

/// The limits the state file keeps for a tenant whose restore failed when
/// it was released, if it is the same cgroup, drive or disk: what it has
/// now is iofloor's own caps, which must not become its "original".
pub(super) fn kept_original(ownership: &Ownership, found: &Found) -> Option<Original> {
    let e = ownership.get(&found.name)?;
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

/// The QEMU throttle group a libvirt VM's disks share with `share = "vm"`
/// (holding their caps added up); `None` for any other tenant.
pub(super) fn throttle_group(entry: &TenantConfig, spec: &TenantSpec) -> Option<String> {
    spec.group
        .as_ref()
        .filter(|_| entry.share.is_some())
        .map(|g| throttle_group_name(&g.name))
}

/// Where a cgroup tenant's caps go added up with its siblings' and the
/// state file's key for that cgroup's own limits: a pod's cgroup, or a
/// `[[group]]`'s with a cgroup of its own, on cgroup v2 (`v2`). On v1
/// blk-throttle is flat: the members keep their own.
pub(super) fn group_holder(
    entry: &TenantConfig,
    found: &Found,
    spec: &TenantSpec,
    rel: &Path,
    v2: bool,
) -> Option<(PathBuf, String)> {
    let holder = match (&entry.source, &spec.group) {
        (TenantSource::Kubernetes { .. }, Some(g)) => {
            crate::kubernetes::pod_cgroup(rel).map(|c| (c, pod_key(&g.name)))
        }
        (_, Some(g)) if g.shared_limit => {
            group_holds(entry, rel).map(|c| (c.to_path_buf(), group_key(&g.name)))
        }
        _ => None,
    };
    if let (Some(group), None, true) = (&entry.group_cgroup, &holder, v2) {
        warn!(
            tenant = %found.name,
            cgroup = %rel.display(),
            "lives outside its group's cgroup {}: capped on its own",
            group.display()
        );
    }
    holder.filter(|_| v2)
}

/// The state file's key and record of the pod or group cgroup whose
/// limits were recorded for `group`, if either was.
pub(super) fn recorded_holder(ownership: &Ownership, group: &str) -> Option<(String, Original)> {
    [pod_key(group), group_key(group)]
        .into_iter()
        .find_map(|k| Some((k.clone(), ownership.get(&k)?.original.clone())))
}
