//! `static`: the fixed caps operators configure today in QEMU, Cinder QoS or
//! Firecracker. Each tenant is capped, for good, at its floor-proportional share
//! of the device (floors scaled up until they fill the capacity). Nothing is
//! handed over when a neighbour is idle: that is the waste iofloor removes.

use super::{MixMemory, Policy, PolicyContext};
use crate::model::{Caps, Snapshot};
use std::collections::HashMap;

pub struct StaticPolicy {
    ctx: PolicyContext,
    mixes: MixMemory,
    /// Caps fixed when a tenant's traffic was first seen, kept in kernel units.
    fixed: HashMap<String, Caps>,
}

impl StaticPolicy {
    pub fn new(ctx: PolicyContext) -> Self {
        StaticPolicy {
            ctx,
            mixes: MixMemory::default(),
            fixed: HashMap::new(),
        }
    }
}

impl Policy for StaticPolicy {
    fn name(&self) -> &'static str {
        "static"
    }

    fn verdicts(&self, snapshot: &Snapshot) -> crate::judge::Verdicts {
        super::verdicts_at_model(&self.ctx, snapshot, crate::judge::DEFAULT_BORDER)
    }

    fn decide(&mut self, snapshot: &Snapshot) -> Vec<Caps> {
        let mixes = self.mixes.observe(snapshot.tenants);
        // A tenant's share is its floor's cost; without a floor, its weight
        // as a fraction of the default weight times an equal split.
        let equal = self.ctx.capacity / snapshot.tenants.len().max(1) as f64;
        let shares: Vec<Option<f64>> = snapshot
            .tenants
            .iter()
            .zip(&mixes)
            .map(|(t, mix)| match (t.spec.floor, mix) {
                (Some(floor), Some(mix)) => self.ctx.cost.rate_to_cost(floor, mix),
                (Some(crate::units::Rate::Cost(c)), None) => Some(c),
                (Some(_), None) => None,
                (None, _) => Some(equal * t.spec.weight / crate::model::DEFAULT_WEIGHT),
            })
            .collect();
        // In groups: a member's share of its group's floor (its own floor
        // first, the rest by weight), as an operator would split it by hand.
        let tree = crate::hierarchy::Tree::build(snapshot.tenants);
        let shares = if tree.is_flat() {
            shares
        } else {
            self.split_group_floors(snapshot, &tree, &mixes, &shares)
        };
        let total: f64 = shares.iter().flatten().sum();
        let scale = if total > 0.0 {
            self.ctx.capacity / total
        } else {
            0.0
        };
        let caps = snapshot
            .tenants
            .iter()
            .zip(shares.iter().zip(&mixes))
            .map(|(t, (share, mix))| {
                if let Some(caps) = self.fixed.get(&t.spec.name) {
                    return *caps;
                }
                match (share, mix) {
                    (Some(share), Some(mix)) => {
                        let caps = self.ctx.cost.caps_for_cost(share * scale, mix);
                        self.fixed.insert(t.spec.name.clone(), caps);
                        caps
                    }
                    _ => Caps::NONE,
                }
            })
            .collect();
        self.mixes.keep(mixes);
        caps
    }
}

impl StaticPolicy {
    /// Each member's share of its group's floor (its own floor first, the
    /// rest by weight), where the group has one left for it; `shares`
    /// elsewhere.
    fn split_group_floors(
        &self,
        snapshot: &Snapshot,
        tree: &crate::hierarchy::Tree,
        mixes: &[Option<crate::model::Usage>],
        shares: &[Option<f64>],
    ) -> Vec<Option<f64>> {
        let groups = super::price_groups(tree, mixes, &self.ctx.cost);
        let n = snapshot.tenants.len();
        let mut own: Vec<f64> = snapshot
            .tenants
            .iter()
            .zip(shares)
            .map(|(t, s)| {
                if t.spec.floor.is_some() {
                    s.unwrap_or(0.0)
                } else {
                    0.0
                }
            })
            .collect();
        own.extend(&groups.floor);
        let mut weight: Vec<f64> = snapshot.tenants.iter().map(|t| t.spec.weight).collect();
        weight.extend(&groups.weight);
        let mut ceiling = vec![f64::INFINITY; n];
        ceiling.extend(&groups.ceiling);
        let every = vec![f64::INFINITY; n];
        let split = tree.effective_floors(&own, &ceiling, &weight, &every);
        shares
            .iter()
            .enumerate()
            .map(|(i, s)| match tree.parent(i) {
                Some(_) if split[i] > 0.0 => Some(split[i]),
                _ => *s,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::*;
    use std::time::Duration;

    #[test]
    fn caps_are_floor_proportional_and_fixed() {
        let mut p = StaticPolicy::new(ctx());
        let tenants = vec![
            tenant("a", Some(300.0), writes64k(100.0), Caps::NONE),
            tenant("b", Some(100.0), writes64k(50.0), Caps::NONE),
        ];
        let snap = Snapshot {
            now: Duration::ZERO,
            interval: Duration::from_secs(1),
            device: None,
            tenants: &tenants,
            foreign_load: 0.0,
        };
        let caps = p.decide(&snap);
        // 1,000 IOPS device split 3:1.
        assert!(
            (caps[0].write_iops.unwrap() - 750.0).abs() < 1.0,
            "{caps:?}"
        );
        assert!((caps[1].write_iops.unwrap() - 250.0).abs() < 1.0);
        // Idle neighbour or not, the caps stay.
        let idle = vec![
            tenant("a", Some(300.0), writes64k(750.0), caps[0]),
            tenant("b", Some(100.0), writes64k(0.0), caps[1]),
        ];
        let again = p.decide(&Snapshot {
            tenants: &idle,
            foreign_load: 0.0,
            ..snap
        });
        assert_eq!(again, caps);
    }
}
