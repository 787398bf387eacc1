//! Synthetic snapshots of many tenants, for benchmarks of decision time (the
//! seed's controller needed ~2 s for 20 VMs; iofloor's goal is 10,000 tenants
//! in 10 ms). Deterministic, no randomness source needed.

use crate::model::*;
use crate::units::Rate;
use std::sync::Arc;

/// `n` tenants on a contended device: every tenth is noisy (well above its
/// floor), the rest are below their floors. Usage in cost units sums to ~1.2.
pub fn contended_tenants(n: usize) -> Vec<TenantSample> {
    let share = 1.0 / n as f64;
    (0..n)
        .map(|i| {
            let noisy = i % 10 == 0;
            let size = [4096.0, 16384.0, 65536.0][i % 3];
            // A 4 KiB random write on a 100k-IOPS device costs 10 µs.
            let ios = if noisy {
                8.0 * share * 100_000.0
            } else {
                0.5 * share * 100_000.0
            };
            let usage = Usage {
                read: DirUsage {
                    ios: ios * 0.3,
                    bytes: ios * 0.3 * size,
                    seq_ios: 0.0,
                },
                write: DirUsage {
                    ios: ios * 0.7,
                    bytes: ios * 0.7 * size,
                    seq_ios: 0.0,
                },
                latency_us: (i % 2 == 0).then_some(200.0),
            };
            let mut spec = TenantSpec::new(
                format!("tenant-{i:05}"),
                if i % 2 == 0 {
                    TenantClass::Vm
                } else {
                    TenantClass::Container
                },
            );
            spec.floor = Some(Rate::Cost(0.8 * share));
            TenantSample {
                spec: Arc::new(spec),
                usage: Some(usage),
                caps: Caps::NONE,
            }
        })
        .collect()
}

/// [`contended_tenants`] in `groups` groups (customers), each with a floor
/// of its members' floors and half as much again, and every tenth group
/// under one of ten parents with a ceiling: two levels, floors split among
/// members, ceilings to hold.
pub fn grouped_tenants(n: usize, groups: usize) -> Vec<TenantSample> {
    let share = 1.0 / n as f64;
    let per_group = n.div_ceil(groups.max(1));
    let parents: Vec<Arc<GroupSpec>> = (0..10)
        .map(|p| {
            let mut g = GroupSpec::new(format!("parent-{p}"));
            g.ceiling = Some(Rate::Cost(0.3));
            Arc::new(g)
        })
        .collect();
    let specs: Vec<Arc<GroupSpec>> = (0..groups.max(1))
        .map(|k| {
            let mut g = GroupSpec::new(format!("group-{k:04}"));
            g.floor = Some(Rate::Cost(1.2 * 0.8 * share * per_group as f64));
            g.weight = 100.0 + (k % 7) as f64 * 50.0;
            g.parent = (k % 10 == 0).then(|| parents[(k / 10) % 10].clone());
            Arc::new(g)
        })
        .collect();
    let mut tenants = contended_tenants(n);
    for (i, t) in tenants.iter_mut().enumerate() {
        let mut spec = (*t.spec).clone();
        spec.group = Some(specs[i / per_group].clone());
        t.spec = Arc::new(spec);
    }
    tenants
}

/// A device that `iops` random or sequential I/Os per second fill in either
/// direction, whatever their size (bandwidth never binds): the simplest model
/// for tests whose figures are worked out by hand.
pub fn iops_only_model(iops: f64) -> crate::cost::CostModel {
    crate::cost::CostModel::new(crate::cost::CostParams {
        rbps: 1e12,
        rseqiops: iops,
        rrandiops: iops,
        wbps: 1e12,
        wseqiops: iops,
        wrandiops: iops,
    })
    .expect("positive rates make a valid model")
}

/// `iops` random 4 KiB reads per second.
pub fn random_reads_4k(iops: f64) -> Usage {
    Usage {
        read: DirUsage {
            ios: iops,
            bytes: iops * 4096.0,
            seq_ios: 0.0,
        },
        ..Default::default()
    }
}
