//! The cluster at scale as a scenario: what `cargo bench -p iofloor-sim
//! --bench cluster_scale` runs, and the suite at a smaller size.

use iofloor_scenario::Scenario;
use std::fmt::Write;

/// `hosts` hosts of `per_host` tenants on one device: on every
/// `noisy_every`-th host one noisy tenant (8 processes × QD 32 ×
/// `noisy_every` of random 4 KiB reads, no floor) from 5 s, every other
/// tenant asking 100 IOPS at QD 1 with a floor of 80. The device serves the quiet tenants' demand at
/// 60 % of its capacity, with 2 ms service times: the noisy tenants' queues
/// alone would take the quiet ones' floors.
pub fn scale_scenario(hosts: usize, per_host: usize, noisy_every: usize, seconds: u32) -> Scenario {
    let noisy_every = noisy_every.max(1);
    let noisy_hosts = hosts.div_ceil(noisy_every);
    // Fewer noisy tenants press as hard together: the same I/Os in flight.
    let noisy_depth = 32 * noisy_every;
    let quiet_demand = (hosts * per_host - noisy_hosts) as f64 * 100.0;
    let iops = (quiet_demand / 0.6).round();
    let parallelism = ((iops * 0.002).round() as u32).clamp(4, 65536);
    let mut s = format!(
        "name = \"scale-{hosts}x{per_host}\"\nduration = \"{seconds}s\"\nwarmup = \"6s\"\n\
         [device]\nparallelism = {parallelism}\nrbps = \"64GiB/s\"\nrseqiops = {}\nrrandiops = {iops}\n\
         wbps = \"32GiB/s\"\nwseqiops = {iops}\nwrandiops = {iops}\njitter = 0.1\n[cluster]\n",
        iops * 2.0
    );
    for h in 0..hosts {
        for t in 0..per_host {
            let name = format!("h{h:03}-t{t:03}");
            if t == 0 && h % noisy_every == 0 {
                let _ = write!(
                    s,
                    "[[tenant]]\nname = \"{name}\"\nhost = \"h{h:03}\"\nnoisy = true\n\
                     [[tenant.job]]\nrw = \"randread\"\nbs = \"4k\"\niodepth = {noisy_depth}\nnumjobs = 8\nstart = \"5s\"\n"
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
