//! The README's first command, as a new user runs it: `./scripts/demo.sh`
//! runs `iofloor demo` from the repository with the default, relative
//! `--out results/demo`. Here the same binary runs from a fresh directory with
//! that default (shortened), and the demo's and the rig's bad input is refused
//! with nothing left behind.

mod common;

use common::{bin, real_environment};
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// What a run may leave behind: mount points, loop devices and rig daemons
/// under `dir`, and iofloor's bench cgroups.
fn leftovers(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    let mut found: Vec<String> = std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&needle))
        .map(|l| format!("mount {l}"))
        .collect();
    for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let backing = e.path().join("loop/backing_file");
        if let Ok(b) = std::fs::read_to_string(&backing) {
            if b.contains(&needle) {
                found.push(format!("loop device {}", e.file_name().to_string_lossy()));
            }
        }
    }
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd);
            if cmd.contains("qemu-storage-daemon") && cmd.contains(&needle) {
                found.push(format!("process {}", e.file_name().to_string_lossy()));
            }
        }
    }
    found
}

/// The bench cgroups of the `iofloor` process `pid` (`iofloor-bench-<pid>-
/// <policy>`): another test binary may run benches beside this one.
fn bench_cgroups(pid: u32) -> Vec<String> {
    let prefix = format!("iofloor-bench-{pid}-");
    std::fs::read_dir("/sys/fs/cgroup/blkio")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

fn iofloor_in(cwd: &Path, args: &[&str]) -> Output {
    iofloor_with_pid_in(cwd, args).1
}

/// Runs `iofloor ARGS` in `cwd` to its end: its PID and output.
fn iofloor_with_pid_in(cwd: &Path, args: &[&str]) -> (u32, Output) {
    let child = Command::new(bin())
        .current_dir(cwd)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run iofloor");
    (child.id(), child.wait_with_output().expect("run iofloor"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn the_demo_runs_from_a_fresh_directory_with_its_relative_default_out() {
    if !real_environment() {
        return;
    }
    let cwd = tempfile::tempdir().unwrap();
    // noisy-4 at 0.03: 18 s per policy, the four alone runs 3 s each.
    let (pid, out) = iofloor_with_pid_in(
        cwd.path(),
        &["demo", "--time-scale", "0.03", "--alone-secs", "3"],
    );
    assert!(out.status.success(), "demo failed: {}", stderr(&out));
    let results = cwd.path().join("results/demo");
    for f in [
        "report.html",
        "summary.json",
        "runs/none.json",
        "runs/floor.json",
    ] {
        assert!(
            results.join(f).is_file(),
            "{f} missing in {}",
            results.display()
        );
    }
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("floor") && table.contains("none"), "{table}");
    assert_eq!(
        leftovers(cwd.path()),
        Vec::<String>::new(),
        "the demo left these behind"
    );
    assert!(!results.join("rig").exists(), "the rig's state is removed");
    assert_eq!(
        bench_cgroups(pid),
        Vec::<String>::new(),
        "bench cgroups left behind"
    );
}

#[test]
fn the_demo_refuses_an_out_it_cannot_use_and_makes_nothing() {
    let cwd = tempfile::tempdir().unwrap();
    // Not empty: earlier results would be mixed with new ones.
    let used = cwd.path().join("used");
    std::fs::create_dir(&used).unwrap();
    std::fs::write(used.join("keep.txt"), "earlier results").unwrap();
    let out = iofloor_in(cwd.path(), &["demo", "--out", "used"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("not empty"), "{}", stderr(&out));
    let entries: Vec<_> = std::fs::read_dir(&used)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(entries, vec![std::ffi::OsString::from("keep.txt")]);
    // Unwritable: under a regular file, and on a file system that takes no directories.
    std::fs::write(cwd.path().join("a-file"), "").unwrap();
    for target in ["a-file/demo", "/proc/iofloor-demo-test/out"] {
        let out = iofloor_in(cwd.path(), &["demo", "--out", target]);
        assert_eq!(out.status.code(), Some(2), "{target}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("cannot write there"),
            "{target}: {}",
            stderr(&out)
        );
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    }
    assert!(!Path::new("/proc/iofloor-demo-test").exists());
    // An alone run too short to mean anything, refused before the rig.
    let out = iofloor_in(cwd.path(), &["demo", "--alone-secs", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--alone-secs must be at least 2, got 1"),
        "{}",
        stderr(&out)
    );
    let mut left: Vec<_> = std::fs::read_dir(cwd.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    left.sort();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("a-file"), "used".into()]
    );
    assert_eq!(leftovers(cwd.path()), Vec::<String>::new());
}

#[test]
fn rig_up_refuses_a_relative_state_dir() {
    let cwd = tempfile::tempdir().unwrap();
    for action in [
        vec!["rig", "up", "--iops", "500"],
        vec!["rig", "down"],
        vec!["rig", "list"],
    ] {
        let mut args = action.clone();
        args.extend(["--state-dir", "rigs"]);
        let out = iofloor_in(cwd.path(), &args);
        assert_eq!(out.status.code(), Some(2), "{action:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("must be an absolute path"),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(
        std::fs::read_dir(cwd.path()).unwrap().count(),
        0,
        "nothing created"
    );
}

#[test]
fn a_rig_that_fails_to_come_up_leaves_nothing_behind() {
    if !real_environment() {
        return;
    }
    // A real failure half-way: the state and backing files are made, then
    // qemu-storage-daemon refuses a monitor socket path over 107 bytes.
    let base = tempfile::tempdir().unwrap();
    let state = base.path().join("x".repeat(100));
    let out = Command::new(bin())
        .args([
            "rig",
            "up",
            "--iops",
            "500",
            "--size",
            "64MiB",
            "--state-dir",
        ])
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("too long"),
        "QEMU's reason is passed on: {}",
        stderr(&out)
    );
    let rigs: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(rigs.is_empty(), "rig directories left: {rigs:?}");
    assert_eq!(leftovers(base.path()), Vec::<String>::new());
    let list = Command::new(bin())
        .args(["rig", "list", "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(
        list.status.success() && list.stdout.is_empty(),
        "{}",
        stderr(&list)
    );
}

#[test]
fn cluster_up_refuses_bad_input_and_creates_nothing() {
    let cwd = tempfile::tempdir().unwrap();
    let state = cwd.path().join("beds");
    let state = state.to_str().unwrap();
    for (args, needle) in [
        (
            vec!["cluster", "up", "--state-dir", "beds"],
            "must be an absolute path",
        ),
        (
            vec!["cluster", "down", "--state-dir", "beds"],
            "must be an absolute path",
        ),
        (
            vec!["cluster", "up", "--hosts", "0", "--state-dir", state],
            "--hosts",
        ),
        (
            vec!["cluster", "up", "--hosts", "65", "--state-dir", state],
            "--hosts",
        ),
        (
            vec!["cluster", "up", "--iops", "0", "--state-dir", state],
            "--iops",
        ),
        (
            vec!["cluster", "up", "--size", "1k", "--state-dir", state],
            "--size",
        ),
    ] {
        let out = iofloor_in(cwd.path(), &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(
        std::fs::read_dir(cwd.path()).unwrap().count(),
        0,
        "nothing created"
    );
}

/// Network namespaces whose names start with `prefix`.
fn namespaces_named(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_test_bed_that_fails_half_way_leaves_nothing_behind() {
    if !real_environment() {
        return;
    }
    // A real failure half-way: the namespaces, the machine's link and the
    // shared file are made, then qemu-storage-daemon refuses a monitor
    // socket path over 107 bytes.
    let base = tempfile::tempdir().unwrap();
    let state = base.path().join("x".repeat(100));
    let child = Command::new(bin())
        .args([
            "cluster",
            "up",
            "--hosts",
            "2",
            "--size",
            "16MiB",
            "--state-dir",
        ])
        .arg(&state)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The namespaces and the machine's link are named after this process.
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("too long"), "{}", stderr(&out));
    let beds: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(beds.is_empty(), "test bed directories left: {beds:?}");
    assert_eq!(leftovers(base.path()), Vec::<String>::new());
    assert_eq!(
        namespaces_named(&format!("iofloor-{pid}-")),
        Vec::<String>::new()
    );
    assert!(
        !Path::new(&format!("/sys/class/net/iofl{pid}-0")).exists(),
        "the machine's link to the bed was left"
    );
}
