//! The cluster at scale in the simulator: hosts × tenants sharing one
//! device, every host's agent and the allocator run as `iofloor run` runs
//! them (etcd modelled). Prints, per size, the allocator's round time (mean
//! and longest), what each host writes (its report) and reads (its
//! allocation) per interval, the floors kept and the wall time of the run.
//! One run per size: the figures are the measurement (`cargo bench -p
//! iofloor-sim --bench cluster_scale`; `-- 100x100` for one size).

use iofloor_core::policy::PolicyKind;
use iofloor_report::compare;
use iofloor_scenario::{run_policies, Control, Scenario};
use iofloor_sim::{simulate, Simulator};
use std::fmt::Write;
use std::time::Instant;

/// `hosts` hosts of `per_host` tenants on a device of 64 queues and 1.6 M
/// random 4 KiB reads/s: on each host one noisy tenant (8 × QD4, no floor)
/// from 5 s, the others asking 100 IOPS at QD1 with a floor of 80.
fn scenario(hosts: usize, per_host: usize, seconds: u32) -> Scenario {
    let mut s = format!(
        "name = \"scale-{hosts}x{per_host}\"\nduration = \"{seconds}s\"\nwarmup = \"3s\"\n\
         [device]\nparallelism = 64\nrbps = \"8GiB/s\"\nrseqiops = 3200000\nrrandiops = 1600000\n\
         wbps = \"4GiB/s\"\nwseqiops = 1600000\nwrandiops = 800000\n[cluster]\n"
    );
    for h in 0..hosts {
        for t in 0..per_host {
            let name = format!("h{h:03}-t{t:03}");
            if t == 0 {
                let _ = write!(
                    s,
                    "[[tenant]]\nname = \"{name}\"\nhost = \"h{h:03}\"\nnoisy = true\n\
                     [[tenant.job]]\nrw = \"randread\"\nbs = \"4k\"\niodepth = 4\nnumjobs = 8\nstart = \"5s\"\n"
                );
            } else {
                let _ = write!(
                    s,
                    "[[tenant]]\nname = \"{name}\"\nhost = \"h{h:03}\"\nfloor = \"80iops\"\n\
                     [[tenant.job]]\nrw = \"randread\"\nbs = \"4k\"\nrate = \"100iops\"\n"
                );
            }
        }
    }
    Scenario::parse(&s, "scale").expect("the generated scenario is valid")
}

fn main() {
    let only: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    for (hosts, per_host, seconds) in [(4, 5, 30), (10, 100, 20), (100, 100, 10)] {
        let size = format!("{hosts}x{per_host}");
        if only.as_ref().is_some_and(|o| *o != size) {
            continue;
        }
        let sc = scenario(hosts, per_host, seconds);
        let started = Instant::now();
        let out = simulate(&sc, Some(Control::Policy(PolicyKind::Floor)), &|_| {});
        let wall = started.elapsed();
        let e = out.exchange.expect("a cluster run");
        // Floors kept: the harness's measure against `none`, for the small
        // sizes (the alone baselines of 10,000 tenants take too long).
        let kept = if hosts * per_host <= 1000 {
            let Ok(runs) = run_policies(&Simulator::new(2), &sc, &[PolicyKind::Floor], &|_, _| {});
            let m: std::collections::HashMap<String, _> = compare(&runs).into_iter().collect();
            format!(
                "floor-miss {:.1} % (hosts alone {:.1} %, none {:.1} %)",
                m["floor"].floor_miss_rate * 100.0,
                m["floor-hosts-alone"].floor_miss_rate * 100.0,
                m["none"].floor_miss_rate * 100.0
            )
        } else {
            "floor-miss not judged at this size".into()
        };
        println!(
            "{size}: allocator round mean {:.2} ms, longest {:.2} ms over {} rounds; a host writes {:.1} kB \
             (report) and reads {:.1} kB (allocation) per interval; {} I/Os simulated in {:.1} s; {kept}",
            e.round_mean.as_secs_f64() * 1e3,
            e.round_max.as_secs_f64() * 1e3,
            e.rounds,
            e.report_bytes / 1e3,
            e.allocation_bytes / 1e3,
            out.ios_completed,
            wall.as_secs_f64()
        );
    }
}
