//! The `iofloor` command: simulate scenarios, rebuild reports, check admission.

use anyhow::Context;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use iofloor_core::admission;
use iofloor_core::policy::PolicyKind;
use iofloor_report::render;
use iofloor_sim::Scenario;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod scenarios;

#[derive(Parser)]
#[command(name = "iofloor", version, about = "I/O floors for tenants sharing flash")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate a scenario under one or more policies and compare them.
    Sim {
        /// A scenario file, or the name of a shipped one (noisy-4, noisy-20, size-mix, hybrid).
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
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn load_scenario(arg: &str) -> anyhow::Result<Scenario> {
    let path = Path::new(arg);
    if path.exists() {
        return Scenario::load(path).map_err(|e| bad(e.to_string()));
    }
    match scenarios::builtin(arg) {
        Some(text) => Scenario::parse(text, &format!("scenarios/{arg}.toml")).map_err(|e| bad(e.to_string())),
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
    names.iter().map(|n| n.parse::<PolicyKind>().map_err(|e| bad(format!("--policy: {e}")))).collect()
}

fn verdict(scenario: &Scenario) -> admission::AdmissionVerdict {
    let mixes: Vec<_> = scenario.tenants.iter().map(|t| (&t.spec, scenario.expected_mix(t))).collect();
    admission::check(&scenario.policy_model, scenario.policy.floor.target_utilisation, &mixes)
}

fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::new(1000);
    bar.set_style(
        ProgressStyle::with_template("{spinner} simulating [{bar:40}] {percent:>3}% {elapsed} (eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Sim { scenario, policies, out, json, time_scale, threads, allow_overcommit } => {
            let mut sc = load_scenario(&scenario)?;
            let policies = parse_policies(&policies)?;
            if !(time_scale.is_finite() && time_scale > 0.0 && time_scale <= 100.0) {
                return Err(bad(format!("--time-scale must be in (0, 100], got {time_scale}")));
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
                .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
                .clamp(1, 64);
            let bar = progress_bar();
            let runs = iofloor_sim::run_policies(&sc, &policies, threads, &|f| bar.set_position((f * 1000.0) as u64));
            bar.finish_and_clear();
            // Only the asked-for policies are reported, plus `none` (the reference).
            let compared = iofloor_report::compare(&runs);
            if let Some(dir) = &out {
                let written = render::write_dir(dir, &runs).with_context(|| format!("writing {}", dir.display()))?;
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
                    let cost = t.floor_cost.map(|c| format!("{:.1}%", c * 100.0)).unwrap_or_else(|| "unpriced".into());
                    println!("  {:<16} {:>8}  {}", t.name, cost, if t.guaranteed { "guaranteed" } else { "NOT guaranteed" });
                }
            }
            if v.admitted {
                Ok(())
            } else {
                Err(bad(format!("{}: {}", sc.name, v.summary())))
            }
        }
        Command::Scenarios => {
            for name in scenarios::names() {
                let sc = load_scenario(name)?;
                println!("{name:<10} {}", sc.description);
            }
            Ok(())
        }
    }
}
