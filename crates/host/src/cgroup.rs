//! cgroup I/O controllers: v1 `blkio` (blk-throttle) and v2 `io`.
//!
//! Both read per-device cumulative counters and write per-device limits for
//! one block device of a cgroup. The cgroup root is injectable, so the same
//! code runs against the live hierarchy and against recorded file trees.
//!
//! Written against the files directly rather than with cgroups-rs, which
//! hard-codes the root and pulls a large tree for the handful of files used.

use crate::error::{HostError, Result};
use iofloor_core::{Caps, Counters};
use std::fs;
use std::path::{Path, PathBuf};

/// A block device number, as the kernel writes it: `MAJ:MIN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct DevId {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for DevId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

impl std::str::FromStr for DevId {
    type Err = HostError;
    fn from_str(s: &str) -> Result<DevId> {
        let bad = || HostError::not_usable(format!("`{s}`"), "is not a device number MAJ:MIN");
        let (a, b) = s.trim().split_once(':').ok_or_else(bad)?;
        Ok(DevId {
            major: a.parse().map_err(|_| bad())?,
            minor: b.parse().map_err(|_| bad())?,
        })
    }
}

impl DevId {
    /// The device number of a block device node; an error naming the path if
    /// it does not exist or is not a block device.
    pub fn of_block_device(path: &Path) -> Result<DevId> {
        use std::os::unix::fs::FileTypeExt;
        let meta = fs::metadata(path).map_err(|e| HostError::io(path, e))?;
        if !meta.file_type().is_block_device() {
            return Err(HostError::not_usable(
                path.display(),
                "is not a block device",
            ));
        }
        let st = rustix::fs::stat(path).map_err(|e| HostError::io(path, e.into()))?;
        Ok(DevId {
            major: rustix::fs::major(st.st_rdev),
            minor: rustix::fs::minor(st.st_rdev),
        })
    }

    /// The kernel's name of the device (`loop0`), from /sys/dev/block.
    pub fn kernel_name(&self, sys: &Path) -> Result<String> {
        let link = sys.join(format!("dev/block/{self}"));
        let target = fs::read_link(&link).map_err(|e| HostError::io(&link, e))?;
        target
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .ok_or_else(|| HostError::not_usable(link.display(), "has no device name"))
    }
}

/// Which I/O controller a hierarchy offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Version {
    V1,
    V2,
}

/// Finds the I/O controller under `root`: v1 if it holds blk-throttle files,
/// v2 if `io` is among its controllers.
pub fn detect(root: &Path) -> Result<Version> {
    if root.join("blkio.throttle.io_serviced").exists() {
        return Ok(Version::V1);
    }
    let controllers = root.join("cgroup.controllers");
    if let Ok(text) = fs::read_to_string(&controllers) {
        if text.split_whitespace().any(|c| c == "io") {
            return Ok(Version::V2);
        }
        return Err(HostError::not_usable(
            root.display(),
            format!(
                "cgroup v2 without the io controller (controllers: {})",
                text.trim()
            ),
        ));
    }
    Err(HostError::not_usable(
        root.display(),
        "neither a cgroup v1 blkio hierarchy nor a cgroup v2 one (is blkio mounted?)",
    ))
}

/// One cgroup I/O controller for one device.
pub trait IoController: Send {
    fn version(&self) -> Version;
    fn root(&self) -> &Path;
    fn device(&self) -> DevId;
    /// Cumulative counters of `cgroup` (relative to the root) for the device.
    fn read(&self, cgroup: &Path) -> Result<Counters>;
    /// The limits in force for the device.
    fn caps(&self, cgroup: &Path) -> Result<Caps>;
    /// Sets the limits exactly (None = no limit), writing only those that
    /// differ.
    fn set_caps(&self, cgroup: &Path, caps: &Caps) -> Result<()> {
        self.adjust_caps(cgroup, caps, 0.0)
    }
    /// Sets the limits, leaving one in force that is within `tolerance` (a
    /// share of it) of the one wanted: the control path's writes, each of
    /// which restarts blk-throttle's slice ([`REWRITE_TOLERANCE`]).
    fn adjust_caps(&self, cgroup: &Path, caps: &Caps, tolerance: f64) -> Result<()>;
}

fn read_file(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|e| HostError::io(path, e))
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    write_existing(path, text).map_err(|e| HostError::io(path, e))
}

/// Writes a control file that must already be there. `fs::write` would try
/// to create a missing one, and cgroupfs answers a create with EACCES: a
/// v2 `io.max` gone because the parent stopped enabling io read
/// "Permission denied" instead of the file missing and why (seen live).
fn write_existing(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?
        .write_all(text.as_bytes())
}

/// Builds the controller the hierarchy at `root` offers.
pub fn controller(root: &Path, dev: DevId) -> Result<Box<dyn IoController>> {
    Ok(match detect(root)? {
        Version::V1 => {
            activate_v1_throttle(root, dev)?;
            Box::new(BlkioV1 {
                root: root.to_path_buf(),
                dev,
            })
        }
        Version::V2 => Box::new(IoV2 {
            root: root.to_path_buf(),
            dev,
        }),
    })
}

// ---------------------------------------------------------------- v1 ----

/// Turns on blk-throttle for the device's queue, so that its counters
/// (`blkio.throttle.io_serviced`, `io_service_bytes`) count every cgroup's
/// I/O from now on. Since Linux 6.10 (commit a3166c51702b, "blk-throttle: delay
/// initialization until configuration") blk-throttle starts on a queue only
/// when a limit is first written for it: before that the counters of a
/// fresh device (a loop device just attached) read zero, and a policy
/// watching them sees idle tenants on a saturated device (measured on
/// kernel 6.18: `Total 0` after a second of fio at 4,000 IOPS). A limit of
/// 0 is "no limit": written to the root, where no limit is ever set, it
/// starts the throttle without limiting anything, and the file reads as
/// before. Done only where the root has no entry for the device (one means
/// the throttle already runs), so a limit someone set is never undone.
fn activate_v1_throttle(root: &Path, dev: DevId) -> Result<()> {
    let file = root.join(V1_LIMITS[0].0);
    if parse_v1_limit(&read_file(&file)?, dev, &file)?.is_some() {
        return Ok(());
    }
    write_file(&file, &format!("{dev} 0"))
}

/// cgroup v1 `blkio` with blk-throttle. Limits apply to direct I/O only and
/// are flat: a parent's limit does not bound its children.
pub struct BlkioV1 {
    pub root: PathBuf,
    pub dev: DevId,
}

/// A limit within this share of the one in force is not rewritten by the
/// control path (exact restores of an original are always written): each
/// write restarts the group's throttle slice and lets its backlog through
/// (the rig, a 1,600-IOPS limit on a QD-16 reader: never rewritten 1,601
/// IOPS; its IOPS and bytes limits rewritten every second 1,696, every
/// 250 ms 1,892; `stolen-rig` at a 250 ms interval missed floors in 58 % of
/// windows, 0.3 % with this). Policies keep a margin of their own above an
/// entitlement (5 % for `floor`).
pub const REWRITE_TOLERANCE: f64 = 0.02;

/// Whether a limit in force may stay for the one wanted: the same, or both
/// set and within `tolerance` (a share of the one in force) of each other.
fn close_enough(current: Option<f64>, wanted: Option<f64>, tolerance: f64) -> bool {
    match (current, wanted) {
        (Some(c), Some(w)) => (c - w).abs() <= tolerance * c,
        (c, w) => c == w,
    }
}

/// Which of a tenant's caps a blk-throttle file holds.
type CapField = fn(&Caps) -> Option<f64>;

const V1_LIMITS: [(&str, CapField); 4] = [
    ("blkio.throttle.read_iops_device", |c| c.read_iops),
    ("blkio.throttle.write_iops_device", |c| c.write_iops),
    ("blkio.throttle.read_bps_device", |c| c.read_bps),
    ("blkio.throttle.write_bps_device", |c| c.write_bps),
];

/// The Read and Write counts of `dev` in a v1 `blkio.throttle.io_serviced`
/// or `io_service_bytes` file's text (`MAJ:MIN OP COUNT` lines); a device
/// without lines has done no I/O.
pub fn parse_v1_counts(text: &str, dev: DevId, origin: &Path) -> Result<(u64, u64)> {
    let dev = dev.to_string();
    let (mut read, mut write) = (0u64, 0u64);
    for (n, line) in text.lines().enumerate() {
        let mut f = line.split_whitespace();
        if let (Some(d), Some(op), Some(v)) = (f.next(), f.next(), f.next()) {
            if d != dev {
                continue;
            }
            let v: u64 = v.parse().map_err(|_| {
                HostError::malformed(
                    origin,
                    Some(n + 1),
                    format!("`{line}` is not `MAJ:MIN OP COUNT`"),
                )
            })?;
            match op {
                "Read" => read = v,
                "Write" => write = v,
                _ => {}
            }
        }
    }
    Ok((read, write))
}

/// The limit of `dev` in a v1 `blkio.throttle.*_device` file's text
/// (`MAJ:MIN LIMIT` lines); none when the device has no line or 0. The kernel
/// writes whole numbers: anything else (a fraction, `inf`, `NaN`) is an error
/// rather than a cap the policy would take as real.
pub fn parse_v1_limit(text: &str, dev: DevId, origin: &Path) -> Result<Option<f64>> {
    let dev = dev.to_string();
    for (n, line) in text.lines().enumerate() {
        let mut f = line.split_whitespace();
        if let (Some(d), Some(v)) = (f.next(), f.next()) {
            if d == dev {
                let v: u64 = v.parse().map_err(|_| {
                    HostError::malformed(
                        origin,
                        Some(n + 1),
                        format!("`{line}` is not `MAJ:MIN LIMIT`"),
                    )
                })?;
                return Ok((v > 0).then_some(v as f64));
            }
        }
    }
    Ok(None)
}

/// The largest IOPS limit blk-throttle keeps: it stores IOPS limits in 32
/// bits (v1 and v2), with `u32::MAX` meaning none, and truncates a larger
/// number written to it: 2^32 + 5 IOPS would become a limit of 5.
pub const MAX_IOPS_LIMIT: u64 = u32::MAX as u64 - 1;

/// The smallest limit cgroup v2's `io.max` takes, for IOPS and bytes alike
/// (the kernel's parser keeps a value only above 1).
pub const V2_SMALLEST_LIMIT: u64 = 2;

/// The largest bytes-per-second limit written (4 EiB/s): `u64::MAX` means
/// none, and numbers near it do not survive the trip through an f64.
pub const MAX_BPS_LIMIT: u64 = 1 << 62;

/// Caps as whole numbers the kernel keeps as given: rounded up, and above
/// the kernel's range lowered to its largest limit (which is, in practice,
/// none) rather than wrapped.
pub fn writable(caps: &Caps) -> Caps {
    let caps = caps.rounded();
    let clamp = |v: Option<f64>, max: u64| v.map(|v| v.min(max as f64));
    Caps {
        read_iops: clamp(caps.read_iops, MAX_IOPS_LIMIT),
        write_iops: clamp(caps.write_iops, MAX_IOPS_LIMIT),
        read_bps: clamp(caps.read_bps, MAX_BPS_LIMIT),
        write_bps: clamp(caps.write_bps, MAX_BPS_LIMIT),
    }
}

impl BlkioV1 {
    fn read_rw(&self, path: &Path) -> Result<(u64, u64)> {
        parse_v1_counts(&read_file(path)?, self.dev, path)
    }

    fn read_limit(&self, path: &Path) -> Result<Option<f64>> {
        parse_v1_limit(&read_file(path)?, self.dev, path)
    }
}

impl IoController for BlkioV1 {
    fn version(&self) -> Version {
        Version::V1
    }
    fn root(&self) -> &Path {
        &self.root
    }
    fn device(&self) -> DevId {
        self.dev
    }

    fn read(&self, cgroup: &Path) -> Result<Counters> {
        let dir = self.root.join(cgroup);
        let (read_ios, write_ios) = self.read_rw(&dir.join("blkio.throttle.io_serviced"))?;
        let (read_bytes, write_bytes) =
            self.read_rw(&dir.join("blkio.throttle.io_service_bytes"))?;
        Ok(Counters {
            read_ios,
            write_ios,
            read_bytes,
            write_bytes,
            ..Default::default()
        })
    }

    fn caps(&self, cgroup: &Path) -> Result<Caps> {
        let dir = self.root.join(cgroup);
        Ok(Caps {
            read_iops: self.read_limit(&dir.join(V1_LIMITS[0].0))?,
            write_iops: self.read_limit(&dir.join(V1_LIMITS[1].0))?,
            read_bps: self.read_limit(&dir.join(V1_LIMITS[2].0))?,
            write_bps: self.read_limit(&dir.join(V1_LIMITS[3].0))?,
        })
    }

    fn adjust_caps(&self, cgroup: &Path, caps: &Caps, tolerance: f64) -> Result<()> {
        let dir = self.root.join(cgroup);
        let caps = writable(caps);
        for (file, get) in V1_LIMITS {
            let path = dir.join(file);
            let wanted = get(&caps);
            // Only a limit that changes is written: a write to any of these
            // files restarts the group's slice in both directions
            // ([`REWRITE_TOLERANCE`]). One that cannot be read is written
            // (the write says why not).
            if matches!(self.read_limit(&path), Ok(current) if close_enough(current, wanted, tolerance))
            {
                continue;
            }
            // Writing 0 removes a limit.
            let v = wanted.map(|v| v as u64).unwrap_or(0);
            write_file(&path, &format!("{} {v}", self.dev))?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- v2 ----

/// cgroup v2 `io`: `io.stat` counters, `io.max` limits, `io.weight`.
pub struct IoV2 {
    pub root: PathBuf,
    pub dev: DevId,
}

/// A device's line of a v2 file: its number (from 1) and `key=value` fields.
pub(crate) type V2Line<'t> = (usize, Vec<(&'t str, &'t str)>);

/// The fields of `dev`'s line in a v2 file's text, if it has one.
pub(crate) fn v2_device_fields<'t>(
    text: &'t str,
    dev: DevId,
    origin: &Path,
) -> Result<Option<V2Line<'t>>> {
    let dev = dev.to_string();
    for (n, line) in text.lines().enumerate() {
        let mut words = line.split_whitespace();
        if words.next() == Some(dev.as_str()) {
            let fields = words
                .map(|w| {
                    w.split_once('=').ok_or_else(|| {
                        HostError::malformed(
                            origin,
                            Some(n + 1),
                            format!("`{w}` in `{line}` is not key=value"),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            return Ok(Some((n + 1, fields)));
        }
    }
    Ok(None)
}

/// `dev`'s counters in a v2 `io.stat` file's text; a cgroup that has done no
/// I/O on the device has no line for it.
pub fn parse_v2_stat(text: &str, dev: DevId, origin: &Path) -> Result<Counters> {
    let mut c = Counters::default();
    let Some((line, fields)) = v2_device_fields(text, dev, origin)? else {
        return Ok(c);
    };
    for (k, v) in fields {
        // Only the counters read are parsed: controllers add keys of their
        // own to the line, not all of them whole numbers (io.cost writes
        // `cost.vrate=100.00` on the root's).
        let counter = match k {
            "rbytes" => &mut c.read_bytes,
            "wbytes" => &mut c.write_bytes,
            "rios" => &mut c.read_ios,
            "wios" => &mut c.write_ios,
            _ => continue,
        };
        *counter = v.parse().map_err(|_| {
            HostError::malformed(origin, Some(line), format!("`{k}={v}` is not a counter"))
        })?;
    }
    Ok(c)
}

/// `dev`'s limits in a v2 `io.max` file's text (`max`, and 0 as in v1, are
/// no limit). Limits are whole numbers, as the kernel writes them.
pub fn parse_v2_max(text: &str, dev: DevId, origin: &Path) -> Result<Caps> {
    let mut caps = Caps::NONE;
    let Some((line, fields)) = v2_device_fields(text, dev, origin)? else {
        return Ok(caps);
    };
    for (k, v) in fields {
        let limit = if v == "max" {
            None
        } else {
            let n: u64 = v.parse().map_err(|_| {
                HostError::malformed(origin, Some(line), format!("`{k}={v}` is not a limit"))
            })?;
            (n > 0).then_some(n as f64)
        };
        match k {
            "rbps" => caps.read_bps = limit,
            "wbps" => caps.write_bps = limit,
            "riops" => caps.read_iops = limit,
            "wiops" => caps.write_iops = limit,
            _ => {}
        }
    }
    Ok(caps)
}

impl IoController for IoV2 {
    fn version(&self) -> Version {
        Version::V2
    }
    fn root(&self) -> &Path {
        &self.root
    }
    fn device(&self) -> DevId {
        self.dev
    }

    fn read(&self, cgroup: &Path) -> Result<Counters> {
        let path = self.root.join(cgroup).join("io.stat");
        let text = fs::read_to_string(&path).map_err(|e| v2_io_file_error(&path, e))?;
        parse_v2_stat(&text, self.dev, &path)
    }

    fn caps(&self, cgroup: &Path) -> Result<Caps> {
        let path = self.root.join(cgroup).join("io.max");
        let text = fs::read_to_string(&path).map_err(|e| v2_io_file_error(&path, e))?;
        parse_v2_max(&text, self.dev, &path)
    }

    fn adjust_caps(&self, cgroup: &Path, caps: &Caps, tolerance: f64) -> Result<()> {
        // v2 refuses a limit of 1 (EINVAL; 2 and up are taken, measured on
        // Debian's 6.1): a tenant held at 1 IOPS was left uncapped, its
        // write failing each interval. Held at 2 instead, it is still
        // stopped all but dead, as the policy meant.
        let at_least = |v: Option<f64>| v.map(|x| x.max(V2_SMALLEST_LIMIT as f64));
        let caps = writable(caps);
        let caps = Caps {
            read_iops: at_least(caps.read_iops),
            write_iops: at_least(caps.write_iops),
            read_bps: at_least(caps.read_bps),
            write_bps: at_least(caps.write_bps),
        };
        // One line holds every limit, so one write restarts the slice
        // (v2 runs the same blk-throttle): skipped when all are close.
        // A limit that cannot be read is written (the write says why not).
        if let Ok(current) = self.caps(cgroup) {
            if V1_LIMITS
                .iter()
                .all(|(_, get)| close_enough(get(&current), get(&caps), tolerance))
            {
                return Ok(());
            }
        }
        let f = |v: Option<f64>| {
            v.map(|x| (x as u64).to_string())
                .unwrap_or_else(|| "max".into())
        };
        let line = format!(
            "{} rbps={} wbps={} riops={} wiops={}",
            self.dev,
            f(caps.read_bps),
            f(caps.write_bps),
            f(caps.read_iops),
            f(caps.write_iops)
        );
        let path = self.root.join(cgroup).join("io.max");
        write_existing(&path, &line).map_err(|e| v2_io_file_error(&path, e))
    }
}

/// The error for a v2 `io.*` file `path` that could not be used: a file
/// missing from a cgroup that is there means its parent does not enable the
/// io controller for its children, which the error says and where to.
fn v2_io_file_error(path: &Path, e: std::io::Error) -> HostError {
    let cgroup = path.parent().filter(|c| c.is_dir());
    match cgroup {
        Some(cgroup) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = cgroup.parent().unwrap_or(cgroup);
            HostError::not_usable(
                path.display(),
                format!(
                    "missing: the io controller is not enabled for this cgroup (add `+io` to {})",
                    parent.join("cgroup.subtree_control").display()
                ),
            )
        }
        _ => HostError::io(path, e),
    }
}

// ------------------------------------------------------- cgroup lifecycle ----

/// Creates a cgroup (and its parents) under the root.
pub fn create(root: &Path, cgroup: &Path) -> Result<PathBuf> {
    let dir = root.join(cgroup);
    fs::create_dir_all(&dir).map_err(|e| HostError::io(&dir, e))?;
    Ok(dir)
}

/// On cgroup v2, gives `cgroup`'s children the io controller (`+io` in
/// its `cgroup.subtree_control`), as a parent must before they have
/// `io.max`, `io.stat` or `io.weight`; v1 has nothing to enable.
pub fn enable_io_for_children(root: &Path, cgroup: &Path) -> Result<()> {
    if detect(root)? == Version::V1 {
        return Ok(());
    }
    write_file(&root.join(cgroup).join("cgroup.subtree_control"), "+io")
}

/// Waits (up to `timeout`) until the cgroup and its children have no
/// processes left, then removes them. Processes that exit still leave the
/// cgroup a moment later, so an immediate rmdir can fail with EBUSY. If it
/// still cannot, the error names the processes left in it.
pub fn remove_when_empty(root: &Path, cgroup: &Path, timeout: std::time::Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match remove_tree(root, cgroup) {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => {
                let left = processes_in(&root.join(cgroup));
                if left.is_empty() {
                    return Err(e);
                }
                return Err(HostError::NotUsable {
                    object: root.join(cgroup).display().to_string(),
                    problem: format!(
                        "not removed after {timeout:?} ({e}): processes left in it: {}",
                        left.join(", ")
                    ),
                });
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

/// The processes in a cgroup and its children, as `PID (command)`.
fn processes_in(dir: &Path) -> Vec<String> {
    pids_in(dir)
        .into_iter()
        .map(|pid| {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("{pid} ({})", comm.trim())
        })
        .collect()
}

/// The PIDs in a cgroup and its children.
fn pids_in(dir: &Path) -> Vec<i32> {
    let mut out: Vec<i32> = fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|pid| pid.parse().ok())
        .collect();
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten().filter(|e| e.path().is_dir()) {
            out.extend(pids_in(&e.path()));
        }
    }
    out
}

/// Sends SIGKILL to every process in a cgroup its caller made and put its
/// own processes in, and their children with them; returns how many. For a
/// tool's process killed past its grace whose own children stay behind: fio
/// forks a process per job, and one whose parent died while the jobs were
/// starting (a TCG guest, where that takes seconds) waited there for good,
/// keeping the cgroup busy.
pub fn kill_processes_in(root: &Path, cgroup: &Path) -> usize {
    let pids = pids_in(&root.join(cgroup));
    for &pid in &pids {
        if let Some(pid) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
    pids.len()
}

/// Removes a cgroup and its children, deepest first. The cgroups must have no
/// processes left; an already-removed cgroup is not an error.
pub fn remove_tree(root: &Path, cgroup: &Path) -> Result<()> {
    let dir = root.join(cgroup);
    if !dir.exists() {
        return Ok(());
    }
    let entries = fs::read_dir(&dir).map_err(|e| HostError::io(&dir, e))?;
    for e in entries.flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            remove_tree(root, &cgroup.join(e.file_name()))?;
        }
    }
    match fs::remove_dir(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(HostError::io(&dir, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEV: DevId = DevId { major: 7, minor: 0 };

    fn origin() -> &'static Path {
        Path::new("blkio.throttle.read_iops_device")
    }

    #[test]
    fn a_cgroup_that_stays_busy_is_an_error_naming_its_processes() {
        // A directory with files stands for a cgroup rmdir refuses.
        let root = tempfile::tempdir().unwrap();
        let child = root.path().join("bench/tenant");
        fs::create_dir_all(&child).unwrap();
        fs::write(
            child.join("cgroup.procs"),
            format!("{}\n", std::process::id()),
        )
        .unwrap();
        let e = remove_when_empty(
            root.path(),
            Path::new("bench"),
            std::time::Duration::from_millis(50),
        )
        .unwrap_err()
        .to_string();
        let me = format!("{} (", std::process::id());
        assert!(
            e.contains("processes left in it: ") && e.contains(&me),
            "{e}"
        );
    }

    #[test]
    fn v1_limits_are_whole_numbers_and_zero_is_none() {
        assert_eq!(
            parse_v1_limit("7:0 5000\n", DEV, origin()).unwrap(),
            Some(5000.0)
        );
        assert_eq!(parse_v1_limit("7:0 0\n", DEV, origin()).unwrap(), None);
        assert_eq!(parse_v1_limit("8:0 10\n", DEV, origin()).unwrap(), None);
        // A float parser took these as caps of infinity and NaN.
        for bad in ["7:0 inf", "7:0 NaN", "7:0 1.5"] {
            let e = parse_v1_limit(bad, DEV, origin()).unwrap_err().to_string();
            assert!(e.contains("read_iops_device:1"), "{e}");
        }
    }

    #[test]
    fn v1_writes_only_the_limits_that_change() {
        // Each write restarts the group's throttle slice: an unchanged
        // limit must not be written again.
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("t");
        fs::create_dir(&dir).unwrap();
        let old = std::time::SystemTime::UNIX_EPOCH;
        let initial = ["7:0 100\n", "", "7:0 409600\n", ""];
        for ((file, _), text) in V1_LIMITS.iter().zip(initial) {
            let f = fs::File::create(dir.join(file)).unwrap();
            std::io::Write::write_all(&mut &f, text.as_bytes()).unwrap();
            f.set_modified(old).unwrap();
        }
        let v1 = BlkioV1 {
            root: root.path().to_path_buf(),
            dev: DEV,
        };
        // The IOPS limit within 2 % (kept), the bytes limit doubled, no
        // write limits as before.
        v1.adjust_caps(
            Path::new("t"),
            &Caps {
                read_iops: Some(102.0),
                read_bps: Some(819200.0),
                ..Caps::NONE
            },
            REWRITE_TOLERANCE,
        )
        .unwrap();
        let touched = |file: &str| fs::metadata(dir.join(file)).unwrap().modified().unwrap() != old;
        assert!(!touched("blkio.throttle.read_iops_device"));
        assert!(!touched("blkio.throttle.write_iops_device"));
        assert!(!touched("blkio.throttle.write_bps_device"));
        assert!(touched("blkio.throttle.read_bps_device"));
        assert_eq!(
            v1.caps(Path::new("t")).unwrap(),
            Caps {
                read_iops: Some(100.0),
                read_bps: Some(819200.0),
                ..Caps::NONE
            }
        );
        // Past the tolerance, or a limit removed: written.
        let iops = |n: f64| Caps {
            read_iops: Some(n),
            ..Caps::NONE
        };
        v1.adjust_caps(Path::new("t"), &iops(103.0), REWRITE_TOLERANCE)
            .unwrap();
        assert_eq!(v1.caps(Path::new("t")).unwrap(), iops(103.0));
        // Set exactly (an original restored): any change is written.
        v1.set_caps(Path::new("t"), &iops(104.0)).unwrap();
        assert_eq!(v1.caps(Path::new("t")).unwrap(), iops(104.0));
    }

    #[test]
    fn v2_rewrites_io_max_only_when_a_limit_moves_past_the_tolerance() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("t");
        fs::create_dir(&dir).unwrap();
        let io_max = dir.join("io.max");
        fs::write(&io_max, "7:0 rbps=max wbps=max riops=1000 wiops=max\n").unwrap();
        let v2 = IoV2 {
            root: root.path().to_path_buf(),
            dev: DEV,
        };
        let iops = |n: f64| Caps {
            read_iops: Some(n),
            ..Caps::NONE
        };
        let adjust = |n| v2.adjust_caps(Path::new("t"), &iops(n), REWRITE_TOLERANCE);
        adjust(1015.0).unwrap();
        assert_eq!(v2.caps(Path::new("t")).unwrap(), iops(1000.0));
        adjust(1030.0).unwrap();
        assert_eq!(v2.caps(Path::new("t")).unwrap(), iops(1030.0));
        v2.set_caps(Path::new("t"), &iops(1031.0)).unwrap();
        assert_eq!(v2.caps(Path::new("t")).unwrap(), iops(1031.0));
        // A file that cannot be read is written all the same.
        fs::write(&io_max, "7:0 riops=garbage\n").unwrap();
        adjust(1031.0).unwrap();
        assert_eq!(v2.caps(Path::new("t")).unwrap(), iops(1031.0));
        // v2 takes no limit of 1: the least written is 2.
        v2.set_caps(Path::new("t"), &iops(0.4)).unwrap();
        assert_eq!(
            fs::read_to_string(&io_max).unwrap(),
            "7:0 rbps=max wbps=max riops=2 wiops=max"
        );
        // A file that is gone is not made (cgroupfs refuses a create with
        // EACCES): the error says the file is missing and why.
        fs::remove_file(&io_max).unwrap();
        let e = adjust(500.0).unwrap_err().to_string();
        assert!(
            !io_max.exists() && e.contains("io.max") && e.contains("+io"),
            "{e}"
        );
    }

    #[test]
    fn a_v2_cgroup_without_io_says_which_parent_to_enable_it_in() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("noio/t1")).unwrap();
        let v2 = IoV2 {
            root: root.path().to_path_buf(),
            dev: DEV,
        };
        for e in [
            v2.caps(Path::new("noio/t1")).unwrap_err().to_string(),
            v2.read(Path::new("noio/t1")).unwrap_err().to_string(),
        ] {
            let parent = root.path().join("noio/cgroup.subtree_control");
            assert!(
                e.contains("noio/t1/io.")
                    && e.contains(&format!("add `+io` to {}", parent.display())),
                "{e}"
            );
        }
        // A cgroup that is gone is an ordinary missing file.
        let gone = v2.caps(Path::new("gone")).unwrap_err().to_string();
        assert!(!gone.contains("+io"), "{gone}");
    }

    #[test]
    fn v2_stat_reads_its_counters_beside_other_controllers_keys() {
        // The root's line on a kernel with io.cost enabled (its keys and
        // their formats from block/blk-iocost.c).
        let line = "7:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0 \
                    cost.vrate=100.00 cost.usage=1234 cost.wait=0 cost.indebt=0 cost.indelay=0\n";
        let c = parse_v2_stat(line, DEV, Path::new("io.stat")).unwrap();
        assert_eq!(
            (c.read_bytes, c.write_bytes, c.read_ios, c.write_ios),
            (4096, 8192, 1, 2)
        );
        let e = parse_v2_stat("7:0 rbytes=1.5 rios=1\n", DEV, Path::new("io.stat"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("io.stat:1") && e.contains("rbytes=1.5"), "{e}");
    }

    #[test]
    fn v2_max_reads_max_and_zero_as_no_limit() {
        let caps =
            parse_v2_max("7:0 rbps=max wbps=0 riops=300 wiops=max\n", DEV, origin()).unwrap();
        assert_eq!(
            caps,
            Caps {
                read_iops: Some(300.0),
                ..Caps::NONE
            }
        );
        let e = parse_v2_max("9:1 riops=1\n7:0 riops=NaN\n", DEV, Path::new("io.max"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("io.max:2") && e.contains("riops=NaN"), "{e}");
    }
}
