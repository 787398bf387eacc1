//! A libvirt to test against: the system's libvirtd (started here, with its
//! log daemon, when none runs, and stopped again by the PIDs started), and
//! throwaway transient domains booting the project's guest image
//! (scripts/guest-image.sh) under TCG, one virtio disk per file or block
//! device given, each read by the guest with O_DIRECT forever. Managed with
//! `virsh`, so the backend under test is not also the tool checking it.

use iofloor_host::error::{HostError, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The system libvirtd's socket.
pub const SOCKET: &str = "/run/libvirt/libvirt-sock";

fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| HostError::Command {
            what: program.to_string(),
            message: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(HostError::Command {
            what: format!("{program} {}", args.join(" ")),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `virsh -c qemu:///system ARGS`.
pub fn virsh(args: &[&str]) -> Result<String> {
    let mut all = vec!["-c", iofloor_host::backends::libvirt::DEFAULT_URI];
    all.extend_from_slice(args);
    run("virsh", &all)
}

fn answering(socket: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket).is_ok()
}

/// A daemon this process started, by PID, with the program it must be.
struct Started {
    pid: u32,
    program: &'static str,
}

/// The system libvirtd, running for as long as this lives. One that was
/// already running is used and left alone.
pub struct Daemon {
    started: Vec<Started>,
    /// Where the PID files of the daemons started go; removed on drop.
    dir: PathBuf,
    /// The `machine` cgroups (libvirt's partition for its domains, made in
    /// every controller the first time a domain starts) that were there
    /// before this daemon: the others are removed with it.
    machine_cgroups_before: Vec<PathBuf>,
}

/// libvirt's cgroup partition for its domains, in each mounted controller.
fn machine_cgroups() -> Vec<PathBuf> {
    std::fs::read_dir(CGROUP_MOUNTS)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join(MACHINE_PARTITION))
        .filter(|p| p.is_dir())
        .collect()
}

const CGROUP_MOUNTS: &str = "/sys/fs/cgroup";
const MACHINE_PARTITION: &str = "machine";

impl Daemon {
    pub fn ensure() -> Result<Daemon> {
        let dir = std::env::temp_dir().join(format!("iofloor-libvirtd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| HostError::io(&dir, e))?;
        let mut daemon = Daemon {
            started: Vec::new(),
            dir,
            machine_cgroups_before: machine_cgroups(),
        };
        if answering(Path::new(SOCKET)) {
            return Ok(daemon);
        }
        // libvirtd hands QEMU's output to virtlogd.
        if !answering(Path::new("/run/libvirt/virtlogd-sock")) {
            daemon.start("virtlogd", "/run/libvirt/virtlogd-sock")?;
        }
        daemon.start("libvirtd", SOCKET)?;
        Ok(daemon)
    }

    fn start(&mut self, program: &'static str, socket: &str) -> Result<()> {
        let pidfile = self.dir.join(format!("{program}.pid"));
        let pidfile_arg = pidfile.display().to_string();
        // A socket a killed daemon left behind refuses connections; the
        // daemon replaces it.
        run(program, &["-d", "-p", &pidfile_arg])?;
        let pid: u32 = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .ok_or_else(|| HostError::Command {
                what: program.into(),
                message: format!("no PID in {}", pidfile.display()),
            })?;
        self.started.push(Started { pid, program });
        let since = Instant::now();
        while !answering(Path::new(socket)) {
            if since.elapsed() > Duration::from_secs(30) {
                return Err(HostError::Timeout {
                    what: format!("{program} answering on {socket}"),
                    secs: 30,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Stops and starts again the libvirtd this process started (a
    /// restart, as a package upgrade does it); running domains survive.
    pub fn restart_libvirtd(&mut self) -> Result<()> {
        let Some(i) = self.started.iter().position(|s| s.program == "libvirtd") else {
            return Err(HostError::Command {
                what: "restarting libvirtd".into(),
                message: "this test did not start it (one was already running)".into(),
            });
        };
        let s = self.started.remove(i);
        stop(&s);
        let pidfile = self.dir.join("libvirtd.pid");
        let _ = std::fs::remove_file(&pidfile);
        self.start("libvirtd", SOCKET)
    }
}

/// SIGTERM to a daemon we started, if the PID is still that program, and a
/// wait for it to go.
fn stop(s: &Started) {
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", s.pid)).unwrap_or_default();
    if comm.trim() != s.program {
        return;
    }
    let _ = Command::new("kill").arg(s.pid.to_string()).status();
    let since = Instant::now();
    while Path::new(&format!("/proc/{}", s.pid)).exists()
        && since.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // libvirtd before the log daemon it writes to.
        for s in self.started.iter().rev() {
            stop(s);
        }
        // A libvirtd this test started leaves its (empty) partition behind;
        // one that was already running owns it.
        if self.started.iter().any(|s| s.program == "libvirtd") {
            for made in machine_cgroups()
                .into_iter()
                .filter(|p| !self.machine_cgroups_before.contains(p))
            {
                let controller = made.parent().expect("a controller's mount point");
                if let Err(e) =
                    iofloor_host::cgroup::remove_tree(controller, Path::new(MACHINE_PARTITION))
                {
                    eprintln!("warning: libvirt's {} left: {e}", made.display());
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A transient TCG domain; destroyed when dropped.
pub struct Domain {
    pub name: String,
    pub uuid: String,
    pub console: PathBuf,
}

impl Domain {
    /// Boots `name` with one virtio disk per path (`vda`, `vdb`, ...): a
    /// regular file or a block device. Returns once the guest's load runs.
    pub fn boot(name: &str, dir: &Path, disks: &[PathBuf]) -> Result<Domain> {
        let image = crate::guest::image_dir();
        let console = dir.join(format!("{name}.console"));
        let mut devices = String::new();
        for (i, disk) in disks.iter().enumerate() {
            let target = format!("vd{}", (b'a' + i as u8) as char);
            let block = std::fs::metadata(disk)
                .map(|m| {
                    use std::os::unix::fs::FileTypeExt;
                    m.file_type().is_block_device()
                })
                .unwrap_or(false);
            let (kind, source) = if block {
                ("block", format!("<source dev='{}'/>", disk.display()))
            } else {
                ("file", format!("<source file='{}'/>", disk.display()))
            };
            devices.push_str(&format!(
                "<disk type='{kind}' device='disk'><driver name='qemu' type='raw' cache='none' io='native'/>{source}<target dev='{target}' bus='virtio'/></disk>\n"
            ));
        }
        let xml = format!(
            "<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>console=ttyS0 quiet panic=-1</cmdline>
  </os>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    {devices}
    <serial type='file'><source path='{console}'/><target port='0'/></serial>
    <memballoon model='none'/>
  </devices>
</domain>",
            kernel = image.join("vmlinuz").display(),
            initrd = image.join("initramfs.gz").display(),
            console = console.display(),
        );
        let file = dir.join(format!("{name}.xml"));
        std::fs::write(&file, xml).map_err(|e| HostError::io(&file, e))?;
        virsh(&["create", &file.display().to_string()])?;
        let uuid = virsh(&["domuuid", name])?.trim().to_string();
        let domain = Domain {
            name: name.to_string(),
            uuid,
            console,
        };
        let since = Instant::now();
        let wanted = disks.len();
        loop {
            let text = std::fs::read_to_string(&domain.console).unwrap_or_default();
            if text.matches("iofloor-guest: load running").count() >= wanted {
                return Ok(domain);
            }
            if since.elapsed() > Duration::from_secs(120) {
                return Err(HostError::Command {
                    what: format!("booting domain {name}"),
                    message: format!("its load did not start in 120 s; console:\n{text}"),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn suspend(&self) -> Result<()> {
        virsh(&["suspend", &self.name]).map(|_| ())
    }

    pub fn resume(&self) -> Result<()> {
        virsh(&["resume", &self.name]).map(|_| ())
    }

    /// A disk's limits as `virsh blkdeviotune` reads them: (field, value).
    pub fn io_tune(&self, disk: &str) -> Result<Vec<(String, String)>> {
        Ok(virsh(&["blkdeviotune", &self.name, disk])?
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(':')?;
                Some((k.trim().to_string(), v.trim().to_string()))
            })
            .collect())
    }

    /// Sets a disk's total IOPS limit with virsh, as an operator would.
    pub fn set_total_iops(&self, disk: &str, iops: u64) -> Result<()> {
        virsh(&[
            "blkdeviotune",
            &self.name,
            disk,
            "--live",
            "--total-iops-sec",
            &iops.to_string(),
        ])
        .map(|_| ())
    }

    pub fn destroy(&self) -> Result<()> {
        virsh(&["destroy", &self.name]).map(|_| ())
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        let _ = virsh(&["destroy", &self.name]);
    }
}
