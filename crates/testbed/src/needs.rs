//! What iofloor's real-kernel tests need, checked in one place. A test that
//! cannot run fails and says what is missing and how to install it; it never
//! passes silently. A developer on a machine without root or tools may opt out
//! on purpose with `IOFLOOR_SKIP_REAL_TESTS=1`, which is refused under CI.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The cgroup v1 blkio hierarchy the real tests use.
pub const BLKIO: &str = "/sys/fs/cgroup/blkio";

/// One thing a real test needs.
#[derive(Debug, Clone)]
pub enum Need {
    Root,
    /// cgroup v1 blkio mounted at [`BLKIO`].
    CgroupV1Blkio,
    /// A program that answers `--version`.
    Program(&'static str),
    /// A file a setup script makes (e.g. the guest image).
    File(PathBuf),
}

impl Need {
    fn missing(&self) -> Option<String> {
        match self {
            Need::Root => (!rustix::process::geteuid().is_root()).then(|| "root".to_string()),
            Need::CgroupV1Blkio => (!Path::new(BLKIO).join("blkio.throttle.io_serviced").exists())
                .then(|| format!("cgroup v1 blkio at {BLKIO}")),
            Need::Program(p) => Command::new(p)
                .arg("--version")
                .output()
                .is_err()
                .then(|| format!("`{p}`")),
            Need::File(f) => (!f.is_file()).then(|| f.display().to_string()),
        }
    }
}

/// The machine the real-kernel tests were written for: root, cgroup v1
/// blkio, fio and qemu-storage-daemon.
pub fn real_kernel() -> Vec<Need> {
    vec![
        Need::Root,
        Need::CgroupV1Blkio,
        Need::Program("fio"),
        Need::Program("qemu-storage-daemon"),
    ]
}

/// True when everything in `needs` is here. Otherwise panics naming what is
/// missing, unless the developer opted out with `IOFLOOR_SKIP_REAL_TESTS=1`
/// outside CI, in which case it says so on stderr and returns false.
pub fn require(test: &str, needs: &[Need]) -> bool {
    let missing: Vec<String> = needs.iter().filter_map(Need::missing).collect();
    if missing.is_empty() {
        return true;
    }
    let opted_out = std::env::var_os("IOFLOOR_SKIP_REAL_TESTS").is_some_and(|v| v == "1");
    let under_ci = std::env::var_os("CI").is_some();
    if opted_out && !under_ci {
        eprintln!(
            "SKIPPED {test}: missing {} (IOFLOOR_SKIP_REAL_TESTS=1)",
            missing.join(", ")
        );
        return false;
    }
    panic!(
        "{test} needs {}; run ./scripts/deps.sh as root (or set IOFLOOR_SKIP_REAL_TESTS=1 outside CI to skip it on purpose)",
        missing.join(", ")
    );
}
