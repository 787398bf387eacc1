//! The `iofloor` command: simulate scenarios, benchmark real devices, run the
//! controller as a service (`run`) and watch it (`top`). This file only parses
//! and dispatches; each subcommand lives in `cmd/`, and what they share (exit
//! codes, scenario and model loading, paths) in `common.rs`.

use clap::{Parser, Subcommand};
use common::BadInput;
use std::process::ExitCode;

// mimalloc rather than glibc's malloc: the policy's vectors are made and
// freed every interval, and at 10,000 tenants glibc gave them back to the
// kernel and faulted them in again each time (a decision 1.4-1.8 ms instead
// of 1.0; `cargo bench -p iofloor-core --bench decide`, which uses the same).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cmd;
mod common;
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
    Sim(cmd::sim::SimArgs),
    /// Rebuild summary, reports and charts from a results directory.
    Report(cmd::sim::ReportArgs),
    /// Admission control: can every floor of a scenario be guaranteed?
    Admit(cmd::sim::AdmitArgs),
    /// List the shipped scenarios.
    Scenarios,
    /// Run a scenario with real fio tenants in cgroups on a real block device.
    Bench(cmd::bench::BenchArgs),
    /// The demo: a rig sized like the scenario's device, the scenario (noisy-4,
    /// shortened) under `none` and `floor` with real fio, the report, clean-up.
    Demo(cmd::demo::DemoArgs),
    /// Measure a device's cost model and queue knee with fio (io.cost form).
    Calibrate(cmd::bench::CalibrateArgs),
    /// Measure the enforcement lag: from writing a throttle to its effect.
    Lag(cmd::bench::LagArgs),
    /// Run the controller as a service: tenants from a config file, floors
    /// kept until SIGTERM/SIGINT (limits restored), SIGHUP reloads.
    Run(cmd::service::RunArgs),
    /// A terminal view of a running daemon's tenants, refreshed each interval.
    Top(cmd::service::TopArgs),
    /// A block device of known capacity for tests and demos.
    Rig {
        #[command(subcommand)]
        action: cmd::rig::RigAction,
    },
    /// A test bed of several hosts sharing one device over the network, with
    /// a 3-member etcd, on this machine (network namespaces).
    Cluster {
        #[command(subcommand)]
        action: cmd::cluster::ClusterAction,
    },
    /// A cgroup v2 host in a TCG guest (io.max, io.stat, io.cost live), with
    /// this iofloor, fio and a disk of known capacity in it.
    Guest {
        #[command(subcommand)]
        action: cmd::guest::GuestAction,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli.command) {
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

fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Sim(args) => cmd::sim::sim(args),
        Command::Report(args) => cmd::sim::report(args),
        Command::Admit(args) => cmd::sim::admit(args),
        Command::Scenarios => cmd::sim::list_scenarios(),
        Command::Bench(args) => cmd::bench::bench(args),
        Command::Demo(args) => cmd::demo::demo(args),
        Command::Calibrate(args) => cmd::bench::calibrate(args),
        Command::Lag(args) => cmd::bench::lag(args),
        Command::Run(args) => cmd::service::run(args),
        Command::Top(args) => top::run(&args.url, &args.sort, args.once, args.cluster),
        Command::Rig { action } => cmd::rig::rig(action),
        Command::Cluster { action } => cmd::cluster::cluster(action),
        Command::Guest { action } => cmd::guest::guest(action),
    }
}
