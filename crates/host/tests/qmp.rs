//! The QMP backend against a real qemu-storage-daemon (QEMU's block layer and
//! throttle group, controlled over QMP), with real fio through its FUSE export;
//! and against a fake monitor that answers garbage.

use iofloor_core::{Backend, Caps, TenantClass, TenantSpec};
use iofloor_host::backends::qmp::{QmpBackend, QmpTarget};
use iofloor_host::fio::FioJob;
use iofloor_testbed::rig::{Rig, RigSpec};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn real_environment() -> bool {
    let test = std::thread::current().name().unwrap_or("qmp").to_string();
    iofloor_testbed::needs::require(&test, &iofloor_testbed::needs::real_kernel())
}

fn fio(dev: &Path, out: &Path, secs: f64) -> f64 {
    FioJob::new("vm", dev, "randread", 4096, 8, secs, out.to_path_buf())
        .run()
        .unwrap()
        .jobs[0]
        .read
        .iops
}

#[test]
fn qmp_backend_throttles_a_real_qemu_throttle_group() {
    if !real_environment() {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let rig = Rig::up(
        RigSpec {
            iops: 3000,
            bps: None,
            size_unit: None,
            size: 128 << 20,
        },
        state.path(),
    )
    .unwrap();
    struct Down<'a>(&'a Path);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = Rig::down_all(self.0);
        }
    }
    let _down = Down(state.path());
    let dev = rig.device.clone().unwrap();
    let tmp = tempfile::tempdir().unwrap();

    let vm = TenantSpec::new("vm1", TenantClass::Vm);
    let mut qmp = QmpBackend::new(Duration::from_secs(2));
    let stats_device = iofloor_host::DevId::of_block_device(&dev).unwrap();
    qmp.add_tenant(
        "vm1",
        &rig.socket,
        QmpTarget::Group {
            group: "dev".into(),
            stats_device,
        },
    );
    let before = qmp.read_counters(&vm).unwrap();
    let uncapped = fio(&dev, &tmp.path().join("a.json"), 2.0);
    let after = qmp.read_counters(&vm).unwrap();
    let ios = after.read_ios - before.read_ios;
    assert!(
        ios as f64 >= uncapped * 1.5,
        "counted {ios} reads, fio did {uncapped} IOPS for 2 s"
    );
    let lat =
        (after.latency_ns_total.unwrap() - before.latency_ns_total.unwrap()) as f64 / ios as f64;
    assert!(lat > 0.0, "VMs report latency");

    // A QMP limit: the VM's reads held at 300 IOPS by QEMU's throttle group.
    qmp.apply_caps(
        &vm,
        &Caps {
            read_iops: Some(300.0),
            ..Caps::NONE
        },
    )
    .unwrap();
    let capped = fio(&dev, &tmp.path().join("b.json"), 2.0);
    eprintln!("QMP throttle: {uncapped:.0} IOPS uncapped, {capped:.0} under a 300 IOPS limit");
    assert!(
        capped <= 300.0 * 1.15 && capped < uncapped * 0.5,
        "capped {capped}, uncapped {uncapped}"
    );

    // Time to effect within a running load: sample blockstats every 50 ms.
    qmp.apply_caps(&vm, &Caps::NONE).unwrap();
    let job_dev = dev.clone();
    let out = tmp.path().join("c.json");
    let load = std::thread::spawn(move || fio(&job_dev, &out, 3.0));
    std::thread::sleep(Duration::from_millis(1000));
    let written = Instant::now();
    qmp.apply_caps(
        &vm,
        &Caps {
            read_iops: Some(300.0),
            ..Caps::NONE
        },
    )
    .unwrap();
    let mut samples = Vec::new();
    while written.elapsed() < Duration::from_millis(1500) {
        samples.push((Instant::now(), qmp.read_counters(&vm).unwrap().read_ios));
        std::thread::sleep(Duration::from_millis(50));
    }
    load.join().unwrap();
    let lag = samples
        .windows(5)
        .find(|w| (w[4].1 - w[0].1) as f64 / (w[4].0 - w[0].0).as_secs_f64() <= 360.0)
        .map(|w| (w[0].0 - written).as_secs_f64());
    eprintln!("QMP limit took effect after {:?} s", lag);
    assert!(
        lag.is_some(),
        "the QMP limit never took effect within 1.5 s"
    );

    // QEMU killed mid-run: setting limits fails with a message naming the
    // socket, no panic, and keeps failing (the tenant is unavailable).
    let pid = rig.qsd_pid.unwrap();
    Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for _ in 0..2 {
        let e = qmp.apply_caps(&vm, &Caps::NONE).unwrap_err().to_string();
        assert!(e.contains(rig.socket.to_str().unwrap()), "{e}");
    }
    // Even with its daemon killed, the rig comes down completely.
    Rig::down_all(state.path()).unwrap();
    let name = dev.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        !Path::new(&format!("/sys/block/{name}/loop/backing_file")).exists(),
        "{name} still attached"
    );
    assert!(!rig.dir.exists());
}

#[test]
fn garbage_closed_and_unknown_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("fake.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    // A fake monitor: a greeting, a running VM without our drive, then garbage; then it hangs up.
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        writeln!(
            s,
            "{{\"QMP\": {{\"version\": {{}}, \"capabilities\": []}}}}"
        )
        .unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let running = "{\"return\": {\"status\": \"running\", \"running\": true}}";
        for reply in [
            "{\"return\": {}}",
            running,
            "{\"return\": []}",
            "this is not json",
        ] {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            writeln!(s, "{reply}").unwrap();
        }
    });
    let vm = TenantSpec::new("vm", TenantClass::Vm);
    let mut qmp = QmpBackend::new(Duration::from_secs(2));
    qmp.add_tenant(
        "vm",
        &sock,
        QmpTarget::Drive {
            id: "drive0".into(),
        },
    );
    // An answer without our drive.
    let e = qmp.read_counters(&vm).unwrap_err().to_string();
    assert!(e.contains("no block device") && e.contains("drive0"), "{e}");
    // Garbage.
    let e = qmp.read_counters(&vm).unwrap_err().to_string();
    assert!(e.contains("answered garbage"), "{e}");
    server.join().unwrap();
    // Nobody listening any more.
    assert!(qmp.read_counters(&vm).is_err());
    // A tenant the backend does not know.
    let e = qmp
        .read_counters(&TenantSpec::new("ghost", TenantClass::Vm))
        .unwrap_err()
        .to_string();
    assert!(e.contains("ghost"), "{e}");
}

#[test]
fn a_monitor_that_hangs_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("slow.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    // Greets, then never answers, until the test is over.
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        writeln!(
            s,
            "{{\"QMP\": {{\"version\": {{}}, \"capabilities\": []}}}}"
        )
        .unwrap();
        let _ = wait.recv();
    });
    let mut qmp = QmpBackend::new(Duration::from_millis(300));
    qmp.add_tenant(
        "vm",
        &sock,
        QmpTarget::Drive {
            id: "drive0".into(),
        },
    );
    // Without the timeout this would block for as long as the monitor hangs.
    let e = qmp
        .read_counters(&TenantSpec::new("vm", TenantClass::Vm))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("slow.sock") && (e.contains("os error 11") || e.contains("timed out")),
        "{e}"
    );
    done.send(()).unwrap();
    server.join().unwrap();
}
