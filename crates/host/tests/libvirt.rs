//! The libvirt backend against a real libvirtd (started here if none runs)
//! and a real QEMU domain under TCG with two virtio disks, each read by the
//! guest with O_DIRECT: domains and disks found through the API, counters and
//! latency from block stats, a cap set live taking effect within one
//! interval, a VM's disks sharing one throttle group, the original limits
//! read and put back, a paused domain
//! unavailable rather than idle, a destroyed one unavailable, and a libvirtd
//! restart survived by reconnecting.

use iofloor_core::{Backend, Caps, TenantClass, TenantSpec};
use iofloor_host::backends::libvirt::{IoTune, LibvirtBackend, DEFAULT_URI};
use iofloor_host::HostError;
use iofloor_testbed::libvirt::{Daemon, Domain};
use std::time::Duration;

fn real_environment() -> bool {
    use iofloor_testbed::needs::{require, Need};
    let dir = iofloor_testbed::guest::image_dir();
    require(
        "libvirt",
        &[
            Need::Root,
            Need::Program("qemu-system-x86_64"),
            Need::Program("virsh"),
            Need::Program("libvirtd"),
            Need::File(dir.join("vmlinuz")),
            Need::File(dir.join("initramfs.gz")),
        ],
    )
}

/// A disk's read IOPS over `secs`, from the backend's counters.
fn iops(backend: &mut LibvirtBackend, disk: &TenantSpec, secs: f64) -> f64 {
    let before = backend.read_counters(disk).unwrap();
    std::thread::sleep(Duration::from_secs_f64(secs));
    let after = backend.read_counters(disk).unwrap();
    (after.read_ios - before.read_ios) as f64 / secs
}

#[test]
fn a_domain_is_found_measured_capped_restored_and_followed_through_libvirt() {
    if !real_environment() {
        return;
    }
    let mut daemon = Daemon::ensure().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let disks: Vec<std::path::PathBuf> = ["a.img", "b.img"]
        .iter()
        .map(|n| {
            let p = dir.path().join(n);
            std::fs::File::create(&p)
                .unwrap()
                .set_len(64 << 20)
                .unwrap();
            p
        })
        .collect();
    let name = format!("iofloor-test-{}", std::process::id());
    let domain = Domain::boot(&name, dir.path(), &disks).unwrap();

    let mut backend = LibvirtBackend::new(DEFAULT_URI, Duration::from_secs(5)).unwrap();
    let found = backend.domains().unwrap();
    let info = found
        .iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("{name} not among {found:?}"));
    assert_eq!(info.uuid, domain.uuid);
    assert_eq!(info.disks, ["vda", "vdb"]);
    let (vda, vdb) = (
        TenantSpec::new("vm/vda", TenantClass::Vm),
        TenantSpec::new("vm/vdb", TenantClass::Vm),
    );
    backend.add_tenant(&vda.name, info, "vda", None);
    backend.add_tenant(&vdb.name, info, "vdb", None);

    // An operator's own limit on vdb before iofloor sees it: kept as the
    // original and put back.
    domain.set_total_iops("vdb", 5000).unwrap();
    let original = backend.io_tune(&vdb.name).unwrap();
    assert_eq!(original.total_iops_sec, 5000, "{original:?}");
    assert_eq!(backend.io_tune(&vda.name).unwrap(), IoTune::default());

    let uncapped = iops(&mut backend, &vda, 2.0);
    assert!(
        uncapped > 300.0,
        "a TCG guest at QD1 does thousands of IOPS, saw {uncapped:.0}"
    );
    let c = backend.read_counters(&vda).unwrap();
    assert!(
        c.latency_ns_total.unwrap() > 0,
        "block stats carry completion times"
    );

    // A cap set live, measured over the first interval after it and after.
    let cap = Caps {
        read_iops: Some(150.0),
        ..Caps::NONE
    };
    backend.apply_caps(&vda, &cap).unwrap();
    let first = iops(&mut backend, &vda, 1.0);
    let later = iops(&mut backend, &vda, 2.0);
    eprintln!("vda: uncapped {uncapped:.0} IOPS, capped at 150: {first:.0} in the first second, {later:.0} after");
    assert!(
        first < 150.0 * 1.5,
        "the cap took more than an interval: {first:.0} IOPS"
    );
    assert!(
        later < 150.0 * 1.1 && later > 150.0 * 0.5,
        "{later:.0} IOPS under a 150 cap"
    );
    let tune = domain.io_tune("vda").unwrap();
    assert!(
        tune.iter().any(|(k, v)| k == "read_iops_sec" && v == "150"),
        "libvirt's own view shows the cap: {tune:?}"
    );

    // Paused: unavailable, not idle (its counters stand still).
    domain.suspend().unwrap();
    match backend.read_counters(&vda) {
        Err(HostError::Unavailable(m)) => assert!(m.contains("paused"), "{m}"),
        other => panic!("a paused domain read as {other:?}"),
    }
    domain.resume().unwrap();
    backend.read_counters(&vda).unwrap();

    // libvirtd restarted: the next calls reconnect (one may fail while it
    // comes back); the domain and its cap survive.
    if daemon.restart_libvirtd().is_ok() {
        let mut ok = false;
        for _ in 0..20 {
            if backend.read_counters(&vda).is_ok() {
                ok = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        assert!(ok, "no reconnection after libvirtd restarted");
        assert_eq!(backend.io_tune(&vda.name).unwrap().read_iops_sec, 150);
    } else {
        eprintln!("libvirtd was already running: its restart is not tested here");
    }

    // Originals back: none on vda, the operator's 5000 total on vdb.
    backend.set_io_tune(&vda.name, &IoTune::default()).unwrap();
    backend.apply_caps(&vdb, &cap).unwrap();
    assert_eq!(backend.io_tune(&vdb.name).unwrap().read_iops_sec, 150);
    backend.set_io_tune(&vdb.name, &original).unwrap();
    assert_eq!(backend.io_tune(&vda.name).unwrap(), IoTune::default());
    assert_eq!(backend.io_tune(&vdb.name).unwrap(), original);
    let back = iops(&mut backend, &vda, 1.0);
    assert!(back > 300.0, "restored: uncapped again, saw {back:.0}");

    // One limit for the VM's two disks: a QEMU throttle group holding the
    // sum of their caps, which either disk may use.
    let info = info.clone();
    for (t, disk) in [(&vda, "vda"), (&vdb, "vdb")] {
        backend.remove_tenant(&t.name);
        backend.add_tenant(&t.name, &info, disk, Some("iofloor-vm"));
    }
    let half = |iops: f64| Caps {
        read_iops: Some(iops),
        ..Caps::NONE
    };
    backend.apply_caps(&vda, &half(100.0)).unwrap();
    backend.apply_caps(&vdb, &half(60.0)).unwrap();
    for disk in ["vda", "vdb"] {
        let tune = domain.io_tune(disk).unwrap();
        let field = |k: &str| tune.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(
            field("group_name").as_deref(),
            Some("iofloor-vm"),
            "{disk}: {tune:?}"
        );
        assert_eq!(
            field("read_iops_sec").as_deref(),
            Some("160"),
            "{disk}: {tune:?}"
        );
    }
    std::thread::sleep(Duration::from_secs(1));
    let (a0, b0) = (
        backend.read_counters(&vda).unwrap().read_ios,
        backend.read_counters(&vdb).unwrap().read_ios,
    );
    std::thread::sleep(Duration::from_secs(3));
    let (a1, b1) = (
        backend.read_counters(&vda).unwrap().read_ios,
        backend.read_counters(&vdb).unwrap().read_ios,
    );
    let together = ((a1 - a0) + (b1 - b0)) as f64 / 3.0;
    eprintln!(
        "one throttle group of 160 IOPS: vda {:.0} + vdb {:.0} IOPS",
        (a1 - a0) as f64 / 3.0,
        (b1 - b0) as f64 / 3.0
    );
    assert!(
        together < 160.0 * 1.1 && together > 160.0 * 0.6,
        "{together:.0} IOPS together"
    );
    // One disk held back, the other free: a sum would free both, so each
    // gets its own caps, out of the group; then one group again.
    backend.apply_caps(&vdb, &Caps::NONE).unwrap();
    let field = |disk: &str, k: &str| {
        domain
            .io_tune(disk)
            .unwrap()
            .into_iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v)
            .unwrap_or_default()
    };
    assert_eq!(field("vda", "read_iops_sec"), "100");
    assert_ne!(field("vda", "group_name"), "iofloor-vm");
    assert_eq!(field("vdb", "read_iops_sec"), "0");
    backend.apply_caps(&vdb, &half(60.0)).unwrap();
    assert_eq!(field("vda", "group_name"), "iofloor-vm");
    assert_eq!(field("vdb", "read_iops_sec"), "160");
    // Put back: each disk leaves the group with its own limits.
    backend.set_io_tune(&vda.name, &IoTune::default()).unwrap();
    backend.set_io_tune(&vdb.name, &original).unwrap();
    assert_eq!(backend.io_tune(&vda.name).unwrap(), IoTune::default());
    assert_eq!(
        backend.io_tune(&vdb.name).unwrap(),
        original,
        "the operator's limit, in no group"
    );

    // Gone: unavailable, and no longer listed.
    domain.destroy().unwrap();
    match backend.read_counters(&vda) {
        Err(HostError::Unavailable(_)) => {}
        other => panic!("a destroyed domain read as {other:?}"),
    }
    assert!(!backend.domains().unwrap().iter().any(|d| d.name == name));
}
