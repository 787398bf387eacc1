//! Property tests of the policies' promises.

use iofloor_core::cost::{CostModel, CostParams};
use iofloor_core::model::*;
use iofloor_core::policy::{build, FloorParams, Policy, PolicyContext, PolicyKind, PolicyParams};
use iofloor_core::units::Rate;
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;

fn model() -> CostModel {
    CostModel::new(CostParams {
        rbps: 2e9,
        rseqiops: 400e3,
        rrandiops: 250e3,
        wbps: 1e9,
        wseqiops: 150e3,
        wrandiops: 60e3,
    })
    .unwrap()
}

#[derive(Debug, Clone)]
struct TenantCase {
    read_share: f64,
    size: f64,
    /// Floor as a share of the device (converted to the unit below).
    floor_share: f64,
    floor_unit: u8,
    /// Demand as a multiple of the floor, per step.
    demand: Vec<f64>,
    vm: bool,
    latency: bool,
}

fn tenant_case(steps: usize) -> impl Strategy<Value = TenantCase> {
    (
        0.0..=1.0f64,
        prop::sample::select(vec![4096.0, 16384.0, 65536.0, 262144.0]),
        0.0..0.3f64,
        0u8..3,
        prop::collection::vec(0.0..4.0f64, steps),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(read_share, size, floor_share, floor_unit, demand, vm, latency)| TenantCase {
                read_share,
                size,
                floor_share,
                floor_unit,
                demand,
                vm,
                latency,
            },
        )
}

fn mix(c: &TenantCase) -> Usage {
    Usage {
        read: DirUsage {
            ios: c.read_share,
            bytes: c.read_share * c.size,
            seq_ios: 0.0,
        },
        write: DirUsage {
            ios: 1.0 - c.read_share,
            bytes: (1.0 - c.read_share) * c.size,
            seq_ios: 0.0,
        },
        latency_us: None,
    }
}

/// A decision at the interval's end, or an early one on a look's stretch
/// of `(avg_queue, iops)`.
fn decide(policy: &mut dyn Policy, snap: &Snapshot, early: Option<(f64, f64)>) -> Vec<Caps> {
    match early {
        Some((avg_queue, iops)) => policy.decide_early(
            snap,
            &DeviceSample {
                utilisation: 1.0,
                avg_queue,
                iops,
            },
        ),
        None => policy.decide(snap),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever the load, `floor` never sets a cap that would hold a tenant
    /// below its floor, as long as the floors fit the device together: the
    /// model's capacity, and what the policy learned of the device's, less
    /// any load beside ours it is told of (a cluster host gone quiet).
    #[test]
    fn floor_never_caps_below_entitlement(
        cases in prop::collection::vec(tenant_case(12), 1..12),
        knee in prop::option::of(1.0..64.0f64),
        queue in prop::collection::vec(0.0..100.0f64, 12),
        early in prop::collection::vec(prop::option::of((0.0..200.0f64, 0.0..5000.0f64)), 12),
        foreign in prop::collection::vec(prop::sample::select(vec![0.0, 0.0, 0.1, 0.3, 0.9]), 12),
    ) {
        let cost = model();
        let params = FloorParams { queue_knee: knee, ..FloorParams::default() };
        let budget = params.target_utilisation;
        // Scale floors so that they fit the device together.
        let total: f64 = cases.iter().map(|c| c.floor_share).sum();
        let scale = if total > budget * 0.9 { budget * 0.9 / total } else { 1.0 };
        let specs: Vec<Arc<TenantSpec>> = cases.iter().enumerate().map(|(i, c)| {
            let share = c.floor_share * scale;
            let per_unit = cost.rate_to_cost(Rate::Iops(1.0), &mix(c)).unwrap();
            let per_byte = cost.rate_to_cost(Rate::BytesPerSec(1.0), &mix(c)).unwrap();
            let floor = match c.floor_unit {
                0 => Rate::Iops(share / per_unit),
                1 => Rate::BytesPerSec(share / per_byte),
                _ => Rate::Cost(share),
            };
            let mut s = TenantSpec::new(format!("t{i}"), if c.vm { TenantClass::Vm } else { TenantClass::Container });
            if share > 1e-6 { s.floor = Some(floor); }
            Arc::new(s)
        }).collect();
        let ctx = PolicyContext { cost, capacity: 1.0 };
        let mut policy = build(PolicyKind::Floor, &PolicyParams { floor: params, ..Default::default() }, ctx);
        let mut caps = vec![Caps::NONE; cases.len()];
        for (step, &avg_queue) in queue.iter().enumerate() {
            // Each tenant gets what it asks, held to its cap (as blk-throttle would).
            let samples: Vec<TenantSample> = cases.iter().zip(&specs).zip(&caps).map(|((c, spec), cap)| {
                let wanted = c.demand[step] * c.floor_share.max(0.01);
                let unit = mix(c);
                let unit_cost = cost.cost_rate(&unit);
                let allowed = cost.cost_allowed_by(cap, &unit).unwrap_or(f64::INFINITY);
                let got = wanted.min(allowed);
                let mut u = unit.scaled(got / unit_cost);
                if c.latency { u.latency_us = Some(100.0 * (1.0 + c.demand[step])); }
                TenantSample { spec: spec.clone(), usage: Some(u), caps: *cap }
            }).collect();
            let snap = Snapshot {
                now: Duration::from_secs(step as u64),
                interval: Duration::from_secs(1),
                device: Some(DeviceSample { utilisation: 1.0, avg_queue, iops: 1000.0 }),
                tenants: &samples,
                // A cluster host gone quiet: load beside ours, any share of it.
                foreign_load: foreign[step],
            };
            // Some decisions are early ones, on a look's stretch of any
            // queue and rate.
            caps = decide(policy.as_mut(), &snap, early[step]);
            prop_assert_eq!(caps.len(), cases.len());
            // Once the learned capacity is below the floors, entitlements
            // shrink alike (checked in the next property).
            let feasible = policy.feasibility().is_some_and(|f| f.feasible());
            for ((c, spec), cap) in cases.iter().zip(&specs).zip(&caps) {
                if let (Some(floor), true) = (spec.floor, feasible) {
                    let floor_cost = cost.rate_to_cost(floor, &mix(c)).unwrap();
                    if let Some(allowed) = cost.cost_allowed_by(cap, &mix(c)) {
                        prop_assert!(allowed >= floor_cost * (1.0 - 1e-6),
                            "step {step}: {} capped at {allowed} below its floor {floor_cost}", spec.name);
                    }
                }
                for v in [cap.read_iops, cap.write_iops, cap.read_bps, cap.write_bps].into_iter().flatten() {
                    prop_assert!(v.is_finite() && v > 0.0, "cap {v} is not a positive number");
                }
            }
        }
    }

    /// Device figures that are missing, zero, absurd or from counters that
    /// went backwards (over an interval or a look's stretch) never move the
    /// learned capacity out of its bounds, and an interval without them
    /// leaves it where it was: bad reads can neither hand out more than the
    /// last estimate nor squeeze the tenants. A foreign load that is
    /// negative, absurd or not a number changes none of that.
    #[test]
    fn learned_capacity_stays_bounded_on_any_device_path(
        cases in prop::collection::vec(tenant_case(30), 1..6),
        path in prop::collection::vec(prop::option::of((0.0..1e4f64, prop::sample::select(vec![0.0, 1.0, 1e3, 1e6, f64::NAN, f64::INFINITY]))), 30),
        target in prop::option::of(50.0..5000.0f64),
        early in prop::collection::vec(prop::option::of((0.0..1e4f64, prop::sample::select(vec![0.0, 1.0, 1e3, 1e6, f64::NAN, f64::INFINITY]))), 30),
        foreign in prop::collection::vec(prop::sample::select(vec![0.0, 0.2, 5.0, -1.0, f64::NAN, f64::INFINITY]), 30),
    ) {
        let cost = model();
        let params = FloorParams {
            latency_target: target.map(|us| iofloor_core::units::quantity::DurationQ(Duration::from_secs_f64(us / 1e6))),
            ..FloorParams::default()
        };
        let max = params.capacity_max;
        let ctx = PolicyContext { cost, capacity: 1.0 };
        let mut policy = build(PolicyKind::Floor, &PolicyParams { floor: params, ..Default::default() }, ctx);
        let specs: Vec<Arc<TenantSpec>> = (0..cases.len())
            .map(|i| Arc::new(TenantSpec::new(format!("t{i}"), TenantClass::Container).with_floor(Rate::Cost(0.05))))
            .collect();
        let mut caps = vec![Caps::NONE; cases.len()];
        for (step, device) in path.iter().enumerate() {
            let before = policy.capacity_estimate().unwrap();
            let samples: Vec<TenantSample> = cases.iter().zip(&specs).zip(&caps).map(|((c, spec), cap)| {
                let unit = mix(c);
                let allowed = cost.cost_allowed_by(cap, &unit).unwrap_or(f64::INFINITY);
                let got = (c.demand[step] * 0.2).min(allowed);
                TenantSample { spec: spec.clone(), usage: Some(unit.scaled(got / cost.cost_rate(&unit))), caps: *cap }
            }).collect();
            let snap = Snapshot {
                now: Duration::from_secs(step as u64),
                interval: Duration::from_secs(1),
                device: device.map(|(avg_queue, iops)| DeviceSample { utilisation: 1.0, avg_queue, iops }),
                tenants: &samples,
                foreign_load: foreign[step],
            };
            caps = decide(policy.as_mut(), &snap, early[step]);
            let after = policy.capacity_estimate().unwrap();
            prop_assert!(after.is_finite() && (0.05 - 1e-12..=max + 1e-12).contains(&after), "estimate {after}");
            if device.is_none() {
                prop_assert_eq!(before, after);
            }
            let f = policy.feasibility().unwrap();
            prop_assert!(f.shortfall >= 0.0 && f.shortfall.is_finite());
            for cap in &caps {
                for v in [cap.read_iops, cap.write_iops, cap.read_bps, cap.write_bps].into_iter().flatten() {
                    prop_assert!(v.is_finite() && v > 0.0, "cap {v}");
                }
            }
        }
    }

    /// Any policy returns one decision per tenant, with sane numbers, for any input.
    #[test]
    fn every_policy_answers_every_tenant(
        cases in prop::collection::vec(tenant_case(3), 0..20),
        kind in prop::sample::select(PolicyKind::ALL.to_vec()),
        missing in any::<bool>(),
    ) {
        let ctx = PolicyContext { cost: model(), capacity: 1.0 };
        let mut p = build(kind, &PolicyParams::default(), ctx);
        for step in 0..3u64 {
            let samples: Vec<TenantSample> = cases.iter().enumerate().map(|(i, c)| TenantSample {
                spec: Arc::new(TenantSpec::new(format!("t{i}"), TenantClass::Container).with_floor(Rate::Iops(100.0))),
                usage: if missing && i % 2 == 0 { None } else { Some(mix(c).scaled(c.demand[step as usize] * 50_000.0)) },
                caps: Caps::NONE,
            }).collect();
            let snap = Snapshot { now: Duration::from_secs(step * 5), interval: Duration::from_secs(5), device: None, tenants: &samples, foreign_load: 0.0 };
            let caps = p.decide(&snap);
            prop_assert_eq!(caps.len(), samples.len());
            for cap in caps {
                for v in [cap.read_iops, cap.write_iops, cap.read_bps, cap.write_bps].into_iter().flatten() {
                    prop_assert!(v.is_finite() && v > 0.0);
                }
            }
        }
    }

    /// A busy device is not a small one (issue 32): on any path of latency
    /// (zero, absurd, missing, orders of magnitude apart), queue (one that
    /// never drains, or not a number), what was served and what the tenants
    /// show, and with any operator target, the learned capacity never goes
    /// below what the floors need unless a floor was held short by the
    /// device (the proof the declared scaling rule waits for), and never
    /// leaves its bounds.
    #[test]
    fn floors_are_never_priced_out_without_proof(
        path in prop::collection::vec((
            prop::option::of(prop::sample::select(vec![0.0, 1.0, 80.0, 150.0, 500.0, 5_000.0, 1e6, 1e9, f64::NAN, f64::INFINITY])),
            prop::option::of(prop::sample::select(vec![0.0, 0.3, 1.5, 4.0, 30.0, 1e4, f64::NAN])),
            prop::sample::select(vec![0.0, 0.3, 0.7, 0.97, 1.0, 3.0, 40.0, -1.0, f64::NAN]),
            prop::sample::select(vec![0.0, 0.01, 0.1, 0.5, f64::NAN]),
            prop::collection::vec(any::<bool>(), 4),
        ), 1..120),
        need in 0.05..0.97f64,
        target in prop::option::of(50.0..5000.0f64),
        model_off in prop::sample::select(vec![0.1, 1.0, 10.0]),
    ) {
        use iofloor_core::capacity::{CapacityLoop, CapacitySettings, Observation};
        let settings = CapacitySettings {
            latency_target_us: target,
            min_factor: 0.05,
            max_factor: 4.0,
            cap_margin: 1.05,
        };
        let mut c = CapacityLoop::new(settings, model_off);
        let floor = need * model_off;
        for (latency_us, avg_queue, served, shortfall, flags) in path {
            let estimate = c.update(&Observation {
                latency_us,
                avg_queue,
                served: served * model_off,
                capped: flags[0],
                capped_shortfall: shortfall * model_off,
                wants_more: flags[1],
                floor_share: None,
                floors_need: floor,
                handed_out: 0.97,
                interval: Some(Duration::from_secs(1)),
                departed: flags[2],
                early: flags[3],
            });
            prop_assert!(estimate.is_finite());
            prop_assert!(estimate >= floor * (1.0 - 1e-9), "estimate {estimate} below the floors' need {floor}");
            prop_assert!(estimate <= 4.0 * model_off * (1.0 + 1e-9), "estimate {estimate}");
        }
    }
}
