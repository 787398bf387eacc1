//! A tenant's promise changed through the API: checked, refused if the
//! floors would no longer fit, kept across reloads.

use super::Tenant;
use crate::config::Config;
use crate::view::AdmissionView;
use iofloor_core::units::Rate;
use iofloor_core::TenantSpec;

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

/// `patch` applied to tenant `t`'s spec, checked: a floor the cluster
/// sets (`cluster_floor`) or a VM's or pod's shared promise is refused, as
/// is a promise that does not hold. Returns the new spec and whether it
/// raises the floor (then admission must still agree).
pub(super) fn checked(
    config: &Config,
    t: &Tenant,
    patch: &Patch,
    cluster_floor: bool,
) -> Result<(TenantSpec, bool), PatchError> {
    let name = &t.spec.name;
    let shared = config.cluster.as_ref().map(|c| c.device);
    if patch.floor.is_some() && shared == Some(t.device) && cluster_floor {
        return Err(PatchError::Invalid(format!(
            "the floor of `{name}` is set for the whole cluster: change it with \
             `iofloor cluster set-floor` (PUT /api/v1/cluster/floors/{name})"
        )));
    }
    let entry = &config.tenants[t.found.entry];
    let holder = match entry.source {
        _ if entry.share.is_some() => Some("VM's (`share = \"vm\"`), shared by its disks"),
        crate::config::TenantSource::Kubernetes { .. } => Some("pod's, shared by its containers"),
        _ => None,
    };
    if let (true, Some(holder)) = (patch.floor.is_some() || patch.ceiling.is_some(), holder) {
        return Err(PatchError::Invalid(format!(
            "the floor and ceiling of `{name}` are its {holder}: change them in its config entry"
        )));
    }
    let mut spec = (*t.spec).clone();
    apply_patch(&mut spec, patch);
    spec.check_promise()
        .map_err(|e| PatchError::Invalid(e.to_string()))?;
    let raises_floor = match (t.spec.floor, spec.floor) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(old), Some(new)) => old.unit() != new.unit() || new.value() > old.value(),
    };
    Ok((spec, raises_floor))
}
