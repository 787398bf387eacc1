//! Simulator speed: simulated I/Os per wall-clock second on one core (target ≥ 10 M).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use iofloor_core::policy::PolicyKind;
use iofloor_scenario::{Control, Scenario};
use iofloor_sim::simulate;
use std::path::PathBuf;

fn scenario(name: &str) -> Scenario {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios")
        .join(format!("{name}.toml"));
    Scenario::load(&p).unwrap()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("simulate");
    group.sample_size(10);
    // The hybrid scenario at a tenth of its length: ~2.2 M I/Os of 4 KiB reads.
    let sc = scenario("hybrid").time_scaled(0.1);
    let ios = simulate(&sc, Some(Control::Policy(PolicyKind::Floor)), &|_| {}).ios_completed;
    group.throughput(Throughput::Elements(ios));
    group.bench_function("hybrid-8s-floor", |b| {
        b.iter(|| simulate(&sc, Some(Control::Policy(PolicyKind::Floor)), &|_| {}))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    // No plots: plotters here is built without system fonts.
    config = Criterion::default().without_plots();
    targets = bench
}
criterion_main!(benches);
