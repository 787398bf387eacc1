//! Saved run records say where they came from, and a record from a newer
//! iofloor is refused rather than half read.

use serde_json::Value;
use std::process::{Command, Output};

fn iofloor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iofloor"))
        .args(args)
        .output()
        .expect("run iofloor")
}

fn listing(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for e in walk(dir) {
        out.push((e.display().to_string(), std::fs::read(&e).unwrap()));
    }
    out.sort();
    out
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files.extend(walk(&p));
        } else {
            files.push(p);
        }
    }
    files
}

#[test]
fn records_carry_schema_and_environment_and_future_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = iofloor(&[
        "sim",
        "noisy-4",
        "--policy",
        "floor",
        "--time-scale",
        "0.05",
        "--out",
        d,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let record_path = dir.path().join("runs/floor.json");
    let mut record: Value = serde_json::from_slice(&std::fs::read(&record_path).unwrap()).unwrap();
    assert_eq!(record["schema_version"], 3);
    let env = &record["environment"];
    assert_eq!(env["testbed"], "simulator");
    assert_eq!(env["iofloor_version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(env["time_scale"], 0.05);
    assert!(env["policy_model"]["rrandiops"].as_f64().unwrap() > 0.0);
    assert!(env["policy_params"]["floor"]["target_utilisation"]
        .as_f64()
        .is_some());
    assert!(env["started_unix_s"].as_f64().unwrap() <= env["finished_unix_s"].as_f64().unwrap());

    // A record of the layout before versioning (no schema, no environment) still reads.
    let mut legacy = record.clone();
    legacy.as_object_mut().unwrap().remove("schema_version");
    legacy.as_object_mut().unwrap().remove("environment");
    std::fs::write(&record_path, serde_json::to_vec(&legacy).unwrap()).unwrap();
    let again = iofloor(&["report", d, "--json"]);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    // A newer schema: exit 2, the file and both versions named, nothing rewritten.
    record["schema_version"] = Value::from(99);
    record["windows"] = Value::from("a layout this build does not know");
    std::fs::write(&record_path, serde_json::to_vec(&record).unwrap()).unwrap();
    let before = listing(dir.path());
    let refused = iofloor(&["report", d]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(
        err.contains("floor.json") && err.contains("schema version 99") && err.contains("up to 3"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        listing(dir.path()),
        before,
        "a refused report writes nothing"
    );
}
