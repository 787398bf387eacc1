//! Decision time of each policy for many tenants (target: 10,000 tenants in
//! ≤ 10 ms), and of `floor` over tenants in groups (10,000 in 1,000 groups).

// The allocator the service ships with (crates/iofloor): a decision's
// vectors are freed and made again each interval, and glibc's malloc gave
// them back to the kernel and took them again, page faults a third of the
// time at 10,000 tenants.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use iofloor_core::cost::{CostModel, CostParams};
use iofloor_core::model::{DeviceSample, Snapshot};
use iofloor_core::policy::{build, PolicyContext, PolicyKind, PolicyParams};
use iofloor_core::synthetic::{contended_tenants, grouped_tenants};
use std::hint::black_box;
use std::time::Duration;

fn ctx() -> PolicyContext {
    let cost = CostModel::new(CostParams {
        rbps: 2e9,
        rseqiops: 300e3,
        rrandiops: 200e3,
        wbps: 1e9,
        wseqiops: 150e3,
        wrandiops: 100e3,
    })
    .unwrap();
    PolicyContext {
        cost,
        capacity: 1.0,
    }
}

/// The snapshot of one interval: a device overloaded, every tenant sampled.
fn snapshot(step: u64, tenants: &[iofloor_core::TenantSample]) -> Snapshot<'_> {
    Snapshot {
        now: Duration::from_secs(step),
        interval: Duration::from_secs(1),
        device: Some(DeviceSample {
            utilisation: 1.0,
            avg_queue: 40.0,
            iops: 1000.0,
        }),
        tenants,
        foreign_load: 0.0,
    }
}

fn decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    group.sample_size(20);
    for n in [20usize, 1_000, 10_000] {
        let tenants = contended_tenants(n);
        for kind in PolicyKind::ALL {
            let mut policy = build(kind, &PolicyParams::default(), ctx());
            let mut step = 0u64;
            group.bench_with_input(
                BenchmarkId::new(kind.as_str(), n),
                &tenants,
                |b, tenants| {
                    b.iter(|| {
                        step += 1;
                        black_box(policy.decide(&snapshot(step, tenants)))
                    })
                },
            );
        }
    }
    // Tenants in groups (issue: 10,000 tenants in 1,000 groups in ≤ 10 ms).
    for (n, groups) in [(1_000usize, 100usize), (10_000, 1_000)] {
        let tenants = grouped_tenants(n, groups);
        let mut policy = build(PolicyKind::Floor, &PolicyParams::default(), ctx());
        let mut step = 0u64;
        group.bench_with_input(
            BenchmarkId::new("floor-grouped", format!("{n}x{groups}")),
            &tenants,
            |b, tenants| {
                b.iter(|| {
                    step += 1;
                    black_box(policy.decide(&snapshot(step, tenants)))
                })
            },
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // No plots: plotters here is built without system fonts.
    config = Criterion::default().without_plots();
    targets = decide
}
criterion_main!(benches);
