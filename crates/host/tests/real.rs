//! Real kernel tests: cgroup v1 blk-throttle on a real loop device with real
//! fio, and the rig. They need root, the v1 blkio hierarchy, fio and
//! qemu-storage-daemon (scripts/test.sh installs them); without those they are
//! skipped with a message, except under CI, where that is a failure.
//! Everything they create is removed, also when an assertion fails.

use iofloor_core::Caps;
use iofloor_host::cgroup::{self, controller, DevId, IoController, Version};
use iofloor_host::fio::{read_output, FioJob};
use iofloor_testbed::needs::{self, Need};
use iofloor_testbed::rig::{Rig, RigSpec};
use std::path::{Path, PathBuf};
use std::process::Command;

use needs::BLKIO;

fn real_environment(programs: &[&'static str]) -> bool {
    let mut needs = vec![Need::Root, Need::CgroupV1Blkio];
    needs.extend(programs.iter().map(|p| Need::Program(p)));
    let test = std::thread::current().name().unwrap_or("real").to_string();
    needs::require(&test, &needs)
}

/// A loop device over a file on tmpfs, detached on drop.
struct Loop {
    dev: PathBuf,
    _dir: tempfile::TempDir,
}

impl Loop {
    fn new() -> Loop {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let file = dir.path().join("disk.img");
        std::fs::File::create(&file)
            .unwrap()
            .set_len(256 << 20)
            .unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Loop {
            dev: PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
            _dir: dir,
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// A cgroup removed on drop (after its processes are gone).
struct TestCgroup(PathBuf);

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = cgroup::remove_tree(Path::new(BLKIO), &self.0);
    }
}

fn run_fio_in(cg: &Path, job: &FioJob) -> iofloor_host::fio::FioOutput {
    let procs = Path::new(BLKIO).join(cg).join("cgroup.procs");
    let child = job.spawn_in(&procs).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    read_output(&job.output).unwrap()
}

fn job(dev: &Path, dir: &Path, rw: &str, bs: u64, iodepth: u32, secs: f64) -> FioJob {
    FioJob::new("t", dev, rw, bs, iodepth, secs, dir.join("out.json"))
}

#[test]
fn v1_blk_throttle_caps_and_counts_real_direct_io() {
    if !real_environment(&["fio", "losetup"]) {
        return;
    }
    let lo = Loop::new();
    let dev = DevId::of_block_device(&lo.dev).unwrap();
    let cg = TestCgroup(PathBuf::from(format!(
        "iofloor-test-v1-{}",
        std::process::id()
    )));
    cgroup::create(Path::new(BLKIO), &cg.0).unwrap();
    let io = controller(Path::new(BLKIO), dev).unwrap();
    assert_eq!(io.version(), Version::V1);
    let caps = Caps {
        write_iops: Some(300.0),
        ..Caps::NONE
    };
    io.set_caps(&cg.0, &caps).unwrap();
    assert_eq!(io.caps(&cg.0).unwrap(), caps);

    let tmp = tempfile::tempdir().unwrap();
    let before = io.read(&cg.0).unwrap();
    let out = run_fio_in(&cg.0, &job(&lo.dev, tmp.path(), "randwrite", 4096, 8, 2.0));
    let after = io.read(&cg.0).unwrap();
    let w = &out.jobs[0].write;
    // The cap holds (a throttle bounds from above, whatever the machine's noise).
    assert!(
        w.iops <= 300.0 * 1.15,
        "capped at 300 IOPS, fio saw {}",
        w.iops
    );
    assert!(w.total_ios > 0);
    // The cgroup counted fio's I/O (to within what fio counts around its start and end).
    let counted = after.write_ios - before.write_ios;
    assert!(
        (counted as f64 - w.total_ios as f64).abs() <= 0.05 * w.total_ios as f64 + 8.0,
        "cgroup {counted} vs fio {}",
        w.total_ios
    );
    assert_eq!(after.write_bytes - before.write_bytes, counted * 4096);

    // Clearing removes the limit: the kernel file no longer lists the device.
    io.set_caps(&cg.0, &Caps::NONE).unwrap();
    assert_eq!(io.caps(&cg.0).unwrap(), Caps::NONE);
}

/// A device just attached, no limit ever written for it, a cgroup with no
/// cap: its I/O is still counted (blk-throttle starts on a queue only when
/// a limit is first written, since Linux 6.10; the controller starts it with
/// a limit of none), and the root lists no limit for the device after.
#[test]
fn v1_counts_io_on_a_fresh_device_without_any_cap() {
    if !real_environment(&["fio", "losetup"]) {
        return;
    }
    let lo = Loop::new();
    let dev = DevId::of_block_device(&lo.dev).unwrap();
    let cg = TestCgroup(PathBuf::from(format!(
        "iofloor-test-fresh-{}",
        std::process::id()
    )));
    cgroup::create(Path::new(BLKIO), &cg.0).unwrap();
    let io = controller(Path::new(BLKIO), dev).unwrap();
    assert_eq!(io.caps(&cg.0).unwrap(), Caps::NONE);
    let tmp = tempfile::tempdir().unwrap();
    let before = io.read(&cg.0).unwrap();
    let out = run_fio_in(&cg.0, &job(&lo.dev, tmp.path(), "randread", 4096, 4, 1.0));
    let after = io.read(&cg.0).unwrap();
    let r = &out.jobs[0].read;
    assert!(r.total_ios > 0);
    let counted = after.read_ios - before.read_ios;
    assert!(
        (counted as f64 - r.total_ios as f64).abs() <= 0.05 * r.total_ios as f64 + 8.0,
        "cgroup {counted} vs fio {}",
        r.total_ios
    );
    let root_limits =
        std::fs::read_to_string(Path::new(BLKIO).join("blkio.throttle.read_iops_device")).unwrap();
    assert!(
        !root_limits
            .lines()
            .any(|l| l.starts_with(&format!("{dev} "))),
        "{root_limits}"
    );
}

/// Caps, some absent, some fractional, some beyond what the kernel keeps.
fn caps_strategy() -> impl proptest::strategy::Strategy<Value = Caps> {
    use proptest::prelude::*;
    let limit = || proptest::option::of(prop_oneof![0.5f64..1e12, 1e12f64..1e20]);
    (limit(), limit(), limit(), limit()).prop_map(|(ri, wi, rb, wb)| Caps {
        read_iops: ri,
        write_iops: wi,
        read_bps: rb,
        write_bps: wb,
    })
}

/// Every cap iofloor writes is the cap it reads back (as the kernel keeps
/// it: rounded up to whole numbers, IOPS at most 2^32 - 2): through the real
/// kernel's blk-throttle files, and through a v2 `io.max` file. Found by this
/// test: an IOPS cap of 2^32 - 1 read back as none, and the kernel truncates
/// larger IOPS limits to 32 bits.
#[test]
fn every_cap_written_is_read_back_equal() {
    use proptest::test_runner::{Config, TestRunner};
    if !real_environment(&["losetup"]) {
        return;
    }
    let lo = Loop::new();
    let dev = DevId::of_block_device(&lo.dev).unwrap();
    let name = PathBuf::from(format!("iofloor-test-roundtrip-{}", std::process::id()));
    cgroup::create(Path::new(BLKIO), &name).unwrap();
    let _cg = TestCgroup(name.clone());
    let v1 = controller(Path::new(BLKIO), dev).unwrap();
    assert_eq!(v1.version(), Version::V1);
    let v2_root = tempfile::tempdir().unwrap();
    std::fs::write(v2_root.path().join("cgroup.controllers"), "io\n").unwrap();
    std::fs::create_dir(v2_root.path().join("t")).unwrap();
    // The kernel makes `io.max` with the cgroup; iofloor never creates it.
    std::fs::write(v2_root.path().join("t/io.max"), "").unwrap();
    let v2 = iofloor_host::cgroup::IoV2 {
        root: v2_root.path().to_path_buf(),
        dev,
    };
    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    runner
        .run(&caps_strategy(), |caps| {
            let kept = cgroup::writable(&caps);
            v1.set_caps(&name, &caps).unwrap();
            proptest::prop_assert_eq!(v1.caps(&name).unwrap(), kept);
            v2.set_caps(Path::new("t"), &caps).unwrap();
            // v2 takes no limit below 2 (`V2_SMALLEST_LIMIT`).
            let least = |v: Option<f64>| v.map(|x| x.max(cgroup::V2_SMALLEST_LIMIT as f64));
            let kept_v2 = Caps {
                read_iops: least(kept.read_iops),
                write_iops: least(kept.write_iops),
                read_bps: least(kept.read_bps),
                write_bps: least(kept.write_bps),
            };
            proptest::prop_assert_eq!(v2.caps(Path::new("t")).unwrap(), kept_v2);
            for v in [kept.read_iops, kept.write_iops].into_iter().flatten() {
                proptest::prop_assert!(v >= 1.0 && v <= cgroup::MAX_IOPS_LIMIT as f64);
            }
            Ok(())
        })
        .unwrap();
    v1.set_caps(&name, &Caps::NONE).unwrap();
}

#[test]
fn a_removed_cgroup_reads_as_not_found() {
    if !real_environment(&["losetup"]) {
        return;
    }
    let lo = Loop::new();
    let dev = DevId::of_block_device(&lo.dev).unwrap();
    let name = PathBuf::from(format!("iofloor-test-gone-{}", std::process::id()));
    cgroup::create(Path::new(BLKIO), &name).unwrap();
    let io = controller(Path::new(BLKIO), dev).unwrap();
    io.read(&name).unwrap();
    cgroup::remove_tree(Path::new(BLKIO), &name).unwrap();
    let e = io.read(&name).unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert!(io.set_caps(&name, &Caps::NONE).is_err());
}

#[test]
fn not_a_block_device_is_refused() {
    let e = DevId::of_block_device(Path::new("/etc/hostname"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/etc/hostname: is not a block device"), "{e}");
    let e = DevId::of_block_device(Path::new("/dev/no-such-disk"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/dev/no-such-disk"), "{e}");
}

fn mounts_under(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|m| m.starts_with(dir.to_str().unwrap()))
        })
        .map(String::from)
        .collect()
}

#[test]
fn rig_serves_its_capacity_changes_it_live_and_leaves_nothing() {
    if !real_environment(&["fio", "losetup", "qemu-storage-daemon"]) {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let spec = RigSpec {
        iops: 1000,
        bps: None,
        size_unit: None,
        size: 256 << 20,
    };
    let rig = Rig::up(spec, state.path()).unwrap();
    struct Down<'a>(&'a Path);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = Rig::down_all(self.0);
        }
    }
    let _down = Down(state.path());
    let dev = rig.device.clone().unwrap();
    DevId::of_block_device(&dev).unwrap();

    let root = TestCgroup(PathBuf::from(format!(
        "iofloor-test-rig-{}",
        std::process::id()
    )));
    cgroup::create(Path::new(BLKIO), &root.0).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = run_fio_in(&root.0, &job(&dev, tmp.path(), "randread", 4096, 4, 2.0));
    let first = out.jobs[0].read.iops;
    assert!(first <= 1000.0 * 1.15, "rig of 1,000 IOPS served {first}");
    assert!(first >= 500.0, "rig of 1,000 IOPS served only {first}");

    rig.set_limits(&RigSpec { iops: 300, ..spec }).unwrap();
    let out = run_fio_in(&root.0, &job(&dev, tmp.path(), "randread", 4096, 4, 2.0));
    let second = out.jobs[0].read.iops;
    assert!(
        second <= 300.0 * 1.15 && second < first * 0.5,
        "after the QMP change to 300: {second}"
    );

    assert_eq!(Rig::down_all(state.path()).unwrap(), 1);
    assert!(!rig.dir.exists(), "rig directory left behind");
    let attached = Command::new("losetup").arg("-a").output().unwrap();
    assert!(
        !String::from_utf8_lossy(&attached.stdout).contains(rig.dir.to_str().unwrap()),
        "loop device left"
    );
    assert!(mounts_under(&rig.dir).is_empty(), "FUSE mount left");
    assert!(
        !Path::new(&format!("/proc/{}", rig.qsd_pid.unwrap())).exists(),
        "qemu-storage-daemon left running"
    );
}

/// What a bench leaves in its own cgroups past its processes' grace (a job
/// process of a fio killed while its jobs were starting) is killed, and the
/// cgroups can then go.
#[test]
fn processes_left_in_a_cgroup_are_killed_and_it_is_removed() {
    if !real_environment(&["sleep"]) {
        return;
    }
    let name = PathBuf::from(format!("iofloor-test-leftover-{}", std::process::id()));
    let inner = cgroup::create(Path::new(BLKIO), &name.join("tenant")).unwrap();
    let _cg = TestCgroup(name.clone());
    let mut left = Command::new("sleep").arg("300").spawn().unwrap();
    std::fs::write(inner.join("cgroup.procs"), left.id().to_string()).unwrap();
    let busy = cgroup::remove_when_empty(Path::new(BLKIO), &name, std::time::Duration::ZERO);
    assert!(busy.is_err(), "a cgroup with a process in it is removed");
    assert_eq!(cgroup::kill_processes_in(Path::new(BLKIO), &name), 1);
    let status = left.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    cgroup::remove_when_empty(Path::new(BLKIO), &name, std::time::Duration::from_secs(10)).unwrap();
    assert!(!inner.exists());
}
