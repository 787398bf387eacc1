//! `bench`, `calibrate` and `lag`: real fio on a real block device.

use crate::common::{
    absolute, bad, bench_error, calibrate_error, check_alone_secs, check_time_scale, load_model,
    load_scenario, parse_policies, progress_bar, stop_flag,
};
use anyhow::Context;
use clap::Args;
use iofloor_report::render;
use iofloor_scenario::KernelRun;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct BenchArgs {
    /// A scenario file or the name of a shipped one.
    pub scenario: String,
    /// The block device the tenants share (e.g. the one `iofloor rig up` printed).
    #[arg(long, required_unless_present = "cluster", conflicts_with = "cluster")]
    pub device: Option<PathBuf>,
    /// Run a cluster scenario (tenants name their `host`) on the test bed
    /// `iofloor cluster up` made: each host's tenants on its own device, an
    /// agent (`iofloor run`) on every host, as a cluster and each alone.
    #[arg(long)]
    pub cluster: bool,
    /// Where `iofloor cluster up` recorded the bed (with --cluster).
    #[arg(long, default_value = iofloor_testbed::cluster::DEFAULT_STATE_ROOT)]
    pub bed_state_dir: PathBuf,
    /// Policy to run; repeat for several (none is always run as the
    /// reference): none, static, top-throttle, floor, and on cgroup v2 the
    /// kernel's own controllers, each tenant weighted by its floor: iocost
    /// (io.cost with the policies' model, its rate pinned to it), iocost-qos
    /// (the same with a latency target), bfq (BFQ weights); POLICY+KERNEL
    /// (`floor+bfq`) runs the policy's amounts under the kernel's order.
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// Scale every time in the scenario (0.25 runs the 10-minute noisy-4 in 2.5).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Results directory (raw runs, fio logs, reports). Default: results/bench-SCENARIO.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Cost model for the policies (a file written by `iofloor calibrate`).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Root of the cgroup hierarchy with the I/O controller. Default: the
    /// v1 blkio hierarchy at /sys/fs/cgroup/blkio if there is one, else
    /// cgroup v2's at /sys/fs/cgroup.
    #[arg(long)]
    pub cgroup_root: Option<PathBuf>,
    /// Length of each tenant's alone run (p99 baseline; the whole scenario gives per-window demand), seconds.
    #[arg(long, default_value_t = 10.0)]
    pub alone_secs: f64,
    /// How VM tenants reach the device: `cgroup` (fio in a cgroup, like a
    /// container) or `qemu` (through qemu-storage-daemon's block layer,
    /// throttled at the VMM over QMP).
    #[arg(long, default_value = "cgroup", value_parser = ["cgroup", "qemu"])]
    pub vm_path: String,
    /// Where `iofloor rig up` recorded the rig behind `--device`: device
    /// changes and other-host load of a scenario are played on it.
    #[arg(long, default_value = iofloor_testbed::rig::DEFAULT_STATE_ROOT)]
    pub rig_state_dir: PathBuf,
}

#[derive(Args)]
pub struct CalibrateArgs {
    device: PathBuf,
    /// Write the model here (TOML, read by `bench --model`); default: print it.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Seconds per fio measurement, after 1 s of ramp-up (about 20 measurements).
    #[arg(long, default_value_t = 3.0)]
    secs: f64,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct LagArgs {
    #[arg(long)]
    device: PathBuf,
    /// The cap written (IOPS); well below what the device does uncapped.
    #[arg(long, default_value_t = 200.0)]
    cap: f64,
    #[arg(long, default_value_t = 5)]
    trials: u32,
    #[arg(long, default_value = "/sys/fs/cgroup/blkio")]
    cgroup_root: PathBuf,
    #[arg(long)]
    json: bool,
}

/// What `bench` runs, from its arguments: the scenario and the runner's options.
fn bench_plan(
    args: &BenchArgs,
) -> anyhow::Result<(iofloor_scenario::Scenario, iofloor_bench::BenchOptions)> {
    let mut sc = load_scenario(&args.scenario)?;
    let (kernel, policies) = parse_bench_policies(&args.policies)?;
    check_time_scale(args.time_scale)?;
    check_alone_secs(args.alone_secs)?;
    if args.time_scale != 1.0 {
        sc = sc.time_scaled(args.time_scale);
    }
    let model = match args.model.as_deref().map(load_model).transpose()? {
        Some((m, knee)) => {
            sc.policy.floor.queue_knee = knee.or(sc.policy.floor.queue_knee);
            Some(m)
        }
        None => None,
    };
    let out = match &args.out {
        Some(out) => absolute("--out", out)?,
        None => absolute(
            "--out",
            &PathBuf::from(format!("results/bench-{}", sc.name)),
        )?,
    };
    let opts = iofloor_bench::BenchOptions {
        // With --cluster each host has its own device (the bed's).
        device: match &args.device {
            Some(device) => absolute("--device", device)?,
            None => PathBuf::new(),
        },
        policies,
        kernel,
        cgroup_root: match &args.cgroup_root {
            Some(root) => absolute("--cgroup-root", root)?,
            None => default_cgroup_root(),
        },
        work_dir: out.join("fio"),
        model,
        alone: Duration::from_secs_f64(args.alone_secs),
        settle: Duration::from_secs(2),
        vm_paths: args.vm_path == "qemu",
        rig_state_dir: absolute("--rig-state-dir", &args.rig_state_dir)?,
    };
    Ok((sc, opts))
}

/// The kernel's controllers and the policies among `--policy` values; only
/// kernel controllers named runs no policy but the `none` reference.
fn parse_bench_policies(
    names: &[String],
) -> anyhow::Result<(Vec<KernelRun>, Vec<iofloor_core::policy::PolicyKind>)> {
    let mut kernel: Vec<KernelRun> = Vec::new();
    let mut policies: Vec<String> = Vec::new();
    for name in names {
        match KernelRun::parse(name) {
            Some(peer) if !kernel.contains(&peer) => kernel.push(peer),
            Some(_) => {}
            None => policies.push(name.clone()),
        }
    }
    if policies.is_empty() && !kernel.is_empty() {
        return Ok((kernel, Vec::new()));
    }
    Ok((kernel, parse_policies(&policies)?))
}

/// cgroup v1's blkio hierarchy where it is mounted (blk-throttle), else v2's.
fn default_cgroup_root() -> PathBuf {
    let v1 = PathBuf::from("/sys/fs/cgroup/blkio");
    if v1.join("blkio.throttle.io_serviced").exists() {
        v1
    } else {
        PathBuf::from("/sys/fs/cgroup")
    }
}

pub fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let (sc, opts) = bench_plan(&args)?;
    let out = opts
        .work_dir
        .parent()
        .expect("work_dir is out/fio")
        .to_path_buf();
    if args.cluster {
        return bench_cluster(&args, &sc, &opts, &out);
    }
    let dev = iofloor_bench::preflight(&sc, &opts).map_err(bench_error)?;
    let has_vms = sc
        .tenants
        .iter()
        .any(|t| t.spec.class == iofloor_core::TenantClass::Vm);
    if !opts.vm_paths && has_vms {
        // Said rather than pretended.
        eprintln!("note: VM tenants run as fio in cgroups (--vm-path qemu puts them behind QEMU's block layer)");
    }
    let stop = stop_flag()?;
    let bar = progress_bar();
    eprintln!(
        "running {} on {} (about {:.0} s)",
        sc.name,
        opts.device.display(),
        iofloor_bench::planned_time(&sc, &opts).as_secs_f64()
    );
    let runs = iofloor_bench::run(&sc, &opts, dev, &stop, &|f, what| {
        bar.set_message(what.to_string());
        bar.set_position((f * 1000.0) as u64)
    });
    bar.finish_and_clear();
    let runs = runs.map_err(bench_error)?;
    report(&args, &sc, &runs, &out, &opts.device.display().to_string())
}

/// `bench --cluster`: the scenario on the cluster test bed.
fn bench_cluster(
    args: &BenchArgs,
    sc: &iofloor_scenario::Scenario,
    opts: &iofloor_bench::BenchOptions,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    if let Some(run) = opts.kernel.first() {
        return Err(bad(format!(
            "--policy {}: the cluster bed's hosts run cgroup v1; the kernel's controllers are measured on one cgroup v2 host (`iofloor guest up`)",
            run.label()
        )));
    }
    let stop = stop_flag()?;
    let agent = std::env::current_exe().context("the path of this iofloor binary")?;
    let bed_state_dir = absolute("--bed-state-dir", &args.bed_state_dir)?;
    let platform =
        iofloor_bench::cluster::ClusterPlatform::new(sc, opts, &bed_state_dir, &agent, &stop)
            .map_err(bench_error)?;
    let hosts: Vec<String> = platform
        .devices()
        .map(|(host, device)| format!("{host} on {}", device.display()))
        .collect();
    let place = format!("the cluster bed ({})", hosts.join(", "));
    let bar = progress_bar();
    eprintln!(
        "running {} on {place} (about {:.0} s)",
        sc.name,
        iofloor_bench::planned_time(sc, opts).as_secs_f64()
    );
    let runs = iofloor_bench::run_cluster(sc, &platform, &|f, what| {
        bar.set_message(what.to_string());
        bar.set_position((f * 1000.0) as u64)
    });
    bar.finish_and_clear();
    let runs = runs.map_err(bench_error)?;
    report(args, sc, &runs, out, &place)
}

/// Writes the results directory and prints the tables (or the JSON summary).
fn report(
    args: &BenchArgs,
    sc: &iofloor_scenario::Scenario,
    runs: &[iofloor_report::record::RunRecord],
    out: &std::path::Path,
    place: &str,
) -> anyhow::Result<()> {
    let compared = iofloor_report::compare(runs);
    let written =
        render::write_dir(out, runs).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("report: {}", written.html.display());
    if args.json {
        println!("{}", render::summary_json(&sc.name, &compared));
    } else {
        println!("{} on {place}\n", sc.name);
        println!("{}", render::comparison_table(&compared));
        println!("{}", render::tenant_table(&compared));
        let groups = render::group_table(&compared);
        if !groups.is_empty() {
            println!("{groups}");
        }
    }
    Ok(())
}

pub fn calibrate(args: CalibrateArgs) -> anyhow::Result<()> {
    iofloor_host::DevId::of_block_device(&args.device).map_err(|e| bad(e.to_string()))?;
    iofloor_host::fio::check_version().map_err(|e| bad(e.to_string()))?;
    let secs = args.secs;
    if !(secs.is_finite() && (1.0..=600.0).contains(&secs)) {
        return Err(bad(format!("--secs must be 1..600, got {secs}")));
    }
    let work = tempfile::tempdir().context("a scratch directory")?;
    eprintln!(
        "calibrating {} (writes to it; about {:.0} s)",
        args.device.display(),
        iofloor_host::calibrate::planned(secs).as_secs_f64()
    );
    let cal = iofloor_host::calibrate::calibrate(&args.device, work.path(), secs, &|what| {
        eprintln!("  {what}")
    })
    .map_err(calibrate_error)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&cal)?);
    } else {
        for h in &cal.held_out {
            eprintln!(
                "  held out {:<20} measured {:>9.0} IOPS, model {:>9.0} ({:+.1}%)",
                h.name,
                h.measured_iops,
                h.predicted_iops,
                h.error * 100.0
            );
        }
    }
    match args.out {
        Some(path) => {
            std::fs::write(&path, cal.to_toml())
                .with_context(|| format!("writing {}", path.display()))?;
            eprintln!("model written to {}", path.display());
        }
        None if !args.json => print!("{}", cal.to_toml()),
        None => {}
    }
    Ok(())
}

pub fn lag(args: LagArgs) -> anyhow::Result<()> {
    let LagArgs {
        device,
        cap,
        trials,
        cgroup_root,
        json,
    } = args;
    if !(cap.is_finite() && cap >= 1.0 && (1..=100).contains(&trials)) {
        return Err(bad("--cap must be at least 1 and --trials 1..100"));
    }
    iofloor_host::fio::check_version().map_err(|e| bad(e.to_string()))?;
    let work = tempfile::tempdir().context("a scratch directory")?;
    let r = iofloor_bench::lag::enforcement_lag(&device, &cgroup_root, cap, trials, work.path())
        .map_err(bench_error)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    for (i, t) in r.trials.iter().enumerate() {
        let lag = t
            .lag_s
            .map(|l| format!("{:.0} ms", l * 1e3))
            .unwrap_or_else(|| "over 1 s".into());
        println!(
            "trial {i}: {:.0} IOPS before, {:.0} after a cap of {cap:.0}: lag {lag}",
            t.iops_before, t.iops_after
        );
    }
    match r.median_lag_s {
        Some(l) => println!("median enforcement lag: {:.0} ms", l * 1e3),
        None => println!("median enforcement lag: over 1 s in some trial"),
    }
    Ok(())
}
