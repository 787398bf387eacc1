//! `iofloor run` with a VM that libvirt keeps: a real libvirtd (started here
//! if none runs) and a transient QEMU domain (TCG) whose disk is the rig,
//! beside a noisy container on the same rig. The domain is found by name
//! through libvirt's API, its disk measured (with latency) from libvirt's
//! block stats, its floor (one for the VM, `share = "vm"`) kept against the
//! container, judged by the domain's own counters as `virsh domblkstat`
//! reads them each second; the domain unavailable while paused; a domain
//! libvirt does not have logged once; its limits put back when the daemon
//! stops, an operator's own among them.

use super::common::{real_environment, TestRig};
use super::harness::{config, Cgroups, Daemon};
use super::{tenant, SERIAL};
use iofloor_testbed::libvirt::{self, Domain};
use std::time::{Duration, Instant};

/// The domain disk's read operations, as libvirt counts them.
fn rd_req(domain: &str, disk: &str) -> u64 {
    libvirt::virsh(&["domblkstat", domain, disk])
        .unwrap()
        .lines()
        .find_map(|l| {
            l.split_once(" rd_req ")
                .map(|(_, v)| v.trim().parse().unwrap())
        })
        .unwrap()
}

/// The disk's IOPS in each whole second while a container runs `secs`
/// seconds of deep-queue reads beside it (the first 3 s and the last one
/// left out: the container starting and stopping).
fn vm_iops_under_load(cg: &mut Cgroups, device: &str, domain: &str, secs: u32) -> Vec<f64> {
    cg.fio("box", device, "randread", "4k", 32, None, secs);
    let mut out = Vec::new();
    let started = Instant::now();
    let mut last = rd_req(domain, "vda");
    for s in 1..secs {
        std::thread::sleep(
            (started + Duration::from_secs(s as u64)).saturating_duration_since(Instant::now()),
        );
        let now = rd_req(domain, "vda");
        if s > 3 {
            out.push((now - last) as f64);
        }
        last = now;
    }
    cg.wait_fio();
    out
}

#[test]
fn a_libvirt_domain_keeps_its_floor_beside_a_container_and_gets_its_limits_back() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment() {
        return;
    }
    use iofloor_testbed::needs::{require, Need};
    let image = iofloor_testbed::guest::image_dir();
    if !require(
        "a_libvirt_domain",
        &[
            Need::Program("qemu-system-x86_64"),
            Need::Program("virsh"),
            Need::Program("libvirtd"),
            Need::File(image.join("vmlinuz")),
            Need::File(image.join("initramfs.gz")),
        ],
    ) {
        return;
    }
    let _libvirtd = libvirt::Daemon::ensure().unwrap();
    let rig = TestRig::up(1500);
    let dir = tempfile::tempdir().unwrap();
    let name = format!("iofloor-e2e-{}", std::process::id());
    let domain = Domain::boot(&name, dir.path(), &[std::path::PathBuf::from(&rig.device)]).unwrap();
    // An operator's own limit, well above what the rig gives: put back on stop.
    domain.set_total_iops("vda", 9000).unwrap();
    let mut cg = Cgroups::new("libvirt", &["box"]);
    let tenants = format!(
        r#"
[[tenant]]
name = "box"
cgroup = "{{parent}}/box"

[[tenant]]
name = "vm"
libvirt = "{name}"
share = "vm"
floor = "300 IOPS"

[[tenant]]
name = "absent"
libvirt = "iofloor-no-such-domain"
floor = "100 IOPS"
"#
    );
    let text = config(&rig.device, 1500, &cg.parent, &tenants);
    // The same load under `none` first: the container takes the VM's floor.
    let watched = Daemon::start(&text.replace("[api]", "[policy]\nkind = \"none\"\n\n[api]"));
    watched.wait_for("the VM's disk found", Duration::from_secs(15), |v| {
        tenant(v, "vm/vda")["usage"].is_object()
    });
    let none = vm_iops_under_load(&mut cg, &rig.device, &name, 15);
    drop(watched);

    let mut daemon = Daemon::start(&text);
    let v = daemon.wait_for("the VM's disk measured", Duration::from_secs(15), |v| {
        tenant(v, "vm/vda")["usage"]["latency_us"].is_number()
    });
    let disk = tenant(&v, "vm/vda");
    assert_eq!(disk["source"], "libvirt");
    assert_eq!(disk["class"], "vm");
    assert_eq!(
        disk["groups"],
        serde_json::json!(["vm"]),
        "one group for the VM: {disk}"
    );
    let kept = vm_iops_under_load(&mut cg, &rig.device, &name, 25);
    let met = |iops: &[f64]| iops.iter().filter(|&&i| i >= 0.95 * 300.0).count();
    eprintln!(
        "libvirt domain beside a QD-32 container, VM floor 300 IOPS (virsh domblkstat each second): \
         floor met in {}/{} windows {kept:?}; under `none` {}/{} {none:?}",
        met(&kept),
        kept.len(),
        met(&none),
        none.len()
    );
    assert!(
        kept.len() >= 15 && met(&kept) as f64 >= 0.9 * kept.len() as f64,
        "the VM's floor held: {}/{}",
        met(&kept),
        kept.len()
    );
    assert!(
        (met(&none) as f64) < 0.5 * none.len() as f64,
        "without control the container takes the VM's floor: {none:?}"
    );

    domain.suspend().unwrap();
    daemon.wait_for("the paused VM unavailable", Duration::from_secs(10), |v| {
        tenant(v, "vm/vda")["available"] == false
            && tenant(v, "vm/vda")["error"]
                .as_str()
                .is_some_and(|e| e.contains("paused"))
    });
    domain.resume().unwrap();
    daemon.wait_for("the VM back", Duration::from_secs(10), |v| {
        tenant(v, "vm/vda")["available"] == true
    });

    // The floor is the VM's: a disk's own is refused over the API.
    let (code, body) = daemon.send(
        "PATCH",
        "/api/v1/tenants/vm/vda",
        r#"{"floor": "100 IOPS"}"#,
        Some("let-me-in"),
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.to_string().contains("are its VM's"), "{body}");

    // A domain libvirt does not have: logged once, the others unaffected.
    let log = daemon.log_text();
    assert_eq!(
        log.matches("libvirt has no running domain `iofloor-no-such-domain`")
            .count(),
        1,
        "{log}"
    );
    let (status, _) = daemon.terminate();
    assert!(status.success(), "{}", daemon.log_text());
    let tune = domain.io_tune("vda").unwrap();
    let field = |k: &str| {
        tune.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(
        field("total_iops_sec"),
        "9000",
        "the operator's limit is back: {tune:?}"
    );
    for k in [
        "read_iops_sec",
        "write_iops_sec",
        "read_bytes_sec",
        "write_bytes_sec",
    ] {
        assert_eq!(field(k), "0", "{k} restored: {tune:?}");
    }
}
