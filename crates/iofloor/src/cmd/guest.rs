//! `guest up|exec|set|down|list`: a cgroup v2 host in a TCG guest, with this
//! iofloor, fio and a disk of known capacity in it (crates/testbed's
//! v2guest).

use crate::cmd::rig::{parse_bps, state_root, DeviceArgs};
use crate::common::bad;
use clap::Subcommand;
use iofloor_testbed::rig::RigSpec;
use iofloor_testbed::v2guest::{V2Guest, DEFAULT_STATE_ROOT, GUEST_API_PORT};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Subcommand)]
pub enum GuestAction {
    /// Boot a guest; prints its state directory, then its disk as `MAJ:MIN
    /// /dev/vda` and the host port of its API as the last lines.
    Up {
        /// Its disk.
        #[command(flatten)]
        disk: DeviceArgs,
        /// The guest's RAM, MiB (its initramfs, fio's libraries and iofloor
        /// live in it).
        #[arg(long, default_value_t = 1536)]
        memory: u32,
        /// Where guests are recorded; an absolute path, so `guest down` finds them from anywhere.
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// Run a shell command in the guest; its output, and its exit status as
    /// this command's.
    Exec {
        /// Seconds before it is given up.
        #[arg(long, default_value_t = 60.0)]
        timeout: f64,
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
        /// The command (busybox sh).
        #[arg(required = true, trailing_var_arg = true)]
        command: Vec<String>,
    },
    /// Change the guest disk's capacity while it is in use.
    Set {
        /// I/Os per second the disk serves from now on.
        #[arg(long)]
        iops: u64,
        /// Bytes per second, if limited too.
        #[arg(long)]
        bps: Option<String>,
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// Remove every guest (also after a crash).
    Down {
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// List the guests.
    List {
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// Answer the guest's capacity port until the guest goes down (`guest
    /// up` starts it): how a bench in the guest changes its disk's
    /// capacity for a scenario's `device.change`.
    #[command(hide = true)]
    Relay {
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
}

pub fn guest(action: GuestAction) -> anyhow::Result<()> {
    match action {
        GuestAction::Up {
            disk,
            memory,
            state_dir,
        } => guest_up(&disk, memory, &state_dir)?,
        GuestAction::Exec {
            timeout,
            state_dir,
            command,
        } => {
            if !(timeout.is_finite() && timeout > 0.0) {
                return Err(bad(format!("--timeout: must be positive, got {timeout}")));
            }
            let guest = only(&state_dir)?;
            let ran = guest.exec(&command.join(" "), Duration::from_secs_f64(timeout))?;
            print!("{}", ran.output);
            std::process::exit(ran.status.clamp(0, 255));
        }
        GuestAction::Set {
            iops,
            bps,
            state_dir,
        } => {
            let mut guest = only(&state_dir)?;
            let spec = RigSpec {
                iops,
                bps: parse_bps(bps.as_deref())?,
                ..guest.spec
            };
            spec.validate().map_err(|e| bad(e.to_string()))?;
            guest.change_capacity(spec)?;
            eprintln!("the guest's disk now serves {iops} IOPS");
        }
        GuestAction::Down { state_dir } => {
            let n = V2Guest::down_all(state_root(&state_dir)?)?;
            eprintln!("removed {n} guest(s)");
        }
        GuestAction::List { state_dir } => {
            for g in V2Guest::list(state_root(&state_dir)?)? {
                println!("{}", serde_json::to_string_pretty(&g)?);
            }
        }
        GuestAction::Relay { state_dir } => only(&state_dir)?.serve_capacity()?,
    }
    Ok(())
}

/// Boots the v2 guest and its capacity relay; prints its directory, its
/// disk's device number and where its API is forwarded.
fn guest_up(disk: &DeviceArgs, memory: u32, state_dir: &std::path::Path) -> anyhow::Result<()> {
    let root = state_root(state_dir)?;
    let spec = disk.spec()?;
    if !(256..=16384).contains(&memory) {
        return Err(bad(format!(
            "--memory: must be 256..16384 MiB, got {memory}"
        )));
    }
    // One TCG guest takes a core; two would starve each other and
    // the host's I/O threads on this kind of machine.
    if let Some(other) = V2Guest::list(root)?.first() {
        return Err(bad(format!(
            "a guest is already up ({}); `iofloor guest down` first",
            other.dir.display()
        )));
    }
    let me = std::env::current_exe()?;
    let guest = V2Guest::up(
        spec,
        &[(me.clone(), "/usr/bin/iofloor".into())],
        memory,
        root,
    )?;
    if let Err(e) = start_relay(&me, root, &guest.dir) {
        let _ = guest.down();
        return Err(e.context("starting `iofloor guest relay`; the guest was taken down"));
    }
    println!("{}", guest.dir.display());
    println!("{} /dev/vda", guest.device.as_deref().unwrap_or("?:?"));
    println!(
        "127.0.0.1:{} -> guest port {GUEST_API_PORT}",
        guest.api_port
    );
    Ok(())
}

/// `guest relay` for the guest just booted, in a process group of its own
/// (a Ctrl-C to the shell that ran `guest up` does not reach it), its
/// errors in `relay.log` in the guest's directory; it ends when QEMU closes
/// the port.
fn start_relay(
    me: &std::path::Path,
    root: &std::path::Path,
    guest_dir: &std::path::Path,
) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let log_path = guest_dir.join("relay.log");
    let log = std::fs::File::create(&log_path).with_context(|| log_path.display().to_string())?;
    std::process::Command::new(me)
        .args(["guest", "relay", "--state-dir"])
        .arg(root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0)
        .spawn()?;
    Ok(())
}

/// The one guest under `state_dir`.
fn only(state_dir: &std::path::Path) -> anyhow::Result<V2Guest> {
    let mut guests = V2Guest::list(state_root(state_dir)?)?;
    match guests.len() {
        1 => Ok(guests.remove(0)),
        0 => Err(bad(format!(
            "no guest under {}; `iofloor guest up` first",
            state_dir.display()
        ))),
        n => Err(bad(format!("{n} guests under {}", state_dir.display()))),
    }
}
