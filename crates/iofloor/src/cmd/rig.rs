//! `rig up|set|down|list`: a block device of known capacity for tests and
//! demos, whose capacity can be changed while it is in use.

use crate::common::{bad, parse_size_arg};
use clap::{Args, Subcommand};
use iofloor_testbed::rig::{Rig, RigSpec, DEFAULT_STATE_ROOT};
use std::path::{Path, PathBuf};

/// A device of known capacity, as `rig up` and `guest up` take it.
#[derive(Args)]
pub struct DeviceArgs {
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
}

impl DeviceArgs {
    /// The capacity these flags give, checked.
    pub(crate) fn spec(&self) -> anyhow::Result<RigSpec> {
        let spec = RigSpec {
            iops: self.iops,
            bps: parse_bps(self.bps.as_deref())?,
            size_unit: self
                .size_unit
                .as_deref()
                .map(|s| parse_size_arg("--size-unit", s))
                .transpose()?,
            size: parse_size_arg("--size", &self.size)?,
        };
        spec.validate().map_err(|e| bad(e.to_string()))?;
        Ok(spec)
    }
}

#[derive(Subcommand)]
pub enum RigAction {
    /// Create a rig; prints its block device as the last line.
    Up {
        #[command(flatten)]
        device: DeviceArgs,
        /// Where rigs are recorded; an absolute path, so `rig down` finds them from anywhere.
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// Change a rig's capacity while it is in use (nothing tells its
    /// tenants: as a write cliff or another host on the same storage would).
    Set {
        /// I/Os per second the device serves from now on.
        #[arg(long)]
        iops: u64,
        /// Bytes per second, if limited too.
        #[arg(long)]
        bps: Option<String>,
        /// The rig's block device (needed when there are several rigs).
        #[arg(long)]
        device: Option<PathBuf>,
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// Remove every rig (also after a crash).
    Down {
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// List the rigs.
    List {
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
}

/// The state directory is how a later `rig down` finds what `rig up` made;
/// relative to the working directory it would be found only from there.
pub(crate) fn state_root(dir: &Path) -> anyhow::Result<&Path> {
    if dir.is_absolute() {
        Ok(dir)
    } else {
        Err(bad(format!(
            "--state-dir {}: must be an absolute path (`down` has to find it from any directory)",
            dir.display()
        )))
    }
}

pub(crate) fn parse_bps(bps: Option<&str>) -> anyhow::Result<Option<u64>> {
    let Some(text) = bps else { return Ok(None) };
    match iofloor_core::Rate::parse(text).map_err(|e| bad(format!("--bps: {e}")))? {
        iofloor_core::Rate::BytesPerSec(b) => Ok(Some(b.round() as u64)),
        other => Err(bad(format!("--bps: `{text}` is {other}, not a bandwidth"))),
    }
}

pub fn rig(action: RigAction) -> anyhow::Result<()> {
    match action {
        RigAction::Up { device, state_dir } => {
            let root = state_root(&state_dir)?;
            let spec = device.spec()?;
            let rig = Rig::up(spec, root)?;
            eprintln!("rig in {} ({} IOPS)", rig.dir.display(), spec.iops);
            println!(
                "{}",
                rig.device.expect("a started rig has a device").display()
            );
        }
        RigAction::Set {
            iops,
            bps,
            device,
            state_dir,
        } => {
            let mut rigs = Rig::list(state_root(&state_dir)?)?;
            let found = match &device {
                Some(d) => rigs
                    .iter()
                    .position(|r| r.device.as_deref() == Some(d.as_path())),
                None if rigs.len() == 1 => Some(0),
                None => None,
            };
            let Some(i) = found else {
                return Err(bad(match device {
                    Some(d) => format!(
                        "--device {}: no rig with that device in {}",
                        d.display(),
                        state_dir.display()
                    ),
                    None => format!(
                        "{} rigs in {}: name one with --device",
                        rigs.len(),
                        state_dir.display()
                    ),
                }));
            };
            let mut rig = rigs.swap_remove(i);
            let spec = RigSpec {
                iops,
                bps: parse_bps(bps.as_deref())?,
                ..rig.spec
            };
            spec.validate().map_err(|e| bad(e.to_string()))?;
            rig.change_capacity(spec)?;
            eprintln!(
                "rig {} now serves {} IOPS",
                rig.device
                    .as_deref()
                    .unwrap_or(Path::new("(starting)"))
                    .display(),
                spec.iops
            );
        }
        RigAction::Down { state_dir } => {
            let n = Rig::down_all(state_root(&state_dir)?)?;
            eprintln!("removed {n} rig(s)");
        }
        RigAction::List { state_dir } => {
            for r in Rig::list(state_root(&state_dir)?)? {
                let device = r
                    .device
                    .map(|d| d.display().to_string())
                    .unwrap_or_else(|| "(starting)".into());
                println!("{device}\t{} IOPS\t{}", r.spec.iops, r.dir.display());
            }
        }
    }
    Ok(())
}
