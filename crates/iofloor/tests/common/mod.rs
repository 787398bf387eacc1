//! Helpers shared by the real-device end-to-end tests: the environment check
//! and a rig of known capacity that is removed when dropped.
#![allow(dead_code)]

use std::process::Command;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_iofloor")
}

/// Root, cgroup v1 blkio, fio and qemu-storage-daemon, or the test fails
/// (see `iofloor_testbed::needs`).
pub fn real_environment() -> bool {
    let test = std::thread::current()
        .name()
        .unwrap_or("a real-device test")
        .to_string();
    iofloor_testbed::needs::require(&test, &iofloor_testbed::needs::real_kernel())
}

/// A rig for one test, removed on drop.
pub struct TestRig {
    pub state: tempfile::TempDir,
    pub device: String,
}

pub fn attached_loop_devices() -> Vec<String> {
    let out = Command::new("losetup").arg("-a").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

impl TestRig {
    pub fn up(iops: u64) -> TestRig {
        let state = tempfile::tempdir().unwrap();
        let out = Command::new(bin())
            .args([
                "rig",
                "up",
                "--iops",
                &iops.to_string(),
                "--size",
                "512MiB",
                "--state-dir",
            ])
            .arg(state.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rig up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let device = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap()
            .to_string();
        assert!(
            device.starts_with("/dev/loop"),
            "last line is the device: {device}"
        );
        TestRig { state, device }
    }
}

impl TestRig {
    /// Changes the rig's capacity while it is in use (`iofloor rig set`).
    pub fn set_iops(&self, iops: u64) {
        let out = Command::new(bin())
            .args([
                "rig",
                "set",
                "--iops",
                &iops.to_string(),
                "--device",
                &self.device,
                "--state-dir",
            ])
            .arg(self.state.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rig set: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for TestRig {
    fn drop(&mut self) {
        let out = Command::new(bin())
            .args(["rig", "down", "--state-dir"])
            .arg(self.state.path())
            .output()
            .unwrap();
        assert!(
            out.status.success() || std::thread::panicking(),
            "rig down: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
