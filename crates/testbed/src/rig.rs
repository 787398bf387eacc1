//! The test rig: a real block device of known capacity.
//!
//! A loop device straight over a file is CPU-bound on a small machine, so its
//! capacity moves with CPU noise. The rig puts qemu-storage-daemon's throttle
//! group in front of a sparse file on tmpfs, exports it through FUSE, and
//! attaches a loop device with direct I/O to the exported file: a block device
//! that serves a fixed number of IOPS (and optionally bytes/s, and size-weighted
//! IOPS through QEMU's `iops-size`) in FIFO order, whatever the CPU does.
//!
//! Every rig keeps its state in a directory under the state root (default
//! `/run/iofloor/rigs`), written before each resource is created, so
//! `down` removes everything a rig made, also after a crash.

use iofloor_core::ValidationError;
use iofloor_host::error::{HostError, Result};
use iofloor_host::qmp::Qmp;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub const DEFAULT_STATE_ROOT: &str = "/run/iofloor/rigs";

/// The capacity of a rig.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RigSpec {
    /// I/Os per second (QEMU `iops-total`).
    pub iops: u64,
    /// Bytes per second (QEMU `bps-total`), if limited.
    pub bps: Option<u64>,
    /// With it, an I/O of n × this size counts as n I/Os (QEMU `iops-size`).
    pub size_unit: Option<u64>,
    /// Size of the device.
    pub size: u64,
}

impl RigSpec {
    /// The same device doing `factor` times as much (a scenario's
    /// `device.change`): its rates scaled, at least 1 each.
    pub fn scaled(&self, factor: f64) -> RigSpec {
        let scale = |v: u64| ((v as f64 * factor).round() as u64).max(1);
        RigSpec {
            iops: scale(self.iops),
            bps: self.bps.map(scale),
            ..*self
        }
    }

    /// Checks the spec; the keys of its errors are the `rig up` flags' names.
    pub fn validate(&self) -> std::result::Result<(), ValidationError> {
        if self.iops == 0 || self.iops > 10_000_000 {
            return Err(ValidationError::new(
                "--iops",
                format!("must be 1..10000000, got {}", self.iops),
            ));
        }
        if self.bps == Some(0) {
            return Err(ValidationError::new("--bps", "must be positive"));
        }
        if let Some(u) = self.size_unit {
            if u < 512 || u % 512 != 0 {
                return Err(ValidationError::new(
                    "--size-unit",
                    format!("must be a multiple of 512, got {u}"),
                ));
            }
        }
        if self.size < 1 << 20 {
            return Err(ValidationError::new("--size", "must be at least 1MiB"));
        }
        Ok(())
    }

    /// QEMU throttle-group limits for this spec.
    pub fn limits(&self) -> serde_json::Value {
        let mut l = serde_json::json!({ "iops-total": self.iops });
        if let Some(b) = self.bps {
            l["bps-total"] = b.into();
        }
        if let Some(u) = self.size_unit {
            l["iops-size"] = u.into();
        }
        l
    }
}

/// What a rig made, recorded as it is made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rig {
    pub dir: PathBuf,
    pub spec: RigSpec,
    /// For a VM path: the shared block device QEMU's block layer sits on
    /// (instead of a file on tmpfs).
    #[serde(default)]
    pub over_device: Option<PathBuf>,
    pub backing: PathBuf,
    pub mountpoint: PathBuf,
    pub socket: PathBuf,
    pub qsd_pid: Option<u32>,
    pub device: Option<PathBuf>,
}

pub(crate) fn which(program: &'static str) -> Result<()> {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
        .unwrap_or(false);
    if found {
        Ok(())
    } else {
        Err(HostError::ToolMissing {
            program,
            package: match program {
                "qemu-storage-daemon" => "qemu-system-common",
                "ip" => "iproute2",
                "etcd" => "etcd-server",
                "etcdctl" => "etcd-client",
                _ => "util-linux",
            },
        })
    }
}

pub(crate) fn run(cmd: &mut Command) -> Result<String> {
    let what = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| HostError::Command {
        what: what.clone(),
        message: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(HostError::Command {
            what,
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether `path` is a mount point now. /proc/mounts lists resolved
/// absolute paths with blanks and backslashes escaped as octal, so `path` is
/// resolved and the entries unescaped before comparing: otherwise a relative
/// path never matches (the demo's default `results/demo` did not), and a path
/// with a space would not either.
pub(crate) fn is_mounted(path: &Path) -> bool {
    let Some(target) = resolved(path) else {
        return false;
    };
    std::fs::read_to_string("/proc/mounts")
        .map(|m| {
            m.lines()
                .filter_map(|l| l.split_whitespace().nth(1))
                .any(|p| Path::new(&unescape_mount_path(p)) == target)
        })
        .unwrap_or(false)
}

/// `path` as the kernel shows a mount point: absolute, with `..` and
/// symlinks of its directory resolved. Only the directory is resolved, never
/// the mount point itself, which may be a dead FUSE mount.
fn resolved(path: &Path) -> Option<PathBuf> {
    let abs = std::path::absolute(path).ok()?;
    match (abs.parent(), abs.file_name()) {
        (Some(dir), Some(name)) => Some(std::fs::canonicalize(dir).ok()?.join(name)),
        _ => Some(abs),
    }
}

/// Undoes the kernel's octal escapes in /proc/mounts (`\040` space,
/// `\011` tab, `\012` newline, `\134` backslash).
fn unescape_mount_path(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A path as a QEMU option value: a comma would end the value, so it is doubled.
pub(crate) fn qemu_value(path: &Path) -> String {
    path.display().to_string().replace(',', ",,")
}

fn process_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// True if `pid` runs `program` with a path in `dir` on its command line:
/// only such a process is ever killed, never a reused PID.
pub(crate) fn is_ours(pid: u32, program: &str, dir: &Path) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            let text = String::from_utf8_lossy(&c);
            text.contains(program) && text.contains(dir.to_string_lossy().as_ref())
        })
        .unwrap_or(false)
}

/// Stops a process this code started (`program` with files in `dir`):
/// SIGTERM, then SIGKILL after 5 s. A PID now used by someone else is left
/// alone.
pub(crate) fn stop_process(pid: Option<u32>, program: &str, dir: &Path) {
    let Some(pid) = pid.filter(|p| is_ours(*p, program, dir)) else {
        return;
    };
    let Some(target) = rustix::process::Pid::from_raw(pid as i32) else {
        return;
    };
    let _ = rustix::process::kill_process(target, rustix::process::Signal::TERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    while process_alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if process_alive(pid) {
        let _ = rustix::process::kill_process(target, rustix::process::Signal::KILL);
    }
}

/// Detaches the loop devices over `file`: `recorded` if the kernel still
/// shows it backed by that file (true even when a FUSE mount under it is
/// dead, e.g. after qemu-storage-daemon was killed), and any other one
/// `losetup -j` finds.
pub(crate) fn detach_loops_over(file: &Path, recorded: Option<&Path>) -> Result<()> {
    let mut first_error = None;
    if let Some(dev) = recorded {
        let name = dev
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let backing = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
            .unwrap_or_default();
        if backing
            .trim_start()
            .starts_with(file.to_string_lossy().as_ref())
        {
            if let Err(e) = run(Command::new("losetup").arg("-d").arg(dev)) {
                first_error.get_or_insert(e);
            }
        }
    }
    if file.exists() {
        if let Ok(list) = run(Command::new("losetup").arg("-j").arg(file)) {
            for line in list.lines() {
                if let Some(dev) = line.split(':').next().filter(|d| d.starts_with("/dev/")) {
                    if let Err(e) = run(Command::new("losetup").arg("-d").arg(dev)) {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Waits up to 10 s for a FUSE export to appear at `mountpoint`.
pub(crate) fn wait_mounted(mountpoint: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !is_mounted(mountpoint) {
        if Instant::now() > deadline {
            return Err(HostError::Timeout {
                what: format!("the FUSE export {}", mountpoint.display()),
                secs: 10,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Reads the PID qemu-storage-daemon wrote with `--pidfile`.
pub(crate) fn read_pidfile(pidfile: &Path) -> Result<u32> {
    let text = std::fs::read_to_string(pidfile).map_err(|e| HostError::io(pidfile, e))?;
    text.trim()
        .parse()
        .map_err(|_| HostError::malformed(pidfile, Some(1), "not a pid"))
}

/// Sets the limits of throttle group `group` of the qemu-storage-daemon
/// behind `socket` (QMP `qom-set`): the capacity changes while in use.
pub(crate) fn set_group_limits(socket: &Path, group: &str, spec: &RigSpec) -> Result<()> {
    spec.validate()?;
    let mut qmp = Qmp::connect(socket, Duration::from_secs(5))?;
    qmp.execute(
        "qom-set",
        Some(serde_json::json!({"path": group, "property": "limits", "value": spec.limits()})),
    )?;
    Ok(())
}

impl Rig {
    fn save(&self) -> Result<()> {
        let path = self.dir.join("state.json");
        let text = serde_json::to_string_pretty(self).expect("rig state serialises");
        std::fs::write(&path, text).map_err(|e| HostError::io(&path, e))
    }

    /// Creates a rig under `state_root` and returns it with its device path.
    /// On any failure, what was made so far is removed again.
    pub fn up(spec: RigSpec, state_root: &Path) -> Result<Rig> {
        spec.validate()?;
        which("qemu-storage-daemon")?;
        which("losetup")?;
        if !Path::new("/dev/fuse").exists() {
            return Err(HostError::not_usable(
                "/dev/fuse",
                "is missing: FUSE is needed for the rig",
            ));
        }
        let state_root =
            &std::path::absolute(state_root).map_err(|e| HostError::io(state_root, e))?;
        std::fs::create_dir_all(state_root).map_err(|e| HostError::io(state_root, e))?;
        let dir = new_state_dir(state_root, "rig")?;
        let rig = Rig {
            over_device: None,
            backing: dir.join("backing.img"),
            mountpoint: dir.join("device.img"),
            socket: dir.join("qmp.sock"),
            dir,
            spec,
            qsd_pid: None,
            device: None,
        };
        rig.launch()
    }

    /// Records the rig, then starts it; on failure removes what was made.
    fn launch(mut self) -> Result<Rig> {
        self.save()?;
        match self.start() {
            Ok(()) => Ok(self),
            Err(e) => {
                let _ = self.down();
                Err(e)
            }
        }
    }

    /// A VM's I/O path over a shared block device: QEMU's block layer with a
    /// throttle group (no limit until one is set over QMP) on top of `device`
    /// with direct I/O, exported through FUSE and seen on the host as a loop
    /// device, where the VM's fio runs. Stats come from that loop device, limits
    /// from the group: see `qmp_backend::QmpTarget::Group`.
    pub fn up_vm_path(device: &Path, state_root: &Path) -> Result<Rig> {
        which("qemu-storage-daemon")?;
        which("losetup")?;
        let state_root =
            &std::path::absolute(state_root).map_err(|e| HostError::io(state_root, e))?;
        std::fs::create_dir_all(state_root).map_err(|e| HostError::io(state_root, e))?;
        let dir = new_state_dir(state_root, "rig")?;
        let rig = Rig {
            over_device: Some(device.to_path_buf()),
            backing: device.to_path_buf(),
            mountpoint: dir.join("vm-disk.img"),
            socket: dir.join("qmp.sock"),
            dir,
            spec: RigSpec {
                iops: 0,
                bps: None,
                size_unit: None,
                size: 0,
            },
            qsd_pid: None,
            device: None,
        };
        rig.launch()
    }

    fn start(&mut self) -> Result<()> {
        let file_node = match &self.over_device {
            Some(dev) => format!(
                "driver=host_device,node-name=f0,filename={},cache.direct=on,aio=native",
                qemu_value(dev)
            ),
            None => {
                let backing = std::fs::File::create(&self.backing)
                    .map_err(|e| HostError::io(&self.backing, e))?;
                backing
                    .set_len(self.spec.size)
                    .map_err(|e| HostError::io(&self.backing, e))?;
                format!(
                    "driver=file,node-name=f0,filename={},aio=threads",
                    qemu_value(&self.backing)
                )
            }
        };
        std::fs::File::create(&self.mountpoint).map_err(|e| HostError::io(&self.mountpoint, e))?;
        let pidfile = self.dir.join("qsd.pid");
        let mut group = "throttle-group,id=dev".to_string();
        if self.spec.iops > 0 {
            group.push_str(&format!(",x-iops-total={}", self.spec.iops));
        }
        if let Some(b) = self.spec.bps {
            group.push_str(&format!(",x-bps-total={b}"));
        }
        if let Some(u) = self.spec.size_unit {
            group.push_str(&format!(",x-iops-size={u}"));
        }
        run(Command::new("qemu-storage-daemon")
            .arg("--blockdev")
            .arg(file_node)
            .arg("--object")
            .arg(group)
            .arg("--blockdev")
            .arg("driver=throttle,node-name=t0,throttle-group=dev,file=f0")
            .arg("--export")
            .arg(format!(
                "type=fuse,id=e0,node-name=t0,mountpoint={},writable=on",
                qemu_value(&self.mountpoint)
            ))
            .arg("--chardev")
            .arg(format!(
                "socket,path={},server=on,wait=off,id=c0",
                qemu_value(&self.socket)
            ))
            .arg("--monitor")
            .arg("chardev=c0")
            .arg("--pidfile")
            .arg(&pidfile)
            .arg("--daemonize"))?;
        self.qsd_pid = Some(read_pidfile(&pidfile)?);
        self.save()?;
        wait_mounted(&self.mountpoint)?;
        let device = run(Command::new("losetup")
            .args(["-f", "--show", "--direct-io=on"])
            .arg(&self.mountpoint))?;
        self.device = Some(PathBuf::from(device));
        self.save()
    }

    /// Changes the rig's capacity live and records it, so `rig list` shows
    /// what it does now (a write cliff, a neighbour host, as nobody tells
    /// the tenants).
    pub fn change_capacity(&mut self, spec: RigSpec) -> Result<()> {
        self.set_limits(&spec)?;
        self.spec = spec;
        self.save()
    }

    /// Changes the rig's capacity live (QMP `qom-set` of the group's limits).
    pub fn set_limits(&self, spec: &RigSpec) -> Result<()> {
        set_group_limits(&self.socket, "dev", spec)
    }

    /// Removes everything this rig made, in reverse order; tolerates parts
    /// already gone.
    pub fn down(&self) -> Result<()> {
        let mut first_error = None;
        let mut keep = |r: Result<()>| {
            if let Err(e) = r {
                first_error.get_or_insert(e);
            }
        };
        keep(detach_loops_over(&self.mountpoint, self.device.as_deref()));
        stop_process(self.qsd_pid, "qemu-storage-daemon", &self.dir);
        if is_mounted(&self.mountpoint) {
            keep(run(Command::new("umount").arg("-l").arg(&self.mountpoint)).map(|_| ()));
        }
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => keep(Err(HostError::io(&self.dir, e))),
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Every rig recorded under `state_root`.
    pub fn list(state_root: &Path) -> Result<Vec<Rig>> {
        read_states(state_root)
    }

    /// Removes every rig under `state_root`; returns how many.
    pub fn down_all(state_root: &Path) -> Result<usize> {
        down_each(&Rig::list(state_root)?, Rig::down)
    }
}

/// Every `state.json` in the directories under `state_root` (none if it
/// does not exist): how `rig` and `cluster` find what they made.
pub(crate) fn read_states<T: serde::de::DeserializeOwned>(state_root: &Path) -> Result<Vec<T>> {
    let Ok(entries) = std::fs::read_dir(state_root) else {
        return Ok(Vec::new());
    };
    let mut states = Vec::new();
    for e in entries.flatten() {
        let state = e.path().join("state.json");
        if let Ok(text) = std::fs::read_to_string(&state) {
            states.push(parse_state(&state, &text)?);
        }
    }
    Ok(states)
}

/// A `state.json`'s text, read from `state`.
pub(crate) fn parse_state<T: serde::de::DeserializeOwned>(state: &Path, text: &str) -> Result<T> {
    serde_json::from_str(text)
        .map_err(|err| HostError::malformed(state, Some(err.line()), err.to_string()))
}

/// Takes down each of `made`, going on past failures; the first error, or
/// how many there were.
pub(crate) fn down_each<T>(made: &[T], down: impl Fn(&T) -> Result<()>) -> Result<usize> {
    let mut first_error = None;
    for m in made {
        if let Err(e) = down(m) {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(made.len()), Err)
}

/// A new directory `KIND-<pid>-<n>` under `root` (`rig`, `guest`): one
/// test bed's state.
pub(crate) fn new_state_dir(root: &Path, kind: &str) -> Result<PathBuf> {
    for n in 0..1000 {
        let dir = root.join(format!("{kind}-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(HostError::io(&dir, e)),
        }
    }
    Err(HostError::not_usable(
        root.display(),
        format!("no free {kind} directory name"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_are_unescaped_as_the_kernel_escapes_them() {
        assert_eq!(
            unescape_mount_path(r"/run/a\040b/device.img"),
            "/run/a b/device.img"
        );
        assert_eq!(unescape_mount_path(r"/x\134y\011z"), "/x\\y\tz");
        assert_eq!(unescape_mount_path(r"/plain\9"), r"/plain\9");
    }

    #[test]
    fn a_relative_path_is_compared_as_absolute() {
        assert!(is_mounted(Path::new("/proc")));
        // The same mount point written relative to the working directory.
        let depth = std::env::current_dir().unwrap().components().count() - 1;
        let relative = format!("{}proc", "../".repeat(depth));
        assert!(is_mounted(Path::new(&relative)), "{relative}");
    }

    #[test]
    fn commas_in_paths_survive_qemu_options() {
        assert_eq!(qemu_value(Path::new("/tmp/a,b/x.img")), "/tmp/a,,b/x.img");
    }
}
