//! Admission control: can every floor be guaranteed at once on this device?
//!
//! Floors are priced with the cost model at each tenant's expected I/O mix and
//! added up in declaration order against the share of capacity the floor
//! policy hands out. Tenants whose floor no longer fits are reported; so are
//! floors that cannot be priced (IOPS or bytes without a known mix).

use crate::cost::CostModel;
use crate::model::{TenantSpec, Usage};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdmissionTenant {
    pub name: String,
    /// The floor in cost units per second (share of the device), if priced.
    pub floor_cost: Option<f64>,
    /// Whether this floor fits together with every floor declared before it.
    pub guaranteed: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdmissionVerdict {
    /// Cost capacity available to floors (capacity × target utilisation).
    pub usable_capacity: f64,
    pub total_floor_cost: f64,
    /// True when every floor is priced and they fit together.
    pub admitted: bool,
    pub tenants: Vec<AdmissionTenant>,
}

impl AdmissionVerdict {
    /// Names of tenants whose floor cannot be guaranteed.
    pub fn refused(&self) -> Vec<&str> {
        self.tenants
            .iter()
            .filter(|t| !t.guaranteed)
            .map(|t| t.name.as_str())
            .collect()
    }

    /// One sentence for an error message or a log.
    pub fn summary(&self) -> String {
        if self.admitted {
            format!(
                "all floors fit: {:.1}% of the device's usable {:.1}%",
                self.total_floor_cost * 100.0,
                self.usable_capacity * 100.0
            )
        } else {
            format!(
                "floors need {:.1}% of the device but {:.1}% is usable; cannot guarantee: {}",
                self.total_floor_cost * 100.0,
                self.usable_capacity * 100.0,
                self.refused().join(", ")
            )
        }
    }
}

/// A mix to price floors with before a tenant has done any I/O: 4 KiB
/// random, half reads, half writes.
pub fn assumed_mix() -> Usage {
    let half = crate::model::DirUsage {
        ios: 0.5,
        bytes: 2048.0,
        seq_ios: 0.0,
    };
    Usage {
        read: half,
        write: half,
        latency_us: None,
    }
}

/// Checks a set of floors. `tenants` pairs each spec with its expected mix
/// (any non-zero usage of the right shape; its scale does not matter).
pub fn check(
    cost: &CostModel,
    usable_capacity: f64,
    tenants: &[(&TenantSpec, Option<Usage>)],
) -> AdmissionVerdict {
    let mut sum = 0.0;
    let mut admitted = true;
    let rows = tenants
        .iter()
        .map(|(spec, mix)| {
            let floor_cost = match spec.floor {
                None => Some(0.0),
                Some(f) => cost.rate_to_cost(f, &mix.unwrap_or_default()),
            };
            let guaranteed = match floor_cost {
                Some(c) => {
                    sum += c;
                    sum <= usable_capacity * (1.0 + 1e-9)
                }
                None => false,
            };
            admitted &= guaranteed;
            AdmissionTenant {
                name: spec.name.clone(),
                floor_cost,
                guaranteed,
            }
        })
        .collect();
    AdmissionVerdict {
        usable_capacity,
        total_floor_cost: sum,
        admitted,
        tenants: rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TenantClass;
    use crate::policy::testutil::{ctx, writes64k};
    use crate::units::Rate;

    #[test]
    fn reports_the_floors_that_do_not_fit() {
        let c = ctx().cost;
        let a = TenantSpec::new("a", TenantClass::Container).with_floor(Rate::Iops(600.0));
        let b = TenantSpec::new("b", TenantClass::Vm).with_floor(Rate::Iops(300.0));
        let d = TenantSpec::new("d", TenantClass::Vm).with_floor(Rate::Cost(0.2));
        let mix = Some(writes64k(1.0));
        let v = check(&c, 0.97, &[(&a, mix), (&b, mix), (&d, None)]);
        assert!(!v.admitted);
        assert_eq!(v.refused(), vec!["d"]);
        assert!((v.total_floor_cost - 1.1).abs() < 1e-9);
        assert!(v.summary().contains("cannot guarantee: d"));
        let ok = check(&c, 0.97, &[(&a, mix), (&b, mix)]);
        assert!(ok.admitted, "{}", ok.summary());
    }

    #[test]
    fn unpriced_floor_is_not_guaranteed() {
        let c = ctx().cost;
        let a = TenantSpec::new("a", TenantClass::Container).with_floor(Rate::Iops(10.0));
        assert!(!check(&c, 1.0, &[(&a, None)]).admitted);
    }
}
