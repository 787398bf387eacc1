//! The kernel's own I/O controllers, set up to be measured beside iofloor on
//! the same device: io.cost (cgroup v2's weight-based controller, with its
//! device model and latency QoS) ordering by `io.weight`, and BFQ ordering
//! by `io.bfq.weight`. Each tenant's weight is proportional to its floor.
//! The device's files (`io.cost.model`, `io.cost.qos`, the scheduler) are
//! read first and put back by [`KernelControl::restore`] (or on drop), as
//! every limit iofloor sets is; the tenants' weights go back to the
//! kernel's default, 100 (they are set on cgroups made for the run). The
//! first write to `io.cost.model` sets io.cost up on the device for good,
//! switched off once put back: its lines stay in both files.

use crate::cgroup::{v2_device_fields, DevId};
use crate::error::{HostError, Result};
use iofloor_core::cost::CostParams;
use std::fs;
use std::path::{Path, PathBuf};

/// io.cost's latency QoS (`io.cost.qos`): the percentile of completions
/// that must finish within each target, and the bounds of the rate
/// (`vrate`) io.cost may issue at, in per cent of its model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IoCostQos {
    pub rpct: f64,
    pub rlat_us: u64,
    pub wpct: f64,
    pub wlat_us: u64,
    pub min_pct: f64,
    pub max_pct: f64,
}

impl IoCostQos {
    /// No latency target and `vrate` pinned at 100 %: io.cost issues what
    /// its model says the device serves, no more and no less (without
    /// targets and with the kernel's bounds, 1-10,000 %, a device short of
    /// capacity would raise `vrate` to the top and the model would mean
    /// nothing).
    pub const PINNED: IoCostQos = IoCostQos {
        rpct: 0.0,
        rlat_us: 0,
        wpct: 0.0,
        wlat_us: 0,
        min_pct: 100.0,
        max_pct: 100.0,
    };

    /// A latency target on both directions at percentile `pct`, `vrate`
    /// free between a quarter and one and a half times the model (the
    /// kernel documentation's example bounds are 50-150 %; a capacity cut
    /// of 40 % needs room below half).
    pub fn latency(pct: f64, lat_us: u64) -> IoCostQos {
        IoCostQos {
            rpct: pct,
            rlat_us: lat_us,
            wpct: pct,
            wlat_us: lat_us,
            min_pct: 25.0,
            max_pct: 150.0,
        }
    }

    fn line(&self, dev: DevId) -> String {
        let pct = |p: f64| {
            if p > 0.0 {
                format!("{p:.2}")
            } else {
                "0".into()
            }
        };
        let mut line = format!(
            "{dev} enable=1 ctrl=user rpct={} wpct={} min={:.2} max={:.2}",
            pct(self.rpct),
            pct(self.wpct),
            self.min_pct,
            self.max_pct
        );
        // A latency is written only with its percentile: alone it would
        // join whatever percentile is in force.
        if self.rpct > 0.0 {
            line.push_str(&format!(" rlat={}", self.rlat_us.max(1)));
        }
        if self.wpct > 0.0 {
            line.push_str(&format!(" wlat={}", self.wlat_us.max(1)));
        }
        line
    }
}

/// Which of the kernel's controllers orders the device's I/O.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelSetup {
    /// io.cost with `model` (the same cost model iofloor's policies are
    /// given) and `qos`; tenants weighted by `io.weight`.
    IoCost { model: CostParams, qos: IoCostQos },
    /// BFQ as the device's scheduler; tenants weighted by `io.bfq.weight`.
    Bfq,
}

/// The largest `io.weight` (io.cost) and `io.bfq.weight` the kernel takes.
const IO_WEIGHT_MAX: f64 = 10_000.0;
const BFQ_WEIGHT_MAX: f64 = 1_000.0;

/// One file as it was before a kernel controller was set up, and what
/// puts it back.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Saved {
    path: PathBuf,
    text: String,
}

/// A kernel controller in force on a device; [`KernelControl::restore`]
/// puts back every file it changed, in the reverse order.
#[derive(Debug)]
pub struct KernelControl {
    saved: Vec<Saved>,
    /// Where what puts the files back is kept, before each write, so that
    /// a process killed mid-run leaves it for [`restore_journal`].
    journal: Option<PathBuf>,
}

impl KernelControl {
    /// Sets up `setup` for device `dev` on the cgroup v2 hierarchy at `root`
    /// (`sys` is /sys), each tenant cgroup (relative to `root`) weighted in
    /// proportion to its share (its floor, in cost units). On an error
    /// what was already changed is put back. With a `journal` path, what
    /// puts each file back is written there before the file is changed.
    pub fn apply(
        setup: &KernelSetup,
        root: &Path,
        sys: &Path,
        dev: DevId,
        tenants: &[(PathBuf, f64)],
        journal: Option<&Path>,
    ) -> Result<KernelControl> {
        let mut control = KernelControl {
            saved: Vec::new(),
            journal: journal.map(Path::to_path_buf),
        };
        let applied = match setup {
            KernelSetup::IoCost { model, qos } => control.io_cost(root, dev, model, qos, tenants),
            KernelSetup::Bfq => control.bfq(root, sys, dev, tenants),
        };
        match applied {
            Ok(()) => Ok(control),
            Err(e) => {
                let _ = control.restore();
                Err(e)
            }
        }
    }

    fn io_cost(
        &mut self,
        root: &Path,
        dev: DevId,
        model: &CostParams,
        qos: &IoCostQos,
        tenants: &[(PathBuf, f64)],
    ) -> Result<()> {
        let model_file = root.join("io.cost.model");
        let qos_file = root.join("io.cost.qos");
        let model_before =
            fs::read_to_string(&model_file).map_err(|e| not_io_cost(&model_file, e))?;
        let qos_before = fs::read_to_string(&qos_file).map_err(|e| HostError::io(&qos_file, e))?;
        self.write(
            &model_file,
            &model_line(dev, model),
            restore_line(&model_before, dev, &model_file, "")?,
        )?;
        self.write(
            &qos_file,
            &qos.line(dev),
            restore_line(&qos_before, dev, &qos_file, "enable=0 ")?,
        )?;
        for (cgroup, weight) in weights(tenants, IO_WEIGHT_MAX) {
            let file = root.join(cgroup).join("io.weight");
            self.write(&file, &format!("default {weight}"), "default 100".into())?;
        }
        Ok(())
    }

    fn bfq(
        &mut self,
        root: &Path,
        sys: &Path,
        dev: DevId,
        tenants: &[(PathBuf, f64)],
    ) -> Result<()> {
        let file = sys.join(format!("dev/block/{dev}/queue/scheduler"));
        let text = fs::read_to_string(&file).map_err(|e| HostError::io(&file, e))?;
        let active = active_scheduler(&text).ok_or_else(|| {
            HostError::malformed(
                &file,
                Some(1),
                format!("no [active] scheduler in `{}`", text.trim()),
            )
        })?;
        if !text
            .split_whitespace()
            .any(|s| s.trim_matches(['[', ']']) == "bfq")
        {
            return Err(HostError::not_usable(
                file.display(),
                format!(
                    "offers no bfq (`{}`): load it with `modprobe bfq`",
                    text.trim()
                ),
            ));
        }
        self.write(&file, "bfq", active.to_string())?;
        for (cgroup, weight) in weights(tenants, BFQ_WEIGHT_MAX) {
            let file = root.join(cgroup).join("io.bfq.weight");
            self.write(&file, &format!("default {weight}"), "default 100".into())?;
        }
        Ok(())
    }

    /// Writes `text` to `path`, after remembering `undo` as what puts it back.
    fn write(&mut self, path: &Path, text: &str, undo: String) -> Result<()> {
        self.saved.push(Saved {
            path: path.to_path_buf(),
            text: undo,
        });
        self.write_journal()?;
        fs::write(path, text).map_err(|e| HostError::io(path, e))
    }

    fn write_journal(&self) -> Result<()> {
        let Some(journal) = &self.journal else {
            return Ok(());
        };
        let text = serde_json::to_string(&self.saved).expect("saved files serialise");
        let partial = journal.with_extension("partial");
        fs::write(&partial, text).map_err(|e| HostError::io(&partial, e))?;
        fs::rename(&partial, journal).map_err(|e| HostError::io(journal, e))
    }

    /// Puts back every file changed, the last first. A tenant's cgroup
    /// already removed is no error (its weight went with it); the first
    /// other failure is returned after every other file has been tried.
    pub fn restore(mut self) -> Result<()> {
        self.restore_saved()
    }

    fn restore_saved(&mut self) -> Result<()> {
        let mut first_error = None;
        while let Some(s) = self.saved.pop() {
            match fs::write(&s.path, &s.text) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !is_root_file(&s.path) => {}
                Err(e) => {
                    first_error.get_or_insert(HostError::io(&s.path, e));
                }
            }
        }
        // Tried once; a file that could not be put back now is said, not
        // tried again at every start.
        if let Some(journal) = &self.journal {
            match fs::remove_file(journal) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    first_error.get_or_insert(HostError::io(journal, e));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Puts back what a process killed while a kernel controller was in force
/// left in its `journal` (see [`KernelControl::apply`]), and removes it.
pub fn restore_journal(journal: &Path) -> Result<()> {
    let text = fs::read_to_string(journal).map_err(|e| HostError::io(journal, e))?;
    let saved: Vec<Saved> = serde_json::from_str(&text)
        .map_err(|e| HostError::malformed(journal, None, e.to_string()))?;
    KernelControl {
        saved,
        journal: Some(journal.to_path_buf()),
    }
    .restore()
}

impl Drop for KernelControl {
    fn drop(&mut self) {
        // The error paths' clean-up: a run that ends well has called
        // `restore` and reported its failures; here there is no one to tell.
        let _ = self.restore_saved();
    }
}

/// Files on the hierarchy's root or in /sys, which never go away: one
/// missing there is an error.
fn is_root_file(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n == "io.cost.qos" || n == "io.cost.model" || n == "scheduler")
}

fn not_io_cost(path: &Path, e: std::io::Error) -> HostError {
    if e.kind() == std::io::ErrorKind::NotFound {
        HostError::not_usable(
            path.display(),
            "missing: this kernel has no io.cost (CONFIG_BLK_CGROUP_IOCOST), or the hierarchy is not cgroup v2's root",
        )
    } else {
        HostError::io(path, e)
    }
}

/// io.cost's linear model from iofloor's cost model: the same six figures,
/// whole numbers.
fn model_line(dev: DevId, m: &CostParams) -> String {
    let n = |x: f64| x.round().max(1.0) as u64;
    format!(
        "{dev} ctrl=user model=linear rbps={} rseqiops={} rrandiops={} wbps={} wseqiops={} wrandiops={}",
        n(m.rbps),
        n(m.rseqiops),
        n(m.rrandiops),
        n(m.wbps),
        n(m.wseqiops),
        n(m.wrandiops)
    )
}

/// What puts `dev`'s line of an io.cost file back: the line itself if an
/// operator set it (`ctrl=user`), else the kernel's own automatic setting
/// (writing an automatic line's figures back would make them the user's).
/// `off` is what else turns it off (`enable=0 ` for the QoS).
fn restore_line(text: &str, dev: DevId, origin: &Path, off: &str) -> Result<String> {
    let Some((_, fields)) = v2_device_fields(text, dev, origin)? else {
        return Ok(format!("{dev} {off}ctrl=auto"));
    };
    let get = |key: &str| fields.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    if get("ctrl") == Some("user") {
        let line = fields
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        return Ok(format!("{dev} {line}"));
    }
    let enable = get("enable")
        .map(|e| format!("enable={e} "))
        .unwrap_or_default();
    Ok(format!("{dev} {enable}ctrl=auto"))
}

/// The bracketed entry of a `queue/scheduler` file: the one in force.
fn active_scheduler(text: &str) -> Option<&str> {
    text.split_whitespace()
        .find(|s| s.starts_with('[') && s.ends_with(']'))
        .map(|s| s.trim_matches(['[', ']']))
}

/// Whole weights in proportion to the shares, the largest share at `max`,
/// none below 1 (the kernel's least).
fn weights(tenants: &[(PathBuf, f64)], max: f64) -> Vec<(&Path, u32)> {
    let top = tenants.iter().map(|(_, s)| *s).fold(0.0, f64::max);
    tenants
        .iter()
        .map(|(cgroup, share)| {
            let w = if top > 0.0 {
                (max * share / top).round()
            } else {
                100.0
            };
            (cgroup.as_path(), w.clamp(1.0, max) as u32)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEV: DevId = DevId {
        major: 254,
        minor: 0,
    };

    fn params() -> CostParams {
        CostParams {
            rbps: 4096.0 * 1000.0,
            rseqiops: 1000.0,
            rrandiops: 1000.0,
            wbps: 4096.0 * 1000.0,
            wseqiops: 1000.0,
            wrandiops: 1000.0,
        }
    }

    fn tree() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cgroup");
        let sys = dir.path().join("sys");
        for t in ["t/q1", "t/noisy"] {
            fs::create_dir_all(root.join(t)).unwrap();
            fs::write(root.join(t).join("io.weight"), "default 100\n").unwrap();
            fs::write(root.join(t).join("io.bfq.weight"), "default 100\n").unwrap();
        }
        fs::write(root.join("io.cost.model"), "").unwrap();
        fs::write(root.join("io.cost.qos"), "").unwrap();
        let queue = sys.join("dev/block/254:0/queue");
        fs::create_dir_all(&queue).unwrap();
        fs::write(queue.join("scheduler"), "[mq-deadline] bfq none\n").unwrap();
        (dir, root, sys)
    }

    fn tenants() -> Vec<(PathBuf, f64)> {
        vec![("t/q1".into(), 0.25), ("t/noisy".into(), 0.05)]
    }

    fn read(p: PathBuf) -> String {
        fs::read_to_string(p).unwrap()
    }

    #[test]
    fn io_cost_writes_the_model_the_qos_and_weights_by_floor_and_puts_them_back() {
        let (_d, root, sys) = tree();
        let setup = KernelSetup::IoCost {
            model: params(),
            qos: IoCostQos::latency(95.0, 5000),
        };
        let control = KernelControl::apply(&setup, &root, &sys, DEV, &tenants(), None).unwrap();
        assert_eq!(
            read(root.join("io.cost.model")),
            "254:0 ctrl=user model=linear rbps=4096000 rseqiops=1000 rrandiops=1000 wbps=4096000 wseqiops=1000 wrandiops=1000"
        );
        assert_eq!(
            read(root.join("io.cost.qos")),
            "254:0 enable=1 ctrl=user rpct=95.00 wpct=95.00 min=25.00 max=150.00 rlat=5000 wlat=5000"
        );
        assert_eq!(read(root.join("t/q1/io.weight")), "default 10000");
        assert_eq!(read(root.join("t/noisy/io.weight")), "default 2000");
        control.restore().unwrap();
        assert_eq!(read(root.join("io.cost.qos")), "254:0 enable=0 ctrl=auto");
        assert_eq!(read(root.join("io.cost.model")), "254:0 ctrl=auto");
        assert_eq!(read(root.join("t/q1/io.weight")), "default 100");
    }

    #[test]
    fn a_killed_runs_journal_puts_the_files_back() {
        let (dir, root, sys) = tree();
        let journal = dir.path().join("kernel-1.json");
        let control = KernelControl::apply(
            &KernelSetup::Bfq,
            &root,
            &sys,
            DEV,
            &tenants(),
            Some(&journal),
        )
        .unwrap();
        let sched = sys.join("dev/block/254:0/queue/scheduler");
        assert_eq!(read(sched.clone()), "bfq");
        // Killed: nothing runs its drop.
        std::mem::forget(control);
        assert!(journal.exists());
        restore_journal(&journal).unwrap();
        assert_eq!(read(sched), "mq-deadline");
        assert_eq!(read(root.join("t/q1/io.bfq.weight")), "default 100");
        assert!(!journal.exists());
        fs::write(&journal, "[{").unwrap();
        let e = restore_journal(&journal).unwrap_err();
        assert!(e.to_string().contains("kernel-1.json"), "{e}");
    }

    #[test]
    fn pinned_qos_has_no_latency_target_and_a_fixed_rate() {
        assert_eq!(
            IoCostQos::PINNED.line(DEV),
            "254:0 enable=1 ctrl=user rpct=0 wpct=0 min=100.00 max=100.00"
        );
    }

    #[test]
    fn an_operators_own_io_cost_lines_come_back_as_they_were() {
        let (_d, root, sys) = tree();
        let model = "254:0 ctrl=user model=linear rbps=1 rseqiops=2 rrandiops=3 wbps=4 wseqiops=5 wrandiops=6\n";
        fs::write(root.join("io.cost.model"), model).unwrap();
        fs::write(
            root.join("io.cost.qos"),
            "254:0 enable=1 ctrl=auto rpct=0.00 rlat=250000 wpct=0.00 wlat=250000 min=1.00 max=10000.00\n",
        )
        .unwrap();
        let setup = KernelSetup::IoCost {
            model: params(),
            qos: IoCostQos::PINNED,
        };
        drop(KernelControl::apply(&setup, &root, &sys, DEV, &tenants(), None).unwrap());
        assert_eq!(read(root.join("io.cost.model")), model.trim_end());
        assert_eq!(read(root.join("io.cost.qos")), "254:0 enable=1 ctrl=auto");
    }

    #[test]
    fn bfq_becomes_the_scheduler_with_weights_and_the_old_one_comes_back() {
        let (_d, root, sys) = tree();
        let sched = sys.join("dev/block/254:0/queue/scheduler");
        let control =
            KernelControl::apply(&KernelSetup::Bfq, &root, &sys, DEV, &tenants(), None).unwrap();
        assert_eq!(read(sched.clone()), "bfq");
        assert_eq!(read(root.join("t/q1/io.bfq.weight")), "default 1000");
        assert_eq!(read(root.join("t/noisy/io.bfq.weight")), "default 200");
        fs::remove_dir_all(root.join("t/noisy")).unwrap();
        control.restore().unwrap();
        assert_eq!(read(sched), "mq-deadline");
    }

    #[test]
    fn a_device_without_bfq_or_a_kernel_without_io_cost_is_named_and_nothing_is_left_changed() {
        let (_d, root, sys) = tree();
        let sched = sys.join("dev/block/254:0/queue/scheduler");
        fs::write(&sched, "[none] mq-deadline\n").unwrap();
        let e = KernelControl::apply(&KernelSetup::Bfq, &root, &sys, DEV, &tenants(), None)
            .unwrap_err();
        assert!(e.to_string().contains("offers no bfq"), "{e}");
        fs::remove_file(root.join("io.cost.model")).unwrap();
        let setup = KernelSetup::IoCost {
            model: params(),
            qos: IoCostQos::PINNED,
        };
        let e = KernelControl::apply(&setup, &root, &sys, DEV, &tenants(), None).unwrap_err();
        assert!(e.to_string().contains("io.cost.model: missing"), "{e}");
        // A tenant cgroup without io.weight (io not enabled for it) fails
        // after the root files changed: they are put back.
        fs::write(root.join("io.cost.model"), "").unwrap();
        fs::remove_file(root.join("t/noisy/io.weight")).unwrap();
        fs::remove_dir_all(root.join("t/noisy")).unwrap();
        let e = KernelControl::apply(&setup, &root, &sys, DEV, &tenants(), None).unwrap_err();
        assert!(e.to_string().contains("t/noisy/io.weight"), "{e}");
        assert_eq!(read(root.join("io.cost.qos")), "254:0 enable=0 ctrl=auto");
        assert_eq!(read(root.join("io.cost.model")), "254:0 ctrl=auto");
    }
}
