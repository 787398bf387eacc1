//! The cluster at scale in the simulator: hosts × tenants sharing one
//! device (up to 1,000 hosts × 100 tenants, a noisy tenant on a tenth of
//! them), every host's agent and the allocator run as `iofloor run` runs
//! them (etcd modelled). Prints, per size, the allocator's round time (mean
//! and longest), what each host writes (its report) and reads (its
//! allocation) per interval, the floors kept against each host alone and no
//! control, and the wall time of the run.
//! One run per size: the figures are the measurement (`cargo bench -p
//! iofloor-sim --bench cluster_scale`; `-- 100x100` for one size;
//! `SCALE_DEBUG=1` prints, per window, how many quiet tenants missed).

use iofloor_core::policy::PolicyKind;
use iofloor_scenario::{Control, Scenario};
use iofloor_sim::{scale_scenario, simulate};
use std::time::Instant;

/// Share of the quiet tenants' windows after warm-up below 95 % of their
/// floor (they always ask more than it).
fn floor_miss(sc: &Scenario, out: &iofloor_sim::engine::EngineOutput) -> f64 {
    let warmup = sc.warmup.as_secs_f64();
    let quiet: Vec<usize> = (0..sc.tenants.len())
        .filter(|i| !sc.tenants[*i].noisy)
        .collect();
    let (mut missed, mut windows) = (0usize, 0usize);
    for w in out.windows.iter().filter(|w| w.t >= warmup) {
        for &i in &quiet {
            windows += 1;
            missed += usize::from(w.tenants[i].got.iops < 0.95 * 80.0);
        }
    }
    if std::env::var_os("SCALE_DEBUG").is_some() {
        for w in out.windows.iter().filter(|w| w.t >= warmup) {
            let m = quiet
                .iter()
                .filter(|&&i| w.tenants[i].got.iops < 0.95 * 80.0)
                .count();
            eprint!("{:.0}:{m} ", w.t);
        }
        eprintln!();
    }
    missed as f64 / windows.max(1) as f64
}

fn main() {
    let only: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    // (hosts, tenants per host, a noisy tenant on every n-th host, seconds)
    for (hosts, per_host, noisy_every, seconds) in [
        (4, 5, 1, 60),
        (10, 100, 1, 60),
        (100, 100, 1, 40),
        (1000, 100, 10, 30),
    ] {
        let size = format!("{hosts}x{per_host}");
        if only.as_ref().is_some_and(|o| *o != size) {
            continue;
        }
        let sc = scale_scenario(hosts, per_host, noisy_every, seconds);
        let started = Instant::now();
        let out = simulate(&sc, Some(Control::Policy(PolicyKind::Floor)), &|_| {});
        let wall = started.elapsed();
        let e = out.exchange.expect("a cluster run");
        let alone = simulate(&sc, Some(Control::HostsAlone(PolicyKind::Floor)), &|_| {});
        let none = simulate(&sc, None, &|_| {});
        let work = |o: &iofloor_sim::engine::EngineOutput| o.ios_completed as f64;
        println!(
            "{size}: allocator round mean {:.2} ms, longest {:.2} ms over {} rounds; a host writes {:.1} kB \
             (report) and reads {:.1} kB (allocation) per interval; floor-miss {:.1} % (hosts alone {:.1} %, \
             none {:.1} %), I/Os against none {:.3} (hosts alone {:.3}); {} I/Os simulated in {:.1} s",
            e.round_mean.as_secs_f64() * 1e3,
            e.round_max.as_secs_f64() * 1e3,
            e.rounds,
            e.report_bytes / 1e3,
            e.allocation_bytes / 1e3,
            floor_miss(&sc, &out) * 100.0,
            floor_miss(&sc, &alone) * 100.0,
            floor_miss(&sc, &none) * 100.0,
            work(&out) / work(&none),
            work(&alone) / work(&none),
            out.ios_completed,
            wall.as_secs_f64()
        );
    }
}
