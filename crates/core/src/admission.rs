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
    /// A group's row: its floor beyond what its members' own floors add up
    /// to (a group's floor is at least theirs).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub group: bool,
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
    let mut rows: Vec<AdmissionTenant> = tenants
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
                group: false,
            }
        })
        .collect();
    // Groups after their members: what each promises beyond them, priced at
    // its members' mixes together.
    let tree = crate::hierarchy::Tree::of_specs(tenants.iter().map(|(s, _)| *s));
    if !tree.is_flat() {
        let mixes: Vec<Option<Usage>> = tenants.iter().map(|(_, m)| *m).collect();
        let groups = crate::policy::price_groups(&tree, &mixes, cost);
        let mut floor: Vec<f64> = rows.iter().map(|r| r.floor_cost.unwrap_or(0.0)).collect();
        floor.extend(&groups.floor);
        for &node in tree.top_down().iter().rev() {
            if node < tree.leaves() {
                continue;
            }
            let members: f64 = tree.children(node).iter().map(|&c| floor[c]).sum();
            let beyond = (floor[node] - members).max(0.0);
            floor[node] = floor[node].max(members);
            let spec = &tree.groups()[node - tree.leaves()];
            if spec.floor.is_none() {
                continue;
            }
            sum += beyond;
            let guaranteed = sum <= usable_capacity * (1.0 + 1e-9);
            admitted &= guaranteed;
            rows.push(AdmissionTenant {
                name: spec.name.clone(),
                floor_cost: Some(beyond),
                guaranteed,
                group: true,
            });
        }
    }
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
    fn a_groups_floor_beyond_its_members_counts() {
        let c = ctx().cost;
        let mut customer = crate::model::GroupSpec::new("customer");
        customer.floor = Some(Rate::Iops(800.0));
        let customer = std::sync::Arc::new(customer);
        let member = |name: &str, floor: Option<f64>| {
            let mut s = TenantSpec::new(name, TenantClass::Container);
            s.floor = floor.map(Rate::Iops);
            s.group = Some(customer.clone());
            s
        };
        let (a, b) = (member("a", Some(300.0)), member("b", None));
        let other = TenantSpec::new("other", TenantClass::Container).with_floor(Rate::Iops(100.0));
        let mix = Some(writes64k(1.0));
        // 300 + 100 as tenants, then the customer's 500 beyond its members:
        // 900 of the device's 1,000 64 KiB writes, within 970.
        let v = check(&c, 0.97, &[(&a, mix), (&b, mix), (&other, mix)]);
        assert!(v.admitted, "{}", v.summary());
        assert!((v.total_floor_cost - 0.9).abs() < 1e-9, "{v:?}");
        let row = v.tenants.last().unwrap();
        assert!(
            row.group && row.name == "customer" && (row.floor_cost.unwrap() - 0.5).abs() < 1e-9
        );
        let big = TenantSpec::new("big", TenantClass::Container).with_floor(Rate::Iops(100.0));
        let v = check(
            &c,
            0.97,
            &[(&a, mix), (&b, mix), (&other, mix), (&big, mix)],
        );
        assert_eq!(v.refused(), vec!["customer"]);
    }

    #[test]
    fn unpriced_floor_is_not_guaranteed() {
        let c = ctx().cost;
        let a = TenantSpec::new("a", TenantClass::Container).with_floor(Rate::Iops(10.0));
        assert!(!check(&c, 1.0, &[(&a, None)]).admitted);
    }
}
