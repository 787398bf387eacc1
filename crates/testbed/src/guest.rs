//! A throwaway QEMU guest for tests and demos of the VM path: Debian's cloud
//! kernel and a busybox initramfs (built by scripts/guest-image.sh) that reads
//! its virtio-blk disk with O_DIRECT forever, under TCG (no KVM needed). Its
//! disk can be any file or block device, so a guest can share a device with
//! container tenants. Two QMP monitors: one for the code under test, one for
//! the test's own commands (a QMP socket serves one client at a time).

use iofloor_host::error::{HostError, Result};
use iofloor_host::qmp::Qmp;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where scripts/guest-image.sh put the kernel and initramfs.
pub fn image_dir() -> PathBuf {
    std::env::var_os("IOFLOOR_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/var/cache/iofloor/guest".into())
}

/// The qdev path of the guest's disk, for `block_set_io_throttle`.
pub const DRIVE: &str = "/machine/peripheral/disk0/virtio-backend";

/// A running guest; killed (by the PID of the QEMU we started) and reaped
/// when dropped.
pub struct Guest {
    child: Child,
    pub console: PathBuf,
    /// The monitor for the code under test.
    pub qmp: PathBuf,
    /// A second monitor for the caller's own commands.
    pub control: PathBuf,
}

impl Guest {
    /// Boots a guest whose disk is `disk` (a file or a block device) with
    /// sockets and console in `dir`; returns once its load runs.
    pub fn boot(dir: &Path, disk: &Path) -> Result<Guest> {
        let (console, qmp, control) = (
            dir.join("console.log"),
            dir.join("qmp.sock"),
            dir.join("control.sock"),
        );
        let image = image_dir();
        let child = Command::new("qemu-system-x86_64")
            .args([
                "-accel",
                "tcg",
                "-m",
                "256",
                "-display",
                "none",
                "-no-reboot",
                "-nodefaults",
            ])
            .arg("-kernel")
            .arg(image.join("vmlinuz"))
            .arg("-initrd")
            .arg(image.join("initramfs.gz"))
            .args(["-append", "console=ttyS0 quiet panic=-1"])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", control.display()))
            .arg("-drive")
            .arg(format!(
                "file={},if=none,id=drive0,format=raw,cache=none,aio=native",
                disk.display()
            ))
            .args(["-device", "virtio-blk-pci,drive=drive0,id=disk0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| HostError::Command {
                what: "qemu-system-x86_64".into(),
                message: e.to_string(),
            })?;
        let mut guest = Guest {
            child,
            console,
            qmp,
            control,
        };
        guest.wait_for_load()?;
        Ok(guest)
    }

    fn wait_for_load(&mut self) -> Result<()> {
        let started = Instant::now();
        loop {
            let text = std::fs::read_to_string(&self.console).unwrap_or_default();
            if text.contains("iofloor-guest: load running") {
                return Ok(());
            }
            let fail = |message: String| {
                Err(HostError::Command {
                    what: "guest boot".into(),
                    message,
                })
            };
            if let Some(status) = self
                .child
                .try_wait()
                .map_err(|e| HostError::io(&self.console, e))?
            {
                return fail(format!(
                    "QEMU exited ({status}) before the guest ran; console:\n{text}"
                ));
            }
            if started.elapsed() > Duration::from_secs(120) {
                return fail(format!("guest did not boot in 120 s; console:\n{text}"));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs a QMP command on the control monitor (`stop`, `cont`, ...).
    pub fn command(&self, command: &str) -> Result<serde_json::Value> {
        Qmp::connect(&self.control, Duration::from_secs(5))?.execute(command, None)
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
