//! `run` (the service) and `top` (watching it).

use crate::common::bad;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct RunArgs {
    /// The config file (docs/config.md).
    #[arg(long)]
    config: PathBuf,
    /// Only check the config and exit.
    #[arg(long)]
    check: bool,
}

#[derive(Args)]
pub struct TopArgs {
    /// The daemon's API.
    #[arg(long, default_value = "http://127.0.0.1:9180")]
    pub url: String,
    /// Sort by: usage, cost, floor, name.
    #[arg(long, default_value = "usage")]
    pub sort: String,
    /// Print one table and exit (no terminal UI).
    #[arg(long)]
    pub once: bool,
    /// Every host's tenants of the shared device (an agent in cluster mode).
    #[arg(long)]
    pub cluster: bool,
}

/// Said by `--check` and at the service's start when the config has no
/// `[[device]]` (as the package ships it).
const NO_DEVICE: &str = "no [[device]] is configured: the service controls nothing until one is \
     added to the file and the service restarted";

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let config =
        iofloor_daemon::config::Config::load(&args.config).map_err(|e| bad(e.to_string()))?;
    if args.check {
        // A trusted runtime with a device adds an entry of its own (its
        // labelled containers), after the file's.
        let labelled = config
            .runtimes
            .iter()
            .filter(|r| r.trust_labels && r.device.is_some())
            .count();
        let runtimes = match (config.runtimes.len(), labelled) {
            (0, _) => String::new(),
            (n, 0) => format!(", {n} container runtimes"),
            (n, l) => {
                format!(", {n} container runtimes ({l} whose labelled containers are tenants)")
            }
        };
        println!(
            "{}: ok ({} devices, {} tenant entries{runtimes}, policy {})",
            config.file.display(),
            config.devices.len(),
            config.tenants.len() - labelled,
            config.policy
        );
        if config.devices.is_empty() {
            println!("{NO_DEVICE}");
        }
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
    if config.devices.is_empty() {
        tracing::warn!("{}: {NO_DEVICE}", config.file.display());
    }
    iofloor_daemon::run(config)
}
