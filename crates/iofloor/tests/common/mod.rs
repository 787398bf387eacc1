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

/// Two pods as the kubelet's systemd driver lays them out, as cgroup paths
/// under the root: a burstable pod with two containerd containers (`a`,
/// `b`) and a besteffort pod with a CRI-O container (`c`) and its conmon.
/// The daemon's test on a recorded tree and the v2 guest's on a live
/// kernel use the same layout.
pub struct KubePods {
    pub pod1: &'static str,
    pub pod2: &'static str,
    pub burstable: String,
    pub besteffort: String,
    /// The containers a, b (burstable) and c (besteffort).
    pub containers: [String; 3],
    pub conmon: String,
}

pub fn kube_pods() -> KubePods {
    let (pod1, pod2) = (
        "0a1b2c3d-4e5f-6789-abcd-ef0123456789",
        "11111111-2222-3333-4444-555555555555",
    );
    let id = |c: char| c.to_string().repeat(64);
    let burstable = format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        pod1.replace('-', "_")
    );
    let besteffort = format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
        pod2.replace('-', "_")
    );
    KubePods {
        pod1,
        pod2,
        containers: [
            format!("{burstable}/cri-containerd-{}.scope", id('a')),
            format!("{burstable}/cri-containerd-{}.scope", id('b')),
            format!("{besteffort}/crio-{}.scope", id('c')),
        ],
        conmon: format!("{besteffort}/crio-conmon-{}.scope", id('c')),
        burstable,
        besteffort,
    }
}

/// A tenant's IOPS per interval after `from` (the daemon's time), from its
/// `/api/v1/tenants/NAME` answer's `history`; empty without one.
pub fn history_iops_since(tenant: &serde_json::Value, from: f64) -> Vec<f64> {
    tenant["history"]
        .as_array()
        .map(|h| {
            h.iter()
                .filter(|p| p["t"].as_f64().unwrap_or(0.0) > from)
                .map(|p| p["iops"].as_f64().unwrap_or(0.0))
                .collect()
        })
        .unwrap_or_default()
}
