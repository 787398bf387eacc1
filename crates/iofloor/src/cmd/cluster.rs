//! `cluster up|down|list|exec|partition|heal|kill-etcd|set`: the test bed of
//! several hosts sharing one device over the network, with a 3-member etcd,
//! on this one machine (`iofloor_testbed::cluster`). `cluster set-floor` and
//! `cluster floors` work on any cluster, through an agent's API.

use crate::cmd::rig::{parse_bps, state_root};
use crate::common::{bad, parse_size_arg};
use anyhow::Context;
use clap::Subcommand;
use iofloor_core::units::Rate;
use iofloor_testbed::cluster::{ClusterBed, DEFAULT_STATE_ROOT, MAX_HOSTS};
use iofloor_testbed::rig::RigSpec;
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
    /// Set a tenant's floor for the whole cluster, through any agent's API:
    /// it replaces the host files' floor of every tenant of that name on
    /// the shared device; refused (exit 2) when the floors of every host
    /// would no longer fit it. Not a test bed command: it works on any
    /// cluster.
    SetFloor {
        tenant: String,
        /// A rate (`500iops`, `20MiB/s`, `25%`), or `none` for no floor
        /// whatever the host files say.
        #[arg(required_unless_present = "clear")]
        floor: Option<String>,
        /// Remove the cluster's floor: the host files' floors apply again.
        #[arg(long, conflicts_with = "floor")]
        clear: bool,
        /// An agent's API.
        #[arg(long, default_value = "http://127.0.0.1:9180")]
        url: String,
        /// The agents' `api.token` (default: $IOFLOOR_TOKEN).
        #[arg(long)]
        token: Option<String>,
    },
    /// The floors set for the whole cluster, through any agent's API.
    Floors {
        #[arg(long, default_value = "http://127.0.0.1:9180")]
        url: String,
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

/// Calls an agent's API; a 4xx answer is the caller's mistake (exit 2), with
/// the agent's own message.
fn call_api(
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> anyhow::Result<serde_json::Value> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(15)))
        .build()
        .into();
    let mut request = ureq::http::Request::builder()
        .method(method)
        .uri(url)
        .header("Content-Type", "application/json");
    if let Some(t) = token {
        request = request.header("Authorization", format!("Bearer {t}"));
    }
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let request = request
        .body(body)
        .with_context(|| format!("{method} {url}"))?;
    let mut resp = agent
        .run(request)
        .with_context(|| format!("{method} {url}"))?;
    let status = resp.status().as_u16();
    let answer: serde_json::Value = resp
        .body_mut()
        .read_json()
        .with_context(|| format!("{method} {url}: not the iofloor API"))?;
    let message = || {
        answer["error"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| answer.to_string())
    };
    match status {
        200..=299 => Ok(answer),
        400..=499 => Err(bad(format!("{url}: {status}: {}", message()))),
        _ => anyhow::bail!("{url}: {status}: {}", message()),
    }
}

fn floors_url(base: &str, tenant: Option<&str>) -> String {
    let base = base.trim_end_matches('/');
    match tenant {
        // Tenant names may hold `/` (a cgroup glob's `pods/pod-a`): the
        // route takes the rest of the path.
        Some(t) => format!("{base}/api/v1/cluster/floors/{t}"),
        None => format!("{base}/api/v1/cluster/floors"),
    }
}

/// A floor as the API writes it (a rate, or `null` for none).
fn floor_text(v: &serde_json::Value) -> String {
    match serde_json::from_value::<Option<Rate>>(v.clone()) {
        Ok(Some(rate)) => rate.to_string(),
        _ => "none".into(),
    }
}

/// `cluster set-floor`: one tenant's floor on every host, or the host
/// files' floors back (`clear`).
fn set_floor(
    tenant: &str,
    floor: Option<&str>,
    clear: bool,
    url: &str,
    token: Option<String>,
) -> anyhow::Result<()> {
    if tenant.trim().is_empty() {
        return Err(bad("TENANT: must not be empty"));
    }
    let target = floors_url(url, Some(tenant));
    let token = token.or_else(|| std::env::var("IOFLOOR_TOKEN").ok());
    let answer = if clear {
        call_api("DELETE", &target, token.as_deref(), None)?
    } else {
        let floor = floor.expect("clap requires FLOOR without --clear");
        let floor = match floor.trim() {
            "none" => serde_json::Value::Null,
            rate => {
                // Checked here too, so a typo is named before any request.
                Rate::parse(rate).map_err(|e| bad(format!("FLOOR `{rate}`: {e}")))?;
                serde_json::Value::String(rate.into())
            }
        };
        call_api(
            "PUT",
            &target,
            token.as_deref(),
            Some(serde_json::json!({ "floor": floor })),
        )?
    };
    if clear {
        println!("{tenant}: the host files' floors apply");
    } else {
        println!(
            "{tenant}: floor {} on every host",
            floor_text(&answer["floor"])
        );
    }
    Ok(())
}

/// `cluster up`: a test bed of `hosts` hosts sharing a device of `iops`.
fn bed_up(
    hosts: usize,
    iops: u64,
    bps: Option<&str>,
    size: &str,
    state_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let root = state_root(state_dir)?;
    if hosts == 0 || hosts > MAX_HOSTS {
        return Err(bad(format!("--hosts: must be 1..{MAX_HOSTS}, got {hosts}")));
    }
    let spec = RigSpec {
        iops,
        bps: parse_bps(bps)?,
        size_unit: None,
        size: parse_size_arg("--size", size)?,
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
    Ok(())
}

/// `cluster set`: the shared device's capacity, changed live.
fn bed_set(iops: u64, bps: Option<&str>, state_dir: &std::path::Path) -> anyhow::Result<()> {
    let mut bed = ClusterBed::only(state_root(state_dir)?)?;
    let spec = RigSpec {
        iops,
        bps: parse_bps(bps)?,
        ..bed.spec
    };
    spec.validate().map_err(|e| bad(e.to_string()))?;
    bed.change_capacity(spec)?;
    eprintln!("the shared device now serves {iops} IOPS");
    Ok(())
}

pub fn cluster(action: ClusterAction) -> anyhow::Result<()> {
    match action {
        ClusterAction::SetFloor {
            tenant,
            floor,
            clear,
            url,
            token,
        } => set_floor(&tenant, floor.as_deref(), clear, &url, token)?,
        ClusterAction::Floors { url } => print_floors(&url)?,
        ClusterAction::Up {
            hosts,
            iops,
            bps,
            size,
            state_dir,
        } => bed_up(hosts, iops, bps.as_deref(), &size, &state_dir)?,
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
        } => exec_on(&host, &command, &state_dir)?,
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
        } => bed_set(iops, bps.as_deref(), &state_dir)?,
    }
    Ok(())
}

/// Every cluster floor set through the API, one per line.
fn print_floors(url: &str) -> anyhow::Result<()> {
    let answer = call_api("GET", &floors_url(url, None), None, None)?;
    for f in answer["floors"].as_array().into_iter().flatten() {
        println!(
            "{}  {}",
            f["tenant"].as_str().unwrap_or("?"),
            floor_text(&f["floor"])
        );
    }
    Ok(())
}

/// Runs `command` in a bed host's network namespace and exits with its
/// status, as `ssh host cmd` would.
fn exec_on(host: &str, command: &[String], state_dir: &std::path::Path) -> anyhow::Result<()> {
    let bed = ClusterBed::only(state_root(state_dir)?)?;
    let host = bed.host(host).map_err(|e| bad(e.to_string()))?;
    let status = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", host.netns))
        .args(command)
        .status()?;
    std::process::exit(status.code().unwrap_or(1));
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
