//! `cluster up|down|list|exec|partition|heal|kill-etcd|set`: the test bed of
//! several hosts sharing one device over the network, with a 3-member etcd,
//! on this one machine (`iofloor_host::cluster_bed`).

use crate::cmd::rig::{parse_bps, state_root};
use crate::common::{bad, parse_size_arg};
use clap::Subcommand;
use iofloor_host::cluster_bed::{ClusterBed, DEFAULT_STATE_ROOT, MAX_HOSTS};
use iofloor_host::rig::RigSpec;
use std::path::PathBuf;
use std::process::Command;

#[derive(Subcommand)]
pub enum ClusterAction {
    /// Create the bed: a storage node serving one device of known capacity
    /// over NBD, N hosts each seeing it as a loop device, a 3-member etcd.
    /// Prints each host's device and the etcd endpoints.
    Up {
        /// How many hosts share the device.
        #[arg(long, default_value_t = 3)]
        hosts: usize,
        /// I/Os per second the shared device serves.
        #[arg(long, default_value_t = 4000)]
        iops: u64,
        /// Bytes per second, if limited too (e.g. 200MiB/s).
        #[arg(long)]
        bps: Option<String>,
        /// Size of the shared device (filled with data at start).
        #[arg(long, default_value = "256MiB")]
        size: String,
        /// Where the bed is recorded; an absolute path, so `down` finds it
        /// from anywhere.
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// Remove every bed (also after a crash).
    Down {
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// Show the bed: capacity, hosts, devices, etcd endpoints.
    List {
        /// As JSON (the recorded state).
        #[arg(long)]
        json: bool,
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// Run a command on a host: in its network namespace, where etcd and
    /// the storage node are reachable (e.g. `cluster exec h1 -- iofloor run
    /// --config h1.toml`); exits with the command's status.
    Exec {
        /// h0, h1, ...
        host: String,
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// Cut a host off from etcd and the other hosts; its storage path stays.
    Partition {
        host: String,
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// Reconnect a partitioned host.
    Heal {
        host: String,
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// Kill an etcd member (e0, e1, e2) with SIGKILL.
    KillEtcd {
        member: String,
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
    /// Change the shared device's capacity while in use (nothing tells the
    /// hosts).
    Set {
        #[arg(long)]
        iops: u64,
        #[arg(long)]
        bps: Option<String>,
        #[arg(long, default_value = DEFAULT_STATE_ROOT)]
        state_dir: PathBuf,
    },
}

pub fn cluster(action: ClusterAction) -> anyhow::Result<()> {
    match action {
        ClusterAction::Up {
            hosts,
            iops,
            bps,
            size,
            state_dir,
        } => {
            let root = state_root(&state_dir)?;
            if hosts == 0 || hosts > MAX_HOSTS {
                return Err(bad(format!("--hosts: must be 1..{MAX_HOSTS}, got {hosts}")));
            }
            let spec = RigSpec {
                iops,
                bps: parse_bps(bps.as_deref())?,
                size_unit: None,
                size: parse_size_arg("--size", &size)?,
            };
            spec.validate().map_err(|e| bad(e.to_string()))?;
            if !ClusterBed::list(root)?.is_empty() {
                return Err(bad(format!(
                    "--state-dir {}: a test bed is already up there; `iofloor cluster down` first, or use another --state-dir",
                    root.display()
                )));
            }
            let bed = ClusterBed::up(hosts, spec, root)?;
            eprintln!("test bed in {} ({} IOPS shared)", bed.dir.display(), iops);
            print_bed(&bed);
        }
        ClusterAction::Down { state_dir } => {
            let n = ClusterBed::down_all(state_root(&state_dir)?)?;
            eprintln!("removed {n} test bed(s)");
        }
        ClusterAction::List { json, state_dir } => {
            for bed in ClusterBed::list(state_root(&state_dir)?)? {
                if json {
                    println!("{}", serde_json::to_string_pretty(&bed)?);
                } else {
                    print_bed(&bed);
                }
            }
        }
        ClusterAction::Exec {
            host,
            command,
            state_dir,
        } => {
            let bed = ClusterBed::only(state_root(&state_dir)?)?;
            let host = bed.host(&host).map_err(|e| bad(e.to_string()))?;
            let status = Command::new("nsenter")
                .arg(format!("--net=/run/netns/{}", host.netns))
                .args(&command)
                .status()?;
            // The command's own exit status, as `ssh host cmd` would give it.
            std::process::exit(status.code().unwrap_or(1));
        }
        ClusterAction::Partition { host, state_dir } => {
            let mut bed = ClusterBed::only(state_root(&state_dir)?)?;
            bed.host(&host).map_err(|e| bad(e.to_string()))?;
            bed.partition(&host)?;
            eprintln!("{host} cut off from etcd and the other hosts (storage path kept)");
        }
        ClusterAction::Heal { host, state_dir } => {
            let mut bed = ClusterBed::only(state_root(&state_dir)?)?;
            bed.host(&host).map_err(|e| bad(e.to_string()))?;
            bed.heal(&host)?;
            eprintln!("{host} reconnected");
        }
        ClusterAction::KillEtcd { member, state_dir } => {
            let mut bed = ClusterBed::only(state_root(&state_dir)?)?;
            if !bed.etcd.iter().any(|e| e.name == member) {
                return Err(bad(format!(
                    "{member}: not an etcd member of the bed (e0, e1, e2)"
                )));
            }
            bed.kill_etcd(&member)?;
            eprintln!("etcd member {member} killed");
        }
        ClusterAction::Set {
            iops,
            bps,
            state_dir,
        } => {
            let mut bed = ClusterBed::only(state_root(&state_dir)?)?;
            let spec = RigSpec {
                iops,
                bps: parse_bps(bps.as_deref())?,
                ..bed.spec
            };
            spec.validate().map_err(|e| bad(e.to_string()))?;
            bed.change_capacity(spec)?;
            eprintln!("the shared device now serves {iops} IOPS");
        }
    }
    Ok(())
}

fn print_bed(bed: &ClusterBed) {
    println!("shared device: {} IOPS", bed.spec.iops);
    for h in &bed.hosts {
        println!(
            "{}\t{}\t{}\tnetns {}{}",
            h.name,
            h.ip,
            h.device
                .as_ref()
                .map(|d| d.display().to_string())
                .unwrap_or_else(|| "(starting)".into()),
            h.netns,
            if h.partitioned { "\tpartitioned" } else { "" }
        );
    }
    println!("etcd endpoints: {}", bed.endpoints().join(","));
}
