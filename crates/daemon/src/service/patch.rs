//! A tenant's promise changed through the API: checked, refused if the
//! floors would no longer fit, kept across reloads.

use super::Service;
use crate::view::{AdmissionView, TenantView};
use iofloor_core::units::Rate;
use iofloor_core::TenantSpec;
use tracing::info;

/// A change to a tenant's promise, from the API.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Patch {
    /// `Some(None)` clears the floor.
    pub floor: Option<Option<Rate>>,
    pub ceiling: Option<Option<Rate>>,
    pub weight: Option<f64>,
}

#[derive(Debug)]
pub enum PatchError {
    NotFound(String),
    Invalid(String),
    Refused {
        message: String,
        admission: AdmissionView,
    },
}

pub(super) fn apply_patch(spec: &mut TenantSpec, p: &Patch) {
    if let Some(f) = p.floor {
        spec.floor = f;
    }
    if let Some(c) = p.ceiling {
        spec.ceiling = c;
    }
    if let Some(w) = p.weight {
        spec.weight = w;
    }
}

impl Service {
    /// A floor, ceiling or weight change from the API: checked, refused if
    /// the floors would no longer fit, else in force from the next interval.
    pub(super) fn patch(&mut self, name: &str, patch: Patch) -> Result<TenantView, PatchError> {
        let t = self
            .roster
            .get(name)
            .ok_or_else(|| PatchError::NotFound(format!("no tenant `{name}`")))?;
        let shared = self.config.cluster.as_ref().map(|c| c.device);
        if patch.floor.is_some() && shared == Some(t.device) && self.roster.has_cluster_floor(name)
        {
            return Err(PatchError::Invalid(format!(
                "the floor of `{name}` is set for the whole cluster: change it with \
                 `iofloor cluster set-floor` (PUT /api/v1/cluster/floors/{name})"
            )));
        }
        let entry = &self.config.tenants[t.found.entry];
        let holder = match entry.source {
            _ if entry.share.is_some() => Some("VM's (`share = \"vm\"`), shared by its disks"),
            crate::config::TenantSource::Kubernetes { .. } => {
                Some("pod's, shared by its containers")
            }
            _ => None,
        };
        if let (true, Some(holder)) = (patch.floor.is_some() || patch.ceiling.is_some(), holder) {
            return Err(PatchError::Invalid(format!(
                "the floor and ceiling of `{name}` are its {holder}: change them in its config entry"
            )));
        }
        let mut spec = (*t.spec).clone();
        apply_patch(&mut spec, &patch);
        spec.check_promise()
            .map_err(|e| PatchError::Invalid(e.to_string()))?;
        let raises_floor = match (t.spec.floor, spec.floor) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(old), Some(new)) => old.unit() != new.unit() || new.value() > old.value(),
        };
        if raises_floor {
            let verdicts = self.admission(Some(&spec));
            if let Some(v) = verdicts
                .into_iter()
                .nth(t.device)
                .filter(|v| v.total_floor_cost > v.usable_capacity * (1.0 + 1e-9))
            {
                return Err(PatchError::Refused {
                    message: format!("refused: the new floor does not fit: {}", v.summary),
                    admission: v,
                });
            }
        }
        info!(tenant = %name, floor = ?spec.floor, ceiling = ?spec.ceiling, weight = spec.weight, "changed through the API");
        self.put_spec(name, spec);
        self.roster.add_override(name, &patch);
        let t = self.roster.get(name).expect("looked up above");
        let view = self.tenant_view(t);
        self.shared
            .view
            .lock()
            .unwrap()
            .tenants
            .insert(name.to_string(), view.clone());
        Ok(view)
    }
}
