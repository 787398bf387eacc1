//! `sim`, `report`, `admit` and `scenarios`: everything that needs no device.

use crate::common::{
    bad, check_time_scale, load_model, load_scenario, parse_policies, progress_bar,
};
use crate::scenarios;
use anyhow::Context;
use clap::Args;
use iofloor_report::render;
use iofloor_scenario::Scenario;
use std::path::PathBuf;

#[derive(Args)]
pub struct SimArgs {
    /// A scenario file, or the name of a shipped one (`iofloor scenarios` lists them).
    scenario: String,
    /// Policy to run (none, static, top-throttle, floor); repeat for several. Default: all.
    #[arg(long = "policy")]
    policies: Vec<String>,
    /// Write raw runs, summary.json, report.md, report.html and charts here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Scale every time in the scenario (0.25 runs it in a quarter of the time).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Worker threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Run even if the floors together exceed the device (admission control fails).
    #[arg(long)]
    allow_overcommit: bool,
    /// Simulate a measured device instead of the scenario's: a model file
    /// from `iofloor calibrate` (parallelism from its queue knee). The
    /// policies keep the scenario's model, as `iofloor bench` does.
    #[arg(long)]
    device_model: Option<PathBuf>,
    /// Seed of the simulator's random numbers (jitter, arrivals) instead of
    /// the scenario's `seed`: runs under several seeds show how much of a
    /// figure is chance.
    #[arg(long)]
    seed: Option<u64>,
}

#[derive(Args)]
pub struct ReportArgs {
    dir: PathBuf,
    /// Print the summary JSON instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct AdmitArgs {
    scenario: String,
    #[arg(long)]
    json: bool,
}

/// The scenario as `sim` runs it: on a calibrated device if asked, with
/// another seed if asked, time-scaled.
fn simulated_scenario(args: &SimArgs) -> anyhow::Result<Scenario> {
    let mut sc = load_scenario(&args.scenario)?;
    if let Some(seed) = args.seed {
        sc.seed = seed;
    }
    if let Some(path) = &args.device_model {
        let (model, knee) = load_model(path)?;
        sc.device.cost = model;
        // The knee is where latency reaches 1.5x unloaded: about 1.5x the parallelism.
        sc.device.parallelism = knee.map(|k| (k / 1.5).round().max(1.0) as u32).unwrap_or(1);
        sc.device.jitter = 0.0;
        sc.device.write_cliff = None;
    }
    check_time_scale(args.time_scale)?;
    if args.time_scale != 1.0 {
        sc = sc.time_scaled(args.time_scale);
    }
    Ok(sc)
}

pub fn sim(args: SimArgs) -> anyhow::Result<()> {
    let sc = simulated_scenario(&args)?;
    let policies = parse_policies(&args.policies)?;
    let verdict = sc.admission();
    if !verdict.admitted && !args.allow_overcommit {
        return Err(bad(format!(
            "{}: admission control: {} (use --allow-overcommit to simulate anyway)",
            sc.name,
            verdict.summary()
        )));
    }
    let threads = args
        .threads
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
        .clamp(1, 64);
    let bar = progress_bar();
    let simulator = iofloor_sim::Simulator::new(threads);
    let Ok(runs) = iofloor_scenario::run_policies(&simulator, &sc, &policies, &|f, _| {
        bar.set_position((f * 1000.0) as u64)
    });
    bar.finish_and_clear();
    // Only the asked-for policies are reported, plus `none` (the reference).
    let compared = iofloor_report::compare(&runs);
    if let Some(dir) = &args.out {
        let written =
            render::write_dir(dir, &runs).with_context(|| format!("writing {}", dir.display()))?;
        eprintln!("report: {}", written.html.display());
    }
    if args.json {
        println!("{}", render::summary_json(&sc.name, &compared));
    } else {
        println!("{} — {}\n", sc.name, sc.description);
        println!("{}", render::comparison_table(&compared));
        println!("{}", render::tenant_table(&compared));
        let groups = render::group_table(&compared);
        if !groups.is_empty() {
            println!("{groups}");
        }
    }
    Ok(())
}

pub fn report(args: ReportArgs) -> anyhow::Result<()> {
    let (runs, written) = render::rebuild_dir(&args.dir).map_err(|e| bad(e.to_string()))?;
    let compared = iofloor_report::compare(&runs);
    if args.json {
        println!("{}", render::summary_json(&runs[0].scenario, &compared));
    } else {
        println!("{}", render::comparison_table(&compared));
        eprintln!("report: {}", written.html.display());
    }
    Ok(())
}

pub fn admit(args: AdmitArgs) -> anyhow::Result<()> {
    let sc = load_scenario(&args.scenario)?;
    let v = sc.admission();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{}: {}", sc.name, v.summary());
        for t in &v.tenants {
            let cost = t
                .floor_cost
                .map(|c| format!("{:.1}%", c * 100.0))
                .unwrap_or_else(|| "unpriced".into());
            let verdict = if t.guaranteed {
                "guaranteed"
            } else {
                "NOT guaranteed"
            };
            println!("  {:<16} {:>8}  {verdict}", t.name, cost);
        }
    }
    if v.admitted {
        Ok(())
    } else {
        Err(bad(format!("{}: {}", sc.name, v.summary())))
    }
}

pub fn list_scenarios() -> anyhow::Result<()> {
    for name in scenarios::names() {
        let sc = load_scenario(name)?;
        println!("{name:<10} {}", sc.description);
    }
    Ok(())
}
