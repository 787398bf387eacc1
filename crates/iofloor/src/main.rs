//! The `iofloor` command: simulate scenarios, benchmark real devices, run the
//! controller as a service (`run`) and watch it (`top`).

use anyhow::Context;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use iofloor_core::admission;
use iofloor_core::policy::PolicyKind;
use iofloor_report::render;
use iofloor_scenario::Scenario;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod scenarios;
mod top;

#[derive(Parser)]
#[command(
    name = "iofloor",
    version,
    about = "I/O floors for tenants sharing flash"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate a scenario under one or more policies and compare them.
    Sim {
        /// A scenario file, or the name of a shipped one (noisy-4, noisy-20, size-mix, hybrid, hybrid-real).
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
    },
    /// Rebuild summary, reports and charts from a results directory.
    Report {
        dir: PathBuf,
        /// Print the summary JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Admission control: can every floor of a scenario be guaranteed?
    Admit {
        scenario: String,
        #[arg(long)]
        json: bool,
    },
    /// List the shipped scenarios.
    Scenarios,
    /// Run a scenario with real fio tenants in cgroups on a real block device.
    Bench {
        /// A scenario file or the name of a shipped one.
        scenario: String,
        /// The block device the tenants share (e.g. the one `iofloor rig up` printed).
        #[arg(long)]
        device: PathBuf,
        /// Policy to run; repeat for several (none is always run as the reference).
        #[arg(long = "policy")]
        policies: Vec<String>,
        /// Scale every time in the scenario (0.25 runs the 10-minute noisy-4 in 2.5).
        #[arg(long, default_value_t = 1.0)]
        time_scale: f64,
        /// Results directory (raw runs, fio logs, reports). Default: results/bench-SCENARIO.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print the summary as one JSON object on stdout.
        #[arg(long)]
        json: bool,
        /// Cost model for the policies (a file written by `iofloor calibrate`).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Root of the cgroup hierarchy with the I/O controller.
        #[arg(long, default_value = "/sys/fs/cgroup/blkio")]
        cgroup_root: PathBuf,
        /// Length of each tenant's alone run (p99 baseline; the whole scenario gives per-window demand), seconds.
        #[arg(long, default_value_t = 10.0)]
        alone_secs: f64,
        /// How VM tenants reach the device: `cgroup` (fio in a cgroup, like a
        /// container) or `qemu` (through qemu-storage-daemon's block layer,
        /// throttled at the VMM over QMP).
        #[arg(long, default_value = "cgroup", value_parser = ["cgroup", "qemu"])]
        vm_path: String,
    },
    /// The demo: a rig sized like the scenario's device, the scenario (noisy-4,
    /// shortened) under `none` and `floor` with real fio, the report, clean-up.
    Demo {
        #[arg(long, default_value = "noisy-4")]
        scenario: String,
        /// Shortens the scenario (0.2 runs noisy-4's 10 minutes in 2 per policy).
        #[arg(long, default_value_t = 0.2)]
        time_scale: f64,
        #[arg(long, default_value = "results/demo")]
        out: PathBuf,
    },
    /// Measure a device's cost model and queue knee with fio (io.cost form).
    Calibrate {
        device: PathBuf,
        /// Write the model here (TOML, read by `bench --model`); default: print it.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Seconds per fio measurement, after 1 s of ramp-up (about 20 measurements).
        #[arg(long, default_value_t = 3.0)]
        secs: f64,
        #[arg(long)]
        json: bool,
    },
    /// Measure the enforcement lag: from writing a throttle to its effect.
    Lag {
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
    },
    /// Run the controller as a service: tenants from a config file, floors
    /// kept until SIGTERM/SIGINT (limits restored), SIGHUP reloads.
    Run {
        /// The config file (docs/config.md).
        #[arg(long)]
        config: PathBuf,
        /// Only check the config and exit.
        #[arg(long)]
        check: bool,
    },
    /// A terminal view of a running daemon's tenants, refreshed each interval.
    Top {
        /// The daemon's API.
        #[arg(long, default_value = "http://127.0.0.1:9180")]
        url: String,
        /// Sort by: usage, cost, floor, name.
        #[arg(long, default_value = "usage")]
        sort: String,
        /// Print one table and exit (no terminal UI).
        #[arg(long)]
        once: bool,
    },
    /// A block device of known capacity for tests and demos.
    Rig {
        #[command(subcommand)]
        action: RigAction,
    },
}

#[derive(Subcommand)]
enum RigAction {
    /// Create a rig; prints its block device as the last line.
    Up {
        /// I/Os per second the device serves.
        #[arg(long)]
        iops: u64,
        /// Bytes per second (e.g. 200MiB/s), if limited too.
        #[arg(long)]
        bps: Option<String>,
        /// Count an I/O of n times this size as n I/Os (e.g. 4k).
        #[arg(long)]
        size_unit: Option<String>,
        /// Device size.
        #[arg(long, default_value = "1GiB")]
        size: String,
        #[arg(long, default_value = iofloor_host::rig::DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// Remove every rig (also after a crash).
    Down {
        #[arg(long, default_value = iofloor_host::rig::DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// List the rigs.
    List {
        #[arg(long, default_value = iofloor_host::rig::DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
}

/// An error caused by what the user gave us: exit code 2.
#[derive(Debug)]
struct BadInput(String);

impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}

fn bad(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(BadInput(msg.into()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iofloor: error: {e:#}");
            if e.downcast_ref::<BadInput>().is_some() {
                ExitCode::from(2)
            } else if matches!(
                e.downcast_ref::<iofloor_bench::BenchError>(),
                Some(iofloor_bench::BenchError::Interrupted)
            ) {
                ExitCode::from(130)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

/// Sets the returned flag on SIGINT or SIGTERM, so long runs stop cleanly.
fn stop_flag() -> anyhow::Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, flag.clone()).context("installing the signal handler")?;
    }
    Ok(flag)
}

fn parse_size_arg(flag: &str, text: &str) -> anyhow::Result<u64> {
    iofloor_core::units::parse_size(text).map_err(|e| bad(format!("{flag}: {e}")))
}

fn bench_error(e: iofloor_bench::BenchError) -> anyhow::Error {
    match e {
        iofloor_bench::BenchError::Invalid(m) => bad(m),
        other => anyhow::Error::new(other),
    }
}

fn calibrate_error(e: iofloor_host::calibrate::CalibrateError) -> anyhow::Error {
    if e.is_bad_input() {
        bad(e.to_string())
    } else {
        anyhow::Error::new(e)
    }
}

/// Reads a model file written by `iofloor calibrate`: the cost model and the queue knee.
fn load_model(path: &Path) -> anyhow::Result<(iofloor_core::CostModel, Option<f64>)> {
    iofloor_host::calibrate::ModelFile::load(path).map_err(calibrate_error)
}

fn load_scenario(arg: &str) -> anyhow::Result<Scenario> {
    let path = Path::new(arg);
    if path.exists() {
        return Scenario::load(path).map_err(|e| bad(e.to_string()));
    }
    match scenarios::builtin(arg) {
        Some(text) => {
            Scenario::parse(text, &format!("scenarios/{arg}.toml")).map_err(|e| bad(e.to_string()))
        }
        None => Err(bad(format!(
            "no scenario file `{arg}` and no shipped scenario of that name (shipped: {})",
            scenarios::names().join(", ")
        ))),
    }
}

fn parse_policies(names: &[String]) -> anyhow::Result<Vec<PolicyKind>> {
    if names.is_empty() {
        return Ok(PolicyKind::ALL.to_vec());
    }
    names
        .iter()
        .map(|n| {
            n.parse::<PolicyKind>()
                .map_err(|e| bad(format!("--policy: {e}")))
        })
        .collect()
}

fn verdict(scenario: &Scenario) -> admission::AdmissionVerdict {
    scenario.admission()
}

fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::new(1000);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {msg:12} [{bar:40}] {percent:>3}% {elapsed} (eta {eta})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Sim {
            scenario,
            policies,
            out,
            json,
            time_scale,
            threads,
            allow_overcommit,
            device_model,
        } => {
            let mut sc = load_scenario(&scenario)?;
            if let Some(path) = device_model {
                let (model, knee) = load_model(&path)?;
                sc.device.cost = model;
                // The knee is where latency reaches 1.5x unloaded: about 1.5x the parallelism.
                sc.device.parallelism =
                    knee.map(|k| (k / 1.5).round().max(1.0) as u32).unwrap_or(1);
                sc.device.jitter = 0.0;
                sc.device.write_cliff = None;
            }
            let policies = parse_policies(&policies)?;
            if !(time_scale.is_finite() && time_scale > 0.0 && time_scale <= 100.0) {
                return Err(bad(format!(
                    "--time-scale must be in (0, 100], got {time_scale}"
                )));
            }
            if time_scale != 1.0 {
                sc = sc.time_scaled(time_scale);
            }
            let v = verdict(&sc);
            if !v.admitted && !allow_overcommit {
                return Err(bad(format!(
                    "{}: admission control: {} (use --allow-overcommit to simulate anyway)",
                    sc.name,
                    v.summary()
                )));
            }
            let threads = threads
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
            if let Some(dir) = &out {
                let written = render::write_dir(dir, &runs)
                    .with_context(|| format!("writing {}", dir.display()))?;
                eprintln!("report: {}", written.html.display());
            }
            if json {
                println!("{}", render::summary_json(&sc.name, &compared));
            } else {
                println!("{} — {}\n", sc.name, sc.description);
                println!("{}", render::comparison_table(&compared));
                println!("{}", render::tenant_table(&compared));
            }
            Ok(())
        }
        Command::Report { dir, json } => {
            let (runs, written) = render::rebuild_dir(&dir).map_err(|e| bad(e.to_string()))?;
            let compared = iofloor_report::compare(&runs);
            if json {
                println!("{}", render::summary_json(&runs[0].scenario, &compared));
            } else {
                println!("{}", render::comparison_table(&compared));
                eprintln!("report: {}", written.html.display());
            }
            Ok(())
        }
        Command::Admit { scenario, json } => {
            let sc = load_scenario(&scenario)?;
            let v = verdict(&sc);
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("{}: {}", sc.name, v.summary());
                for t in &v.tenants {
                    let cost = t
                        .floor_cost
                        .map(|c| format!("{:.1}%", c * 100.0))
                        .unwrap_or_else(|| "unpriced".into());
                    println!(
                        "  {:<16} {:>8}  {}",
                        t.name,
                        cost,
                        if t.guaranteed {
                            "guaranteed"
                        } else {
                            "NOT guaranteed"
                        }
                    );
                }
            }
            if v.admitted {
                Ok(())
            } else {
                Err(bad(format!("{}: {}", sc.name, v.summary())))
            }
        }
        Command::Bench {
            scenario,
            device,
            policies,
            time_scale,
            out,
            json,
            model,
            cgroup_root,
            alone_secs,
            vm_path,
        } => {
            let mut sc = load_scenario(&scenario)?;
            let policies = parse_policies(&policies)?;
            if !(time_scale.is_finite() && time_scale > 0.0 && time_scale <= 100.0) {
                return Err(bad(format!(
                    "--time-scale must be in (0, 100], got {time_scale}"
                )));
            }
            if !(alone_secs.is_finite() && alone_secs >= 2.0) {
                return Err(bad(format!(
                    "--alone-secs must be at least 2, got {alone_secs}"
                )));
            }
            if time_scale != 1.0 {
                sc = sc.time_scaled(time_scale);
            }
            let model = match model.as_deref().map(load_model).transpose()? {
                Some((m, knee)) => {
                    sc.policy.floor.queue_knee = knee.or(sc.policy.floor.queue_knee);
                    Some(m)
                }
                None => None,
            };
            let out = out.unwrap_or_else(|| PathBuf::from(format!("results/bench-{}", sc.name)));
            let opts = iofloor_bench::BenchOptions {
                device,
                policies,
                cgroup_root,
                work_dir: out.join("fio"),
                model,
                alone: std::time::Duration::from_secs_f64(alone_secs),
                settle: std::time::Duration::from_secs(2),
                vm_paths: vm_path == "qemu",
            };
            let dev = iofloor_bench::preflight(&sc, &opts).map_err(bench_error)?;
            if !opts.vm_paths
                && sc
                    .tenants
                    .iter()
                    .any(|t| t.spec.class == iofloor_core::TenantClass::Vm)
            {
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
            let compared = iofloor_report::compare(&runs);
            let written = render::write_dir(&out, &runs)
                .with_context(|| format!("writing {}", out.display()))?;
            eprintln!("report: {}", written.html.display());
            if json {
                println!("{}", render::summary_json(&sc.name, &compared));
            } else {
                println!("{} on {}\n", sc.name, opts.device.display());
                println!("{}", render::comparison_table(&compared));
                println!("{}", render::tenant_table(&compared));
            }
            Ok(())
        }
        Command::Calibrate {
            device,
            out,
            secs,
            json,
        } => {
            iofloor_host::DevId::of_block_device(&device).map_err(|e| bad(e.to_string()))?;
            iofloor_host::fio::check_version().map_err(|e| bad(e.to_string()))?;
            if !(secs.is_finite() && (1.0..=600.0).contains(&secs)) {
                return Err(bad(format!("--secs must be 1..600, got {secs}")));
            }
            let work = tempfile::tempdir().context("a scratch directory")?;
            eprintln!(
                "calibrating {} (writes to it; about {:.0} s)",
                device.display(),
                iofloor_host::calibrate::planned(secs).as_secs_f64()
            );
            let cal = iofloor_host::calibrate::calibrate(&device, work.path(), secs, &|what| {
                eprintln!("  {what}")
            })
            .map_err(calibrate_error)?;
            if json {
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
            match out {
                Some(path) => {
                    std::fs::write(&path, cal.to_toml())
                        .with_context(|| format!("writing {}", path.display()))?;
                    eprintln!("model written to {}", path.display());
                }
                None if !json => print!("{}", cal.to_toml()),
                None => {}
            }
            Ok(())
        }
        Command::Run { config, check } => {
            let config =
                iofloor_daemon::config::Config::load(&config).map_err(|e| bad(e.to_string()))?;
            if check {
                println!(
                    "{}: ok ({} devices, {} tenant entries, policy {})",
                    config.file.display(),
                    config.devices.len(),
                    config.tenants.len(),
                    config.policy
                );
                return Ok(());
            }
            use std::io::IsTerminal;
            tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("IOFLOOR_LOG")
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .init();
            iofloor_daemon::run(config)
        }
        Command::Top { url, sort, once } => top::run(&url, &sort, once),
        Command::Lag {
            device,
            cap,
            trials,
            cgroup_root,
            json,
        } => {
            if !(cap.is_finite() && cap >= 1.0) || !(1..=100).contains(&trials) {
                return Err(bad("--cap must be at least 1 and --trials 1..100"));
            }
            iofloor_host::fio::check_version().map_err(|e| bad(e.to_string()))?;
            let work = tempfile::tempdir().context("a scratch directory")?;
            let r = iofloor_bench::lag::enforcement_lag(
                &device,
                &cgroup_root,
                cap,
                trials,
                work.path(),
            )
            .map_err(bench_error)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                for (i, t) in r.trials.iter().enumerate() {
                    println!(
                        "trial {i}: {:.0} IOPS before, {:.0} after a cap of {cap:.0}: lag {}",
                        t.iops_before,
                        t.iops_after,
                        t.lag_s
                            .map(|l| format!("{:.0} ms", l * 1e3))
                            .unwrap_or_else(|| "over 1 s".into())
                    );
                }
                match r.median_lag_s {
                    Some(l) => println!("median enforcement lag: {:.0} ms", l * 1e3),
                    None => println!("median enforcement lag: over 1 s in some trial"),
                }
            }
            Ok(())
        }
        Command::Demo {
            scenario,
            time_scale,
            out,
        } => {
            let sc = load_scenario(&scenario)?;
            // A rig that serves as many I/Os as the scenario's device does for its mix.
            let mixes: Vec<_> = sc
                .tenants
                .iter()
                .filter_map(|t| sc.expected_mix(t))
                .collect();
            let (ios, cost) = mixes.iter().fold((0.0, 0.0), |(i, c), m| {
                (i + m.iops(), c + sc.device.cost.cost_rate(m))
            });
            let iops = (ios / cost).round() as u64;
            let state = out.join("rig");
            let spec = iofloor_host::rig::RigSpec {
                iops,
                bps: None,
                size_unit: None,
                size: 1 << 30,
            };
            eprintln!(
                "bringing up a rig of {iops} IOPS (the {} device for its I/O mix)",
                sc.name
            );
            let rig = iofloor_host::rig::Rig::up(spec, &state).map_err(|e| bad(e.to_string()))?;
            struct RigGuard(PathBuf);
            impl Drop for RigGuard {
                fn drop(&mut self) {
                    if let Err(e) = iofloor_host::rig::Rig::down_all(&self.0) {
                        eprintln!("warning: removing the rig: {e}");
                    }
                }
            }
            let _guard = RigGuard(state);
            let device = rig.device.clone().expect("a started rig has a device");
            run(Cli {
                command: Command::Bench {
                    scenario,
                    device,
                    policies: vec!["floor".into()],
                    time_scale,
                    out: Some(out.clone()),
                    json: false,
                    model: None,
                    cgroup_root: PathBuf::from("/sys/fs/cgroup/blkio"),
                    alone_secs: 10.0,
                    vm_path: "cgroup".into(),
                },
            })
        }
        Command::Rig { action } => match action {
            RigAction::Up {
                iops,
                bps,
                size_unit,
                size,
                state_dir,
            } => {
                let bps = match bps {
                    Some(text) => match iofloor_core::Rate::parse(&text)
                        .map_err(|e| bad(format!("--bps: {e}")))?
                    {
                        iofloor_core::Rate::BytesPerSec(b) => Some(b.round() as u64),
                        other => {
                            return Err(bad(format!("--bps: `{text}` is {other}, not a bandwidth")))
                        }
                    },
                    None => None,
                };
                let spec = iofloor_host::rig::RigSpec {
                    iops,
                    bps,
                    size_unit: size_unit
                        .as_deref()
                        .map(|s| parse_size_arg("--size-unit", s))
                        .transpose()?,
                    size: parse_size_arg("--size", &size)?,
                };
                spec.validate().map_err(|e| bad(e.to_string()))?;
                let rig = iofloor_host::rig::Rig::up(spec, &state_dir)?;
                eprintln!("rig in {} ({} IOPS)", rig.dir.display(), spec.iops);
                println!(
                    "{}",
                    rig.device.expect("a started rig has a device").display()
                );
                Ok(())
            }
            RigAction::Down { state_dir } => {
                let n = iofloor_host::rig::Rig::down_all(&state_dir)?;
                eprintln!("removed {n} rig(s)");
                Ok(())
            }
            RigAction::List { state_dir } => {
                for r in iofloor_host::rig::Rig::list(&state_dir)? {
                    println!(
                        "{}\t{} IOPS\t{}",
                        r.device
                            .map(|d| d.display().to_string())
                            .unwrap_or_else(|| "(starting)".into()),
                        r.spec.iops,
                        r.dir.display()
                    );
                }
                Ok(())
            }
        },
        Command::Scenarios => {
            for name in scenarios::names() {
                let sc = load_scenario(name)?;
                println!("{name:<10} {}", sc.description);
            }
            Ok(())
        }
    }
}
