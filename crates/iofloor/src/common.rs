//! What the subcommands share: the bad-input error (exit code 2), loading
//! scenarios and model files, checking common flags, and turning relative
//! paths into absolute ones where they enter.

use crate::scenarios;
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use iofloor_core::policy::PolicyKind;
use iofloor_scenario::Scenario;
use std::path::{Path, PathBuf};

/// An error caused by what the user gave us: exit code 2.
#[derive(Debug)]
pub struct BadInput(String);

impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}

pub fn bad(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(BadInput(msg.into()))
}

/// `path` made absolute against the current directory, once, where it
/// enters: every later comparison (e.g. with /proc/mounts) and every child
/// process then sees the same path whatever its working directory.
pub fn absolute(flag: &str, path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).map_err(|e| bad(format!("{flag} {}: {e}", path.display())))
}

/// Sets the returned flag on SIGINT or SIGTERM, so long runs stop cleanly.
pub fn stop_flag() -> anyhow::Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, flag.clone()).context("installing the signal handler")?;
    }
    Ok(flag)
}

pub fn parse_size_arg(flag: &str, text: &str) -> anyhow::Result<u64> {
    iofloor_core::units::parse_size(text).map_err(|e| bad(format!("{flag}: {e}")))
}

pub fn check_time_scale(time_scale: f64) -> anyhow::Result<()> {
    if time_scale.is_finite() && time_scale > 0.0 && time_scale <= 100.0 {
        Ok(())
    } else {
        Err(bad(format!(
            "--time-scale must be in (0, 100], got {time_scale}"
        )))
    }
}

/// An alone run's length: at least 2 s, or its p99 means nothing.
pub fn check_alone_secs(secs: f64) -> anyhow::Result<()> {
    if secs.is_finite() && secs >= 2.0 {
        Ok(())
    } else {
        Err(bad(format!("--alone-secs must be at least 2, got {secs}")))
    }
}

pub fn bench_error(e: iofloor_bench::BenchError) -> anyhow::Error {
    match e {
        iofloor_bench::BenchError::Invalid(m) => bad(m),
        other => anyhow::Error::new(other),
    }
}

pub fn calibrate_error(e: iofloor_host::calibrate::CalibrateError) -> anyhow::Error {
    if e.is_bad_input() {
        bad(e.to_string())
    } else {
        anyhow::Error::new(e)
    }
}

/// Reads a model file written by `iofloor calibrate`: the cost model and the queue knee.
pub fn load_model(path: &Path) -> anyhow::Result<(iofloor_core::CostModel, Option<f64>)> {
    iofloor_host::calibrate::ModelFile::load(path).map_err(calibrate_error)
}

/// A scenario file, or the name of a shipped scenario.
pub fn load_scenario(arg: &str) -> anyhow::Result<Scenario> {
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

/// `--policy` values; none given means every policy.
pub fn parse_policies(names: &[String]) -> anyhow::Result<Vec<PolicyKind>> {
    if names.is_empty() {
        return Ok(PolicyKind::ALL.to_vec());
    }
    names
        .iter()
        .map(|n| {
            if iofloor_scenario::KernelRun::parse(n).is_some() {
                return Err(bad(format!(
                    "--policy: `{n}` is the kernel's own controller: `iofloor bench` sets it up on a cgroup v2 device; the simulator models none"
                )));
            }
            n.parse::<PolicyKind>()
                .map_err(|e| bad(format!("--policy: {e}")))
        })
        .collect()
}

pub fn progress_bar() -> ProgressBar {
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
