//! The cgroup v2 backend against a recorded file tree (no live v2 io
//! controller on this machine).

use iofloor_core::Caps;
use iofloor_host::cgroup::{controller, detect, DevId, Version};
use std::path::{Path, PathBuf};

fn fixture() -> tempfile::TempDir {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v2");
    let dst = tempfile::tempdir().unwrap();
    copy_tree(&src, dst.path());
    dst
}

fn copy_tree(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), to).unwrap();
        }
    }
}

const NVME: DevId = DevId {
    major: 259,
    minor: 0,
};

#[test]
fn reads_io_stat_and_io_max() {
    let root = fixture();
    assert_eq!(detect(root.path()).unwrap(), Version::V2);
    let io = controller(root.path(), NVME).unwrap();
    let c = io.read(Path::new("kubepods/pod1")).unwrap();
    assert_eq!(
        (c.read_ios, c.write_ios, c.read_bytes, c.write_bytes),
        (1000, 1000, 4_096_000, 65_536_000)
    );
    let caps = io.caps(Path::new("kubepods/pod1")).unwrap();
    assert_eq!(
        caps,
        Caps {
            read_iops: None,
            write_iops: Some(2000.0),
            read_bps: None,
            write_bps: Some(10485760.0)
        }
    );
    // A cgroup without I/O on the device has no line: zero counters, no caps.
    assert_eq!(
        io.read(Path::new("kubepods/pod2")).unwrap(),
        Default::default()
    );
    assert_eq!(io.caps(Path::new("kubepods/pod2")).unwrap(), Caps::NONE);
}

#[test]
fn writes_io_max_with_max_for_no_limit() {
    let root = fixture();
    let io = controller(root.path(), NVME).unwrap();
    let caps = Caps {
        read_iops: Some(500.4),
        write_iops: None,
        read_bps: None,
        write_bps: Some(1e6),
    };
    io.set_caps(Path::new("kubepods/pod2"), &caps).unwrap();
    let written = std::fs::read_to_string(root.path().join("kubepods/pod2/io.max")).unwrap();
    assert_eq!(written, "259:0 rbps=max wbps=1000000 riops=501 wiops=max");
}

#[test]
fn garbage_and_missing_cgroups_are_errors_naming_the_file() {
    let root = fixture();
    std::fs::write(
        root.path().join("kubepods/pod2/io.stat"),
        "259:0 rbytes=12 wbytes\n",
    )
    .unwrap();
    let io = controller(root.path(), NVME).unwrap();
    let e = io.read(Path::new("kubepods/pod2")).unwrap_err().to_string();
    assert!(e.contains("pod2/io.stat") && e.contains("wbytes"), "{e}");
    let gone = io.read(Path::new("kubepods/pod9")).unwrap_err();
    assert!(
        gone.is_not_found() && gone.to_string().contains("pod9"),
        "{gone}"
    );
}

#[test]
fn v2_without_io_controller_is_refused() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("cgroup.controllers"), "cpu memory pids\n").unwrap();
    let e = detect(root.path()).unwrap_err().to_string();
    assert!(e.contains("without the io controller"), "{e}");
}
