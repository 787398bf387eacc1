//! What the service shows: the view the API serves, the Prometheus metrics,
//! the sample stream, and the admission verdict per device.

use super::devices::DeviceLoop;
use super::roster::{Roster, Tenant};
use super::Shared;
use crate::config::Config;
use crate::discovery::FoundKind;
use crate::view::{AdmissionView, ClusterView, Point, SourceKind, TenantView, View};
use iofloor_core::{admission, TenantSpec, Usage};
use std::path::Path;
use std::sync::Arc;

/// This agent's place in the cluster, from the etcd task's status and the
/// agent policy's mailbox; `None` on a single host.
pub(super) fn cluster_view(shared: &Shared, config: &Config) -> Option<ClusterView> {
    let link = shared.cluster.as_ref()?;
    let config = config.cluster.as_ref()?;
    let (mode, age) = {
        let m = link.mailbox.lock().unwrap_or_else(|e| e.into_inner());
        (m.mode, m.allocation_age)
    };
    let status = link
        .status
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).clone());
    Some(ClusterView {
        cluster: config.name.clone(),
        host: config.host.clone(),
        device: config.shared_device.clone(),
        role: match status.as_ref().map(|s| s.role) {
            Some(iofloor_cluster::Role::Allocator) => "allocator".into(),
            _ => "agent".into(),
        },
        allocator: status.as_ref().and_then(|s| s.allocator.clone()),
        connected: status.as_ref().is_some_and(|s| s.connected),
        hosts: status.as_ref().map(|s| s.hosts.clone()).unwrap_or_default(),
        mode: mode.map(|m| m.as_str().to_string()),
        allocation_age_s: age.map(|a| a.as_secs_f64()),
        conflicts: status
            .as_ref()
            .map(|s| s.conflicts.clone())
            .unwrap_or_default(),
        ghosts: status
            .as_ref()
            .map(|s| s.ghosts.clone())
            .unwrap_or_default(),
        leases_lost: status.map(|s| s.leases_lost).unwrap_or(0),
    })
}

/// Each tenant's view into `view`, a point of its history, and its
/// metrics; then the interval's tick to the sample stream's subscribers.
pub(super) fn show_tenants(
    shared: &Shared,
    view: &mut View,
    views: Vec<TenantView>,
    roster: &Roster,
    ticked: bool,
) {
    let t_now = view.now;
    for v in views {
        let throttled_for = roster.get(&v.name).map(|t| t.throttled_for).unwrap_or(0.0);
        shared.metrics.tenant(&v, throttled_for);
        if let Some(u) = &v.usage {
            let capped = !v.caps.is_unlimited();
            view.push_point(
                &v.name,
                Point {
                    t: t_now,
                    iops: u.iops,
                    bytes_per_sec: u.bytes_per_sec,
                    cost: u.cost,
                    latency_us: u.latency_us,
                    capped,
                },
            );
        }
        view.tenants.insert(v.name.clone(), v);
    }
    if ticked {
        let tick = serde_json::to_string(&view.tick()).expect("the view serialises");
        // No subscriber is not an error.
        let _ = shared.ticks.send(Arc::from(tick));
    }
}

impl Tenant {
    /// What the API shows of the tenant, on `device`.
    pub(super) fn view(&self, device: &DeviceLoop, cgroup_root: &Path) -> TenantView {
        let t = self;
        let d = device;
        TenantView {
            name: t.found.name.clone(),
            class: t.spec.class,
            source: match t.found.kind {
                FoundKind::Cgroup(_) => SourceKind::Cgroup,
                FoundKind::Qmp { .. } => SourceKind::Qmp,
                FoundKind::Libvirt { .. } => SourceKind::Libvirt,
            },
            path: t.found.path(cgroup_root).display().to_string(),
            device: d.state().device.clone(),
            floor: t.spec.floor,
            ceiling: t.spec.ceiling,
            weight: t.spec.weight,
            latency_sensitive: t.spec.latency_sensitive,
            available: t.available,
            error: t.error.clone(),
            usage: t.usage,
            caps: t.caps,
            floor_met: t.floor_met,
            throttled_seconds: t.throttled_seconds,
            overridden: t.overridden,
            groups: t
                .spec
                .group
                .iter()
                .flat_map(|g| g.lineage())
                .map(|g| g.name.clone())
                .collect(),
        }
    }
}

/// Admission verdict per device, with `change` (a tenant's new spec) put in
/// place of the current one; `usable_share`: the share of capacity handed
/// out while contended.
pub(super) fn admission(
    devices: &[DeviceLoop],
    roster: &Roster,
    usable_share: f64,
    change: Option<&TenantSpec>,
) -> Vec<AdmissionView> {
    devices
        .iter()
        .enumerate()
        .map(|(di, d)| {
            let specs: Vec<(TenantSpec, Usage)> = roster
                .tenants()
                .filter(|t| t.device == di)
                .map(|t| {
                    let spec = match change {
                        Some(c) if c.name == t.spec.name => c.clone(),
                        _ => (*t.spec).clone(),
                    };
                    let mix = t.last_mix.unwrap_or_else(admission::assumed_mix);
                    (spec, mix)
                })
                .collect();
            let rows: Vec<(&TenantSpec, Option<Usage>)> =
                specs.iter().map(|(s, m)| (s, Some(*m))).collect();
            // Promises are priced with the model; a learned capacity
            // below it lowers what can be promised, one above it does not
            // raise it (it comes and goes with the neighbours).
            let usable = usable_share * d.capacity_estimate().unwrap_or(1.0).min(1.0);
            AdmissionView::new(
                &d.state().device,
                &admission::check(&d.cost(), usable, &rows),
            )
        })
        .collect()
}
