//! End-to-end tests of the `iofloor` command.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn iofloor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iofloor"))
        .args(args)
        .output()
        .expect("run iofloor")
}

fn scenario(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios")
        .join(format!("{name}.toml"))
        .display()
        .to_string()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn sim_json_follows_the_contract() {
    let out = iofloor(&[
        "sim",
        "noisy-4",
        "--policy",
        "floor",
        "--policy",
        "top-throttle",
        "--json",
        "--time-scale",
        "0.1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
    assert_eq!(v["scenario"], "noisy-4");
    let policies = v["policies"].as_object().unwrap();
    // `none` is always run as the work-conservation reference.
    for p in ["none", "floor", "top-throttle"] {
        let m = &policies[p];
        for key in [
            "floor_miss_rate",
            "work_conservation",
            "protected_p99_ratio",
            "aggregate_iops",
            "aggregate_bytes_per_s",
            "decision_time_us_max",
        ] {
            assert!(m[key].is_number(), "{p}.{key} = {}", m[key]);
        }
        assert!(m["reaction_time_s"].is_number() || m["reaction_time_s"].is_null());
        let f = m["floor_miss_rate"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&f));
        let tenants = m["tenants"].as_array().unwrap();
        assert_eq!(tenants.len(), 4);
        for t in tenants {
            for key in ["floor_miss_rate", "min", "max", "avg", "p99_latency_ms"] {
                assert!(t[key].is_number(), "{p} tenant {key}");
            }
            assert!(t["name"].is_string() && t["class"] == "vm");
        }
    }
    assert_eq!(policies["none"]["work_conservation"], 1.0);
}

#[test]
fn results_directory_rebuilds_the_same_report() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = iofloor(&[
        "sim",
        &scenario("size-mix"),
        "--policy",
        "floor",
        "--time-scale",
        "0.1",
        "--out",
        d,
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    for f in [
        "summary.json",
        "report.md",
        "report.html",
        "runs/none.json",
        "runs/floor.json",
        "charts/floor-throughput.svg",
        "charts/floor-queue.svg",
        "charts/floor-floors.svg",
    ] {
        assert!(dir.path().join(f).exists(), "{f} missing");
    }
    let first: Value = serde_json::from_slice(&out.stdout).unwrap();
    std::fs::remove_file(dir.path().join("summary.json")).unwrap();
    let again = iofloor(&["report", d, "--json"]);
    assert!(again.status.success(), "{}", stderr(&again));
    let second: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(first, second);
    assert!(dir.path().join("summary.json").exists());
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("floor-miss"));
}

#[test]
fn a_seed_on_the_command_line_replaces_the_scenarios() {
    let run = |path: &str, seed: Option<&str>| {
        let mut args = vec![
            "sim",
            path,
            "--policy",
            "floor",
            "--json",
            "--time-scale",
            "0.2",
        ];
        if let Some(seed) = seed {
            args.extend(["--seed", seed]);
        }
        let out = iofloor(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        let mut v: Value = serde_json::from_slice(&out.stdout).unwrap();
        // Decision times are measured, not simulated.
        for p in ["none", "floor"] {
            let m = v["policies"][p].as_object_mut().unwrap();
            m.remove("decision_time_us_max");
            m.remove("decision_time_us_mean");
        }
        v["policies"].clone()
    };
    let shipped = scenario("stolen");
    let text = std::fs::read_to_string(&shipped).unwrap();
    assert!(text.contains("\nseed = 12\n"));
    let dir = tempfile::tempdir().unwrap();
    let reseeded = dir.path().join("stolen-5.toml");
    std::fs::write(&reseeded, text.replace("\nseed = 12\n", "\nseed = 5\n")).unwrap();
    let reseeded = reseeded.to_str().unwrap();
    let by_flag = run(&shipped, Some("5"));
    assert_eq!(
        by_flag,
        run(reseeded, None),
        "--seed 5 is the file's seed = 5"
    );
    assert_ne!(by_flag, run(&shipped, None), "another seed, another run");
    assert_eq!(run(reseeded, Some("12")), run(&shipped, None));
    let bad = iofloor(&["sim", &shipped, "--seed", "twelve"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("--seed"), "{}", stderr(&bad));
}

/// Runs `scripts/analysis/SCRIPT` with `args` on this build's binary.
fn analysis(script: &str, args: &[&str]) -> Output {
    Command::new("python3")
        .arg(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../scripts/analysis")
                .join(script),
        )
        .args(args)
        .env("IOFLOOR", env!("CARGO_BIN_EXE_iofloor"))
        .output()
        .expect("python3 runs")
}

#[test]
fn the_seeds_script_reports_each_seed_and_their_spread() {
    let out = analysis("seeds.py", &["on-off", "3", "4"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let seeds: Vec<&str> = lines[1..4]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(seeds, ["own", "3", "4"], "{text}");
    let wc = |line: &str| {
        line.split_whitespace()
            .nth(3)
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    let per_seed: Vec<f64> = lines[1..4].iter().map(|l| wc(l)).collect();
    let mean = per_seed.iter().sum::<f64>() / 3.0;
    assert!(lines[4].starts_with("  mean"), "{text}");
    assert!((wc(lines[4]) - mean).abs() < 0.002, "{text}");
    assert!(
        text.contains("3 seeds; a protected tenant above 2 % in 0"),
        "{text}"
    );
    let bad = analysis("seeds.py", &["on-off", "x"]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("whole numbers"), "{}", stderr(&bad));
}

#[test]
fn the_cap_oracle_paces_the_noisy_tenants_at_what_floor_gave_them() {
    let out = analysis("cap-oracle.py", &["paced", "on-off", "0.5", "1.0"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let wc = |prefix: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with(prefix)).unwrap();
        let after = line.split("work conservation ").nth(1).unwrap();
        after.split(',').next().unwrap().parse().unwrap()
    };
    // The same work as `floor`, paced: the device does what it did.
    let floor = wc("floor:");
    let paced = wc("paced at U 1.00");
    assert!((paced - floor).abs() < 0.03, "{text}");
    assert!(wc("paced at U 0.50") < paced - 0.1, "{text}");
    for (args, needle) in [
        (&["paced", "on-off", "x"][..], "shares must be numbers"),
        (&["paced", "on-off", "0"][..], "shares must be above 0"),
        (&["paced", "nosuch"][..], "no shipped scenario"),
    ] {
        let bad = analysis("cap-oracle.py", args);
        assert!(!bad.status.success(), "{args:?}");
        assert!(stderr(&bad).contains(needle), "{args:?}: {}", stderr(&bad));
    }
}

/// Writes `text` as a scenario file and runs `sim` on it; returns the output.
fn sim_text(text: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(&p, text).unwrap();
    iofloor(&["sim", p.to_str().unwrap(), "--policy", "floor"])
}

fn noisy4() -> String {
    std::fs::read_to_string(scenario("noisy-4")).unwrap()
}

#[track_caller]
fn assert_refused(out: &Output, needles: &[&str]) {
    assert_eq!(
        out.status.code(),
        Some(2),
        "exit code; stderr: {}",
        stderr(out)
    );
    let e = stderr(out);
    for n in needles {
        assert!(e.contains(n), "`{n}` not in: {e}");
    }
    assert!(!e.contains("panicked"), "{e}");
    assert!(out.stdout.is_empty(), "nothing on stdout for a refused run");
}

#[test]
fn bad_input_is_refused_with_the_field_and_line() {
    let base = noisy4();
    // Missing field.
    assert_refused(
        &sim_text(&base.replacen("duration = \"600s\"\n", "", 1)),
        &["bad.toml", "missing field `duration`"],
    );
    // Wrong unit: "10 MB/s" and "10MiB/s" parse; a bogus unit names field and line.
    let ok = sim_text(
        &base
            .replacen("floor = \"8MB/s\"", "floor = \"8 MB/s\"", 1)
            .replace("duration = \"600s\"", "duration = \"20s\""),
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
    let ok = sim_text(
        &base
            .replacen("floor = \"8MB/s\"", "floor = \"7.5MiB/s\"", 1)
            .replace("duration = \"600s\"", "duration = \"20s\""),
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert_refused(
        &sim_text(&base.replacen("floor = \"8MB/s\"", "floor = \"8 MBps\"", 1)),
        &["line 32", "floor = ", "no rate unit"],
    );
    // Negative and zero rates.
    assert_refused(
        &sim_text(&base.replacen("rate = \"8MB/s\"", "rate = \"-8MB/s\"", 1)),
        &["rate = ", "greater than zero"],
    );
    assert_refused(
        &sim_text(&base.replacen("floor = \"3MB/s\"", "floor = \"0iops\"", 1)),
        &["floor = ", "greater than zero"],
    );
    assert_refused(
        &sim_text(&base.replace("wrandiops = 2926", "wrandiops = 0")),
        &["device.wrandiops"],
    );
    // Unknown keys are errors.
    assert_refused(
        &sim_text(&base.replace("jitter = 0.1", "jitter = 0.1\njiter = 0.2")),
        &["unknown field `jiter`"],
    );
    // Floors that exceed the device: admission control says which.
    assert_refused(
        &sim_text(&base.replacen("floor = \"3MB/s\"", "floor = \"30MB/s\"", 1)),
        &["admission control", "cannot guarantee: vm4"],
    );
    // Not TOML at all.
    assert_refused(
        &sim_text("this is [not toml"),
        &["bad.toml", "TOML parse error"],
    );
}

#[test]
fn unknown_policy_and_scenario_are_refused() {
    let out = iofloor(&["sim", "noisy-4", "--policy", "fastest"]);
    assert_refused(&out, &["unknown policy `fastest`", "floor"]);
    let out = iofloor(&["sim", "noisy-4", "--policy", "iocost"]);
    assert_refused(
        &out,
        &["`iocost` is the kernel's own controller", "iofloor bench"],
    );
    let out = iofloor(&["sim", "no-such-scenario"]);
    assert_refused(&out, &["no-such-scenario", "noisy-4"]);
    let out = iofloor(&["sim", "noisy-4", "--time-scale", "0"]);
    assert_refused(&out, &["--time-scale"]);
    let out = iofloor(&["report", "/nonexistent/results"]);
    assert_refused(&out, &["/nonexistent/results"]);
}

#[test]
fn admission_control_reports_per_tenant() {
    let out = iofloor(&["admit", "noisy-20", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["admitted"], true);
    assert_eq!(v["tenants"].as_array().unwrap().len(), 20);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("over.toml");
    std::fs::write(
        &p,
        noisy4().replacen("floor = \"6MB/s\"", "floor = \"60%\"", 1),
    )
    .unwrap();
    let out = iofloor(&["admit", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("vm3") && text.contains("NOT guaranteed"),
        "{text}"
    );
}

#[test]
fn run_refuses_a_bad_config_with_file_line_and_key_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let good = format!(
        "state_file = \"{}/state.json\"\n[api]\nlisten = \"off\"\n[[device]]\nid = \"7:0\"\n\
         model = {{ rbps = 1e9, rseqiops = 1e3, rrandiops = 1e3, wbps = 1e9, wseqiops = 1e3, wrandiops = 1e3 }}\n\
         [[tenant]]\nname = \"a\"\ncgroup = \"a\"\nfloor = \"100 IOPS\"\n",
        dir.path().display()
    );
    let path = dir.path().join("iofloor.toml");
    let path_text = path.to_str().unwrap();
    std::fs::write(&path, &good).unwrap();
    let o = iofloor(&["run", "--config", path_text, "--check"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout)
        .contains("ok (1 devices, 1 tenant entries, policy floor)"));
    // A trusted runtime's own entry is counted apart from the file's.
    let with_runtime = dir.path().join("runtime.toml");
    std::fs::write(
        &with_runtime,
        format!("{good}[[runtime]]\nname = \"podman\"\nsocket = \"/run/podman/podman.sock\"\ntrust_labels = true\n"),
    )
    .unwrap();
    let o = iofloor(&["run", "--config", with_runtime.to_str().unwrap(), "--check"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(
            "ok (1 devices, 1 tenant entries, 1 container runtimes (1 whose labelled containers are tenants), policy floor)"
        ),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );

    for (edit, needle) in [
        (
            good.replace("floor = \"100 IOPS\"", "floor = \"100 IOPZ\""),
            "iofloor.toml:10: `tenant[0].floor`",
        ),
        (
            good.replace(
                "floor = \"100 IOPS\"",
                "floor = \"100 IOPS\"\nceilin = \"5 IOPS\"",
            ),
            "iofloor.toml:11: `tenant[0].ceilin`: unknown field",
        ),
        (
            good.replace("id = \"7:0\"", "id = \"seven\""),
            "iofloor.toml:4: `device[0].id`",
        ),
        (
            good.replace("[api]\nlisten = \"off\"", "[api]\nlisten = \"here\""),
            "iofloor.toml:2: `api.listen`",
        ),
    ] {
        std::fs::write(&path, edit).unwrap();
        for args in [
            &["run", "--config", path_text, "--check"][..],
            &["run", "--config", path_text],
        ] {
            let o = iofloor(args);
            assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
            assert!(stderr(&o).contains(needle), "want {needle}: {}", stderr(&o));
        }
        assert!(!dir.path().join("state.json").exists(), "nothing created");
    }
    let o = iofloor(&["run", "--config", "/nonexistent/iofloor.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("/nonexistent/iofloor.toml"),
        "{}",
        stderr(&o)
    );
}

/// `iofloor guest` refuses bad input before it boots anything: exit 2, the
/// flag named, no state left.
#[test]
fn guest_refuses_bad_input_before_booting() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().to_str().unwrap();
    for (args, says) in [
        (
            vec!["guest", "up", "--iops", "0", "--state-dir", dir],
            "--iops",
        ),
        (
            vec![
                "guest",
                "up",
                "--iops",
                "500",
                "--memory",
                "64",
                "--state-dir",
                dir,
            ],
            "--memory",
        ),
        (
            vec!["guest", "up", "--iops", "500", "--state-dir", "guests"],
            "must be an absolute path",
        ),
        (
            vec!["guest", "exec", "--state-dir", dir, "--", "true"],
            "no guest under",
        ),
        (
            vec![
                "guest",
                "exec",
                "--timeout",
                "0",
                "--state-dir",
                dir,
                "--",
                "true",
            ],
            "--timeout",
        ),
        (
            vec!["guest", "set", "--iops", "500", "--state-dir", dir],
            "no guest under",
        ),
    ] {
        let out = iofloor(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(std::fs::read_dir(state.path()).unwrap().count(), 0);
}

/// The shipped alerting rules load in Prometheus's own checker, their
/// unit tests pass (an alert fires when its condition lasts and not before),
/// and every iofloor metric they use is one the daemon exports (as
/// docs/metrics.md lists them).
#[test]
fn the_alerting_rules_pass_promtool_and_use_exported_metrics() {
    if !iofloor_testbed::needs::require(
        "the_alerting_rules_pass_promtool",
        &[iofloor_testbed::needs::Need::Program("promtool")],
    ) {
        return;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/prometheus");
    for args in [
        ["check", "rules", "iofloor-alerts.yml"],
        ["test", "rules", "iofloor-alerts.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let rules = std::fs::read_to_string(dir.join("iofloor-alerts.yml")).unwrap();
    let documented = std::fs::read_to_string(dir.join("../../docs/metrics.md")).unwrap();
    let mut used: Vec<&str> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("iofloor_"))
        .collect();
    used.sort();
    used.dedup();
    assert!(used.len() >= 6, "{used:?}");
    for metric in used {
        assert!(
            documented.contains(&format!("`{metric}")),
            "{metric} is not a metric docs/metrics.md lists"
        );
    }
}
