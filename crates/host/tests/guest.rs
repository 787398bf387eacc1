//! The QMP backend against a real guest: `qemu-system-x86_64` under TCG (no
//! KVM here) booting Debian's cloud kernel with a busybox initramfs that reads
//! its virtio-blk disk with O_DIRECT (built by scripts/guest-image.sh). The
//! guest's I/O goes through QEMU's virtio-blk device and block layer, so this
//! checks what a VM tenant on a real host is: counters from
//! `query-blockstats` of a guest drive, a `block_set_io_throttle` limit taking
//! effect within one interval, and a paused VM reported as unavailable rather
//! than idle.

use iofloor_core::policy::{self, PolicyContext, PolicyKind, PolicyParams};
use iofloor_core::{
    Backend, Caps, Controller, CostModel, CostParams, Rate, TenantClass, TenantSpec,
};
use iofloor_host::backends::qmp::{QmpBackend, QmpTarget};
use iofloor_host::HostError;
use iofloor_testbed::guest::{Guest, DRIVE};
use std::sync::Arc;
use std::time::Duration;

fn real_environment() -> bool {
    use iofloor_testbed::needs::{require, Need};
    let dir = iofloor_testbed::guest::image_dir();
    let test = std::thread::current().name().unwrap_or("guest").to_string();
    require(
        &test,
        &[
            Need::Program("qemu-system-x86_64"),
            Need::File(dir.join("vmlinuz")),
            Need::File(dir.join("initramfs.gz")),
        ],
    )
}

/// The guest's read IOPS over `secs`, from the backend's counters.
fn iops(backend: &mut QmpBackend, vm: &TenantSpec, secs: f64) -> f64 {
    let before = backend.read_counters(vm).unwrap();
    std::thread::sleep(Duration::from_secs_f64(secs));
    let after = backend.read_counters(vm).unwrap();
    (after.read_ios - before.read_ios) as f64 / secs
}

#[test]
fn a_real_guest_is_measured_throttled_and_paused_through_qmp() {
    if !real_environment() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let guest = Guest::boot(dir.path(), &disk).unwrap();
    let vm = TenantSpec::new("guest", TenantClass::Vm).with_floor(Rate::Iops(100.0));
    let mut backend = QmpBackend::new(Duration::from_secs(2));
    backend.add_tenant("guest", &guest.qmp, QmpTarget::Drive { id: DRIVE.into() });

    let uncapped = iops(&mut backend, &vm, 2.0);
    let c = backend.read_counters(&vm).unwrap();
    assert!(
        uncapped > 500.0,
        "a TCG guest at QD1 does thousands of IOPS, saw {uncapped:.0}"
    );
    assert!(
        c.latency_ns_total.unwrap() > 0,
        "guest drives report latency"
    );

    // A limit through block_set_io_throttle, measured over the first control
    // interval (1 s) after it was set and over the two seconds after that.
    backend
        .apply_caps(
            &vm,
            &Caps {
                read_iops: Some(200.0),
                ..Caps::NONE
            },
        )
        .unwrap();
    let first_interval = iops(&mut backend, &vm, 1.0);
    let capped = iops(&mut backend, &vm, 2.0);
    eprintln!(
        "real guest (TCG): {uncapped:.0} IOPS uncapped; under a 200 IOPS QMP limit {first_interval:.0} in the first \
         1 s interval, {capped:.0} after"
    );
    assert!(
        first_interval <= 200.0 * 1.25,
        "the limit acts within one interval: {first_interval:.0} IOPS"
    );
    assert!(
        (200.0 * 0.5..=200.0 * 1.1).contains(&capped),
        "guest held near 200 IOPS: {capped:.0}"
    );

    // Paused: unavailable, not idle — and a controller carries on without it.
    guest.command("stop").unwrap();
    let err = backend.read_counters(&vm).unwrap_err();
    assert!(matches!(err, HostError::Unavailable(_)), "{err}");
    assert!(err.to_string().contains("paused"), "{err}");
    let guest_path = CostParams {
        rbps: 30e6,
        rseqiops: 7000.0,
        rrandiops: 7000.0,
        wbps: 30e6,
        wseqiops: 7000.0,
        wrandiops: 7000.0,
    };
    let ctx = PolicyContext {
        cost: CostModel::new(guest_path).unwrap(),
        capacity: 1.0,
    };
    let floor = policy::build(PolicyKind::Floor, &PolicyParams::default(), ctx);
    let mut controller = Controller::new(floor, vec![Arc::new(vm.clone())]);
    let report = controller.tick(Duration::from_secs(1), &mut backend);
    assert_eq!(report.samples[0].usage, None);
    assert!(
        report
            .errors
            .iter()
            .any(|(name, e)| name == "guest" && e.contains("paused")),
        "{:?}",
        report.errors
    );

    // Resumed: measured again, on the same backend, without reconnecting by hand.
    guest.command("cont").unwrap();
    backend.apply_caps(&vm, &Caps::NONE).unwrap();
    let resumed = iops(&mut backend, &vm, 1.0);
    assert!(resumed > 500.0, "guest runs again: {resumed:.0} IOPS");
}
