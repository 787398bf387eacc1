//! `demo`: the README's first command. A rig sized like the scenario's
//! device, the scenario under `none` and `floor` with real fio, the report,
//! and everything it made removed again.

use crate::cmd::bench::{bench, BenchArgs};
use crate::common::{absolute, bad, check_alone_secs, check_time_scale, load_scenario};
use clap::Args;
use iofloor_testbed::rig::{Rig, RigSpec};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct DemoArgs {
    #[arg(long, default_value = "noisy-4")]
    scenario: String,
    /// Shortens the scenario (0.2 runs noisy-4's 10 minutes in 2 per policy).
    #[arg(long, default_value_t = 0.2)]
    time_scale: f64,
    /// Results directory; must be new or empty (relative to the current directory).
    #[arg(long, default_value = "results/demo")]
    out: PathBuf,
    /// Length of each tenant's alone run (its p99 baseline), seconds, as
    /// `iofloor bench --alone-secs`.
    #[arg(long, default_value_t = 10.0)]
    alone_secs: f64,
}

/// Makes `out` ready for a demo's results: absent or an empty directory,
/// and writable. Refused before anything is made, so bad input leaves nothing.
fn prepare_out(out: &Path) -> anyhow::Result<()> {
    if out.exists() {
        let mut entries = std::fs::read_dir(out).map_err(|e| {
            bad(format!(
                "--out {}: not a readable directory: {e}",
                out.display()
            ))
        })?;
        if entries.next().is_some() {
            return Err(bad(format!(
                "--out {}: not empty; give a new directory (or remove this one) so results are not mixed",
                out.display()
            )));
        }
    }
    let created_root = first_missing_ancestor(out);
    let made = std::fs::create_dir_all(out.join("rig"));
    if let Err(e) = made {
        if let Some(root) = created_root.filter(|r| r.exists()) {
            let _ = std::fs::remove_dir_all(root);
        }
        return Err(bad(format!(
            "--out {}: cannot write there: {e}",
            out.display()
        )));
    }
    Ok(())
}

/// The outermost directory of `path` that does not exist yet (what
/// `create_dir_all` would make first), if any.
fn first_missing_ancestor(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .take_while(|p| !p.exists())
        .last()
        .map(Path::to_path_buf)
}

/// Removes the demo's rig however the demo ends (error, Ctrl-C, panic).
struct RigGuard(PathBuf);

impl Drop for RigGuard {
    fn drop(&mut self) {
        match Rig::down_all(&self.0) {
            Ok(_) => {
                let _ = std::fs::remove_dir(&self.0);
            }
            Err(e) => eprintln!("warning: removing the rig: {e}"),
        }
    }
}

pub fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let sc = load_scenario(&args.scenario)?;
    check_time_scale(args.time_scale)?;
    check_alone_secs(args.alone_secs)?;
    let out = absolute("--out", &args.out)?;
    prepare_out(&out)?;
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
    let spec = RigSpec {
        iops,
        bps: None,
        size_unit: None,
        size: 1 << 30,
    };
    eprintln!(
        "bringing up a rig of {iops} IOPS (the {} device for its I/O mix)",
        sc.name
    );
    let state = out.join("rig");
    let _guard = RigGuard(state.clone());
    let rig = Rig::up(spec, &state)?;
    let device = rig.device.clone().expect("a started rig has a device");
    bench(BenchArgs {
        scenario: args.scenario,
        device: Some(device),
        cluster: false,
        bed_state_dir: PathBuf::from(iofloor_testbed::cluster::DEFAULT_STATE_ROOT),
        policies: vec!["floor".into()],
        time_scale: args.time_scale,
        out: Some(out),
        json: false,
        model: None,
        cgroup_root: Some(PathBuf::from("/sys/fs/cgroup/blkio")),
        alone_secs: args.alone_secs,
        vm_path: "cgroup".into(),
        rig_state_dir: state,
    })
}
