//! Replays every fuzz target's corpus and its regressions (inputs that once
//! crashed it) in `cargo test`, so a fixed crash stays fixed without AFL; and
//! keeps the seeds written by iofloor's own encoders equal to what they
//! write today (`IOFLOOR_RECORD_SEEDS=1 cargo test -p iofloor-fuzz` rewrites
//! them after a format change).

use iofloor_cluster::wire::{Allocation, FloorSetting, HostReport, TenantReport, SCHEMA};
use iofloor_core::model::TenantClass;
use iofloor_core::{Caps, DeviceSample, Rate, TenantSpec};
use iofloor_daemon::ownership::{Entry, Original, Ownership};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join(kind).join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("corpus folder readable").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_seed_and_regression_passes_its_target() {
    let mut failed = Vec::new();
    for (name, target) in iofloor_fuzz::TARGETS {
        let seeds = inputs("corpus", name);
        let regressions = inputs("regressions", name);
        let (mut accepted, mut seeds_accepted) = (0, 0);
        for (n, file) in seeds.iter().chain(&regressions).enumerate() {
            let data = std::fs::read(file).expect("corpus file readable");
            match catch_unwind(AssertUnwindSafe(|| target(&data))) {
                Ok(true) => {
                    accepted += 1;
                    if n < seeds.len() {
                        seeds_accepted += 1;
                    }
                }
                Ok(false) => {}
                Err(_) => failed.push(format!("{} panicked", file.display())),
            }
        }
        // Seeds that no parser takes would leave the fuzzer at the syntax
        // checks: each target needs inputs that reach past them.
        if seeds_accepted == 0 {
            failed.push(format!("no seed of `{name}` is accepted by its parser"));
        }
        eprintln!(
            "{name}: {} seeds, {} regressions, {accepted} accepted",
            seeds.len(),
            regressions.len()
        );
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Seeds that iofloor itself writes: etcd values, a state file, API bodies
/// and unit strings, made with the code that makes them in the service.
fn generated_seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut quiet = TenantSpec::new("quiet", TenantClass::Container);
    quiet.floor = Some(Rate::Iops(750.0));
    let mut vm = TenantSpec::new("vm1", TenantClass::Vm);
    vm.floor = Some(Rate::BytesPerSec(20e6));
    vm.ceiling = Some(Rate::Cost(0.5));
    vm.weight = 2.0;
    let caps = Caps {
        read_iops: Some(1200.0),
        write_iops: Some(400.0),
        read_bps: None,
        write_bps: Some(50e6),
    };
    let report = HostReport {
        schema: SCHEMA,
        host: "h1".into(),
        device: "shared".into(),
        seq: 42,
        interval_s: 1.0,
        local_device: Some(DeviceSample {
            utilisation: 0.93,
            avg_queue: 3.5,
            iops: 2750.0,
        }),
        tenants: vec![
            TenantReport {
                spec: quiet,
                usage: Some(iofloor_core::synthetic::random_reads_4k(740.0)),
                caps: Caps::NONE,
            },
            TenantReport {
                spec: vm,
                usage: None,
                caps,
            },
        ],
    };
    let allocation = Allocation {
        schema: SCHEMA,
        host: "h1".into(),
        device: "shared".into(),
        epoch: 7,
        seq: 42,
        interval_s: 1.0,
        capacity: 0.85,
        floors: 0.55,
        hosts: 3,
        caps: vec![("quiet".into(), Caps::NONE), ("vm1".into(), caps)],
        load: 0.3,
        contended: Some(true),
    };
    let floor = |floor| FloorSetting {
        schema: SCHEMA,
        tenant: "t1".into(),
        floor,
    };

    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let mut owned = Ownership::create(&state).unwrap();
    owned
        .record(Entry {
            tenant: "web".into(),
            original: Original::Cgroup {
                root: "/sys/fs/cgroup/blkio".into(),
                cgroup: "tenants/web".into(),
                device: iofloor_host::DevId { major: 7, minor: 0 },
                caps,
            },
        })
        .unwrap();
    owned
        .record(Entry {
            tenant: "vm1".into(),
            original: Original::Qmp {
                socket: "/run/vm1.qmp".into(),
                drive: "/machine/peripheral/disk0/virtio-backend".into(),
                limits: serde_json::json!({"iops_rd": 0, "iops_wr": 500, "bps": 0}),
            },
        })
        .unwrap();
    // The pid in it is the test's: a fixed one keeps the seed stable.
    let mut state_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    state_json["pid"] = 4242.into();
    let state_text = serde_json::to_vec_pretty(&state_json).unwrap();

    let mut seeds = vec![
        ("etcd_value", "host-report.json", report.encode()),
        ("etcd_value", "allocation.json", allocation.encode()),
        (
            "etcd_value",
            "floor-setting.json",
            floor(Some(Rate::Iops(500.0))).encode(),
        ),
        ("etcd_value", "floor-cleared.json", floor(None).encode()),
        ("state_file", "state.json", state_text),
    ];
    for (name, body) in [
        ("floor", r#"{"floor": "500iops"}"#),
        ("clear", r#"{"floor": null, "ceiling": null}"#),
        (
            "all",
            r#"{"floor": "10MiB/s", "ceiling": "50%", "weight": 2.5}"#,
        ),
    ] {
        seeds.push(("api_body", name, body.as_bytes().to_vec()));
    }
    for (name, text) in [
        ("iops", "2k iops"),
        ("bandwidth", "800KB/s"),
        ("share", "25%"),
        ("cost", "0.25cost"),
        ("size", "64KiB"),
        ("duration", "100ms"),
    ] {
        seeds.push(("units", name, text.as_bytes().to_vec()));
    }
    seeds
}

#[test]
fn seeds_iofloor_writes_are_what_it_writes_today() {
    let record = std::env::var_os("IOFLOOR_RECORD_SEEDS").is_some();
    let mut stale = Vec::new();
    for (target, name, bytes) in generated_seeds() {
        let path = fuzz_dir().join("corpus").join(target).join(name);
        if record {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        } else if std::fs::read(&path).ok().as_deref() != Some(&bytes[..]) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "seeds differ from what iofloor writes now (rerun with IOFLOOR_RECORD_SEEDS=1): {}",
        stale.join(", ")
    );
}
