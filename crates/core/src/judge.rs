//! The verdicts every part of iofloor must agree on: when a device is
//! contended, what a tenant is entitled to in a window, and when a floor
//! counts as met. The policy decides with them, the report measures with them
//! and the service shows them, so the three cannot drift apart (docs/metrics.md).

use crate::cost::CostModel;
use crate::model::{Snapshot, Usage};
use crate::units::Rate;

/// A tenant meets its floor in a window when it gets at least this share of
/// what it is entitled to; below it the window counts as missed. The 5 %
/// allows for one window's sampling noise on a rate exactly at the floor.
pub const MISS_THRESHOLD: f64 = 0.95;

/// The load share at which a device counts as contended unless a policy is
/// told otherwise (`FloorParams::border`).
pub const DEFAULT_BORDER: f64 = 0.9;

/// What a tenant is entitled to in a window, in its floor's unit: its floor,
/// or its demand if that is smaller. `None` when it has no floor.
pub fn entitlement(floor: Option<f64>, demand: Option<f64>) -> Option<f64> {
    let floor = floor?;
    Some(match demand {
        Some(d) => floor.min(d),
        None => floor,
    })
}

/// Whether `got` meets `entitled` (both in the same unit).
pub fn floor_met(got: f64, entitled: f64) -> bool {
    got >= MISS_THRESHOLD * entitled
}

/// Whether a device is contended: the load handed out (in cost units, as a
/// share of the capacity believed in) is at or past `border`, or the device
/// queue is past its knee where both are known. The queue speaks for itself
/// when the cost model is optimistic: the device is saturated even though the
/// model says there is room.
pub fn contended(
    load_share: f64,
    border: f64,
    avg_queue: Option<f64>,
    queue_knee: Option<f64>,
) -> bool {
    let by_load = load_share >= border;
    let by_queue = matches!((avg_queue, queue_knee), (Some(q), Some(knee)) if q > knee);
    by_load || by_queue
}

/// The service's reading of a floor when it cannot know the tenant's demand:
/// met when it got at least [`MISS_THRESHOLD`] of the floor, or got less while
/// the device was not contended (so it asked for less).
pub fn floor_met_without_demand(got: f64, floor: f64, contended: bool) -> bool {
    floor_met(got, floor) || !contended
}

/// What a policy judged of one interval, for everything that shows it (the
/// service's view, metrics, API, dashboard): nothing downstream judges again,
/// so what is shown follows the rule the policy decided by, queue knee and
/// learned capacity included (`Policy::verdicts`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdicts {
    pub contended: bool,
    /// One per tenant of the snapshot, in its order.
    pub tenants: Vec<TenantVerdict>,
}

/// One tenant's verdict for an interval.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TenantVerdict {
    /// The figure the tenant was judged against, in its floor's unit: its
    /// floor (a live service cannot know its demand). `None` without one.
    pub entitled: Option<f64>,
    /// Whether it met that floor ([`floor_met_without_demand`]); `None`
    /// without a floor or a sample.
    pub floor_met: Option<bool>,
}

impl Verdicts {
    /// Each tenant's floor judged against what it used, given the device's
    /// contention as the policy judged it.
    pub fn judge(snapshot: &Snapshot, contended: bool, cost: &CostModel) -> Verdicts {
        let tenants = snapshot
            .tenants
            .iter()
            .map(|t| {
                let Some(floor) = t.spec.floor else {
                    return TenantVerdict::default();
                };
                TenantVerdict {
                    entitled: Some(floor.value()),
                    floor_met: t.usage.as_ref().map(|u| {
                        floor_met_without_demand(
                            used_in_unit_of(u, floor, cost),
                            floor.value(),
                            contended,
                        )
                    }),
                }
            })
            .collect();
        Verdicts { contended, tenants }
    }
}

/// What `usage` amounts to in the unit of `rate`.
pub fn used_in_unit_of(usage: &Usage, rate: Rate, cost: &CostModel) -> f64 {
    match rate {
        Rate::Iops(_) => usage.iops(),
        Rate::BytesPerSec(_) => usage.bytes_per_sec(),
        Rate::Cost(_) => cost.cost_rate(usage),
    }
}

/// Contention as a policy without a capacity loop judges it: the tenants'
/// load (and the load beside them it was told of) at the model's price, as
/// a share of `capacity` (1.0 where it is not a positive number), at or
/// past `border`. Such a policy knows no queue knee, so the queue is not
/// asked.
pub fn contended_at_model(
    snapshot: &Snapshot,
    cost: &CostModel,
    capacity: f64,
    border: f64,
) -> bool {
    let load: f64 = snapshot
        .tenants
        .iter()
        .filter_map(|t| t.usage.as_ref())
        .map(|u| cost.cost_rate(u))
        .sum();
    let capacity = if capacity.is_finite() && capacity > 0.0 {
        capacity
    } else {
        1.0
    };
    contended(
        (load + snapshot.foreign_load()) / capacity,
        border,
        None,
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entitlement_is_the_smaller_of_floor_and_demand() {
        assert_eq!(entitlement(Some(100.0), Some(40.0)), Some(40.0));
        assert_eq!(entitlement(Some(100.0), None), Some(100.0));
        assert_eq!(entitlement(None, Some(40.0)), None);
    }

    #[test]
    fn a_floor_is_met_at_the_threshold() {
        assert!(floor_met(95.0, 100.0));
        assert!(!floor_met(94.9, 100.0));
        assert!(
            floor_met_without_demand(10.0, 100.0, false),
            "asked for less on an idle device"
        );
        assert!(!floor_met_without_demand(10.0, 100.0, true));
    }

    #[test]
    fn a_policy_without_a_capacity_loop_judges_its_load_at_the_model() {
        use crate::model::{TenantSample, TenantSpec};
        use crate::synthetic::{iops_only_model, random_reads_4k};
        use std::sync::Arc;
        let cost = iops_only_model(4000.0);
        let tenant = |iops: f64, floor: Option<f64>| {
            let mut spec = TenantSpec::new("t", Default::default());
            spec.floor = floor.map(Rate::Iops);
            TenantSample {
                spec: Arc::new(spec),
                usage: Some(random_reads_4k(iops)),
                caps: crate::model::Caps::NONE,
            }
        };
        let tenants = [tenant(1800.0, Some(1000.0)), tenant(1800.0, None)];
        let snapshot = |foreign_load: f64| Snapshot {
            now: Default::default(),
            interval: std::time::Duration::from_secs(1),
            device: None,
            tenants: &tenants,
            foreign_load,
        };
        // 3,600 of 4,000 IOPS: 0.9 of the device.
        assert!(contended_at_model(
            &snapshot(0.0),
            &cost,
            1.0,
            DEFAULT_BORDER
        ));
        assert!(!contended_at_model(&snapshot(0.0), &cost, 1.0, 0.95));
        assert!(
            !contended_at_model(&snapshot(0.0), &cost, 2.0, DEFAULT_BORDER),
            "half of a capacity twice the model's"
        );
        assert!(
            contended_at_model(&snapshot(0.0), &cost, 0.5, DEFAULT_BORDER),
            "a learned capacity of half the model's"
        );
        for nonsense in [0.0, -1.0, f64::NAN] {
            assert!(
                contended_at_model(&snapshot(0.0), &cost, nonsense, DEFAULT_BORDER),
                "capacity {nonsense} is read as the model's"
            );
        }
        assert!(
            contended_at_model(&snapshot(0.2), &cost, 1.0, 0.95),
            "load beside ours counts"
        );
        let v = Verdicts::judge(&snapshot(0.0), true, &cost);
        assert_eq!(v.tenants.len(), 2);
        assert_eq!(v.tenants[0].entitled, Some(1000.0));
        assert_eq!(v.tenants[0].floor_met, Some(true), "1,800 of a 1,000 floor");
        assert_eq!(
            v.tenants[1],
            TenantVerdict::default(),
            "no floor, no verdict"
        );
    }

    #[test]
    fn contention_by_load_or_by_queue() {
        assert!(contended(0.95, 0.9, None, None));
        assert!(
            !contended(0.5, 0.9, Some(30.0), None),
            "no knee: the queue says nothing"
        );
        assert!(
            contended(0.5, 0.9, Some(8.0), Some(2.0)),
            "past the knee with load under the border"
        );
        assert!(!contended(0.5, 0.9, Some(1.0), Some(2.0)));
    }
}
