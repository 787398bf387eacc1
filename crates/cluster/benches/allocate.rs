//! The allocator at cluster scale: one round over up to 1,000 hosts × 100 tenants
//! (decision time), and the bytes each host writes and reads through etcd per
//! interval (its report and its allocation), printed once.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use iofloor_cluster::{Allocator, HostReport, TenantReport, SCHEMA};
use iofloor_core::cost::{CostModel, CostParams};
use iofloor_core::synthetic::contended_tenants;
use iofloor_core::{DeviceSample, PolicyContext, PolicyKind, PolicyParams};
use std::hint::black_box;
use std::time::Duration;

fn ctx() -> PolicyContext {
    PolicyContext {
        cost: CostModel::new(CostParams {
            rbps: 2e9,
            rseqiops: 300e3,
            rrandiops: 200e3,
            wbps: 1e9,
            wseqiops: 150e3,
            wrandiops: 100e3,
        })
        .unwrap(),
        capacity: 1.0,
    }
}

/// `hosts` reports of `per_host` tenants each, contended as in core's bench.
fn reports(hosts: usize, per_host: usize) -> Vec<HostReport> {
    let tenants = contended_tenants(hosts * per_host);
    tenants
        .chunks(per_host)
        .enumerate()
        .map(|(h, chunk)| HostReport {
            schema: SCHEMA,
            host: format!("host-{h:03}"),
            device: "array".into(),
            seq: 1,
            interval_s: 1.0,
            local_device: Some(DeviceSample {
                utilisation: 1.0,
                avg_queue: 2.0,
                iops: 10_000.0,
            }),
            tenants: chunk.iter().map(TenantReport::from).collect(),
        })
        .collect()
}

fn allocate(c: &mut Criterion) {
    let mut group = c.benchmark_group("allocate");
    group.sample_size(20);
    for (hosts, per_host) in [(4, 5), (10, 100), (100, 100), (1000, 100)] {
        let reports = reports(hosts, per_host);
        let mut allocator = Allocator::new(
            "array",
            PolicyKind::Floor,
            &PolicyParams::default(),
            ctx(),
            None,
            1,
        );
        let round = allocator.allocate(Duration::from_secs(1), &reports, &[]);
        let report_bytes = reports[0].encode().len();
        let allocation_bytes = round.allocations[0].encode().len();
        println!(
            "{hosts} hosts x {per_host} tenants: a host writes {report_bytes} B (report) and reads \
             {allocation_bytes} B (allocation) per interval; the allocator reads {} kB and writes {} kB",
            report_bytes * hosts / 1000,
            allocation_bytes * hosts / 1000
        );
        let mut step = 1u64;
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{hosts}x{per_host}")),
            &reports,
            |b, reports| {
                b.iter(|| {
                    step += 1;
                    black_box(allocator.allocate(
                        Duration::from_secs(step),
                        black_box(reports),
                        &[],
                    ))
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, allocate);
criterion_main!(benches);
