//! Helpers shared by the real-device end-to-end tests: the environment check
//! and a rig of known capacity that is removed when dropped.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_iofloor")
}

pub fn real_environment() -> bool {
    let mut missing = Vec::new();
    if !rustix_root() {
        missing.push("root");
    }
    if !Path::new("/sys/fs/cgroup/blkio/blkio.throttle.io_serviced").exists() {
        missing.push("cgroup v1 blkio");
    }
    for p in ["fio", "qemu-storage-daemon"] {
        if Command::new(p).arg("--version").output().is_err() {
            missing.push(p);
        }
    }
    if missing.is_empty() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "real-device test cannot run under CI: missing {}",
            missing.join(", ")
        );
    }
    eprintln!("skipped: missing {}", missing.join(", "));
    false
}

pub fn rustix_root() -> bool {
    // SAFETY-free check through /proc: uid 0.
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// A rig for one test, removed on drop.
pub struct TestRig {
    pub state: tempfile::TempDir,
    pub device: String,
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
