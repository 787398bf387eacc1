//! A real Prometheus server scraping `iofloor run` through a noisy-neighbour
//! run on the rig: the shipped alerting rules fire on the live series when
//! the floors stop fitting and clear when they fit again, and every panel
//! query of the shipped Grafana dashboard returns data.

use super::common::{real_environment, TestRig};
use super::harness::{config, free_port, Cgroups, Daemon};
use super::SERIAL;
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `prometheus` on a port of its own, scraping one target each second and
/// evaluating `rules` each second; killed (by PID) when dropped.
struct Prometheus {
    _dir: tempfile::TempDir,
    child: Child,
    port: u16,
}

impl Prometheus {
    fn start(target: &str, rules: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rules.yml"), rules).unwrap();
        std::fs::write(
            dir.path().join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files: [rules.yml]\n\
                 scrape_configs:\n  - job_name: iofloor\n    static_configs:\n      - targets: [\"{target}\"]\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let p = Prometheus {
            _dir: dir,
            child,
            port,
        };
        p.wait_until("Prometheus ready", Duration::from_secs(30), |p| {
            ureq::get(&format!("http://127.0.0.1:{}/-/ready", p.port))
                .call()
                .is_ok()
                .then_some(())
        });
        p
    }

    fn api(&self, path: &str) -> Value {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        let mut answer = ureq::get(&url)
            .call()
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        answer.body_mut().read_json().unwrap()
    }

    /// The instant vector `query` evaluates to now.
    fn query(&self, query: &str) -> Vec<Value> {
        let encoded: String = url_encode(query);
        let v = self.api(&format!("/api/v1/query?query={encoded}"));
        assert_eq!(v["status"], "success", "{query}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The alerts firing now, by name.
    fn firing(&self) -> Vec<String> {
        self.api("/api/v1/alerts")["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["state"] == "firing")
            .map(|a| a["labels"]["alertname"].as_str().unwrap_or("").to_string())
            .collect()
    }

    fn wait_until<T>(
        &self,
        what: &str,
        limit: Duration,
        f: impl Fn(&Prometheus) -> Option<T>,
    ) -> T {
        let started = Instant::now();
        loop {
            if let Some(t) = f(self) {
                return t;
            }
            assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tenant's floor's value as the daemon's API shows it (0 without one).
fn tenant_floor(daemon: &Daemon, name: &str) -> f64 {
    let (_, t) = daemon.get(&format!("/api/v1/tenants/{name}"));
    t["floor"]["value"].as_f64().unwrap_or(0.0)
}

/// A query string for a URL (RFC 3986 unreserved characters kept).
fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every `expr` of a Grafana dashboard, in panel order.
fn panel_queries(dashboard: &Value, out: &mut Vec<String>) {
    match dashboard {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", Value::String(e)) => out.push(e.clone()),
                    _ => panel_queries(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| panel_queries(v, out)),
        _ => {}
    }
}

/// Three tenants with floors in IOPS, bytes and a share of the device
/// beside a noisy one on a 1,000-IOPS rig, scraped each second by a real
/// Prometheus with the shipped rules (their `for` cut to seconds: the
/// durations themselves are promtool's unit tests). The floors are raised
/// past the device by a reload, and put back by another.
#[test]
fn a_real_prometheus_fires_the_shipped_alert_and_clears_it_and_every_panel_has_data() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment()
        || !iofloor_testbed::needs::require(
            "a_real_prometheus",
            &[
                iofloor_testbed::needs::Need::Program("prometheus"),
                iofloor_testbed::needs::Need::Program("fio"),
            ],
        )
    {
        return;
    }
    let rig = TestRig::up(1000);
    let mut cg = Cgroups::new("prom", &["db", "logs", "batch", "noisy"]);
    let tenants = |db_floor: &str| {
        format!(
            r#"
[[tenant]]
name = "db"
cgroup = "{{parent}}/db"
floor = "{db_floor}"
[[tenant]]
name = "logs"
cgroup = "{{parent}}/logs"
floor = "1MB/s"
[[tenant]]
name = "batch"
cgroup = "{{parent}}/batch"
floor = "10%"
[[tenant]]
name = "noisy"
cgroup = "{{parent}}/noisy"
"#
        )
    };
    let parent = cg.parent.clone();
    let text = |db_floor: &str| config(&rig.device, 1000, &parent, &tenants(db_floor));
    let daemon = Daemon::start(&text("300 IOPS"));
    let rules_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/prometheus/iofloor-alerts.yml");
    let rules = std::fs::read_to_string(&rules_path).unwrap();
    let fast_rules: String = rules
        .lines()
        .map(|l| match l.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 3s", &l[..l.len() - l.trim_start().len()]),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let target = daemon
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let prom = Prometheus::start(&target, &fast_rules);
    const SECS: u32 = 40;
    cg.fio(
        "db",
        &rig.device,
        "randread",
        "4k",
        1,
        Some(&format!("{}", 330 * 4096)),
        SECS,
    );
    cg.fio(
        "logs",
        &rig.device,
        "randread",
        "4k",
        1,
        Some("1100000"),
        SECS,
    );
    cg.fio(
        "batch",
        &rig.device,
        "randread",
        "4k",
        1,
        Some(&format!("{}", 110 * 4096)),
        SECS,
    );
    cg.fio("noisy", &rig.device, "randread", "4k", 16, None, SECS);
    let started = Instant::now();
    prom.wait_until(
        "the daemon scraped with its tenants",
        Duration::from_secs(30),
        |p| (p.query("iofloor_tenant_floor_met").len() >= 3).then_some(()),
    );
    std::thread::sleep(Duration::from_secs(8));
    let firing = prom.firing();
    assert!(
        !firing.iter().any(|a| a == "IofloorFloorsInfeasible"),
        "the floors fit: {firing:?}"
    );
    // db's floor past what the device can give, also past what the loop
    // may learn (twice the model): the floors no longer fit. (At 900 IOPS,
    // 1.24 of the model, the rig's bursts once let the loop learn 1.28 and
    // the floors fit on and off.)
    daemon.rewrite_config(&text("3000 IOPS"));
    let raised = started.elapsed();
    daemon.signal("HUP");
    let fired = prom.wait_until(
        "IofloorFloorsInfeasible firing",
        Duration::from_secs(30),
        |p| {
            p.firing()
                .iter()
                .any(|a| a == "IofloorFloorsInfeasible")
                .then(|| started.elapsed())
        },
    );
    let alert = prom.api("/api/v1/alerts")["data"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["labels"]["alertname"] == "IofloorFloorsInfeasible")
        .cloned()
        .unwrap();
    let device = std::fs::read_to_string(format!(
        "/sys/class/block/{}/dev",
        Path::new(&rig.device)
            .file_name()
            .unwrap()
            .to_string_lossy()
    ))
    .unwrap();
    assert_eq!(alert["labels"]["device"], device.trim(), "{alert}");
    assert_eq!(alert["labels"]["severity"], "critical", "{alert}");
    // A config that is refused (the running one stays), then the floors put back.
    daemon.rewrite_config(&text("-5 IOPS"));
    daemon.signal("HUP");
    std::thread::sleep(Duration::from_secs(2));
    daemon.rewrite_config(&text("300 IOPS"));
    daemon.signal("HUP");
    // The alert follows the series Prometheus scrapes: polled from once the
    // daemon says the floors fit again.
    let waited = Instant::now();
    loop {
        let (_, status) = daemon.get("/api/v1/status");
        if status["devices"][0]["floors_feasible"] == true && tenant_floor(&daemon, "db") == 300.0 {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "the floors fit again: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let cleared = prom.wait_until(
        "IofloorFloorsInfeasible cleared",
        Duration::from_secs(30),
        |p| (!p.firing().iter().any(|a| a == "IofloorFloorsInfeasible")).then(|| started.elapsed()),
    );
    // Cleared by the floors put back, not by the load's end.
    assert!(
        cleared < Duration::from_secs(SECS as u64 - 5),
        "cleared only at {cleared:?}, as the load ended"
    );
    let refused = prom.query(r#"iofloor_config_reloads_total{result="refused"}"#);
    assert!(
        refused
            .iter()
            .any(|r| r["value"][1].as_str().is_some_and(|v| v != "0")),
        "the bad config was refused: {refused:?}"
    );
    eprintln!(
        "IofloorFloorsInfeasible (its `for` cut to 3 s): floors raised {:.1} s into the load, fired at {:.1} s, floors put back and cleared at {:.1} s",
        raised.as_secs_f64(),
        fired.as_secs_f64(),
        cleared.as_secs_f64()
    );
    // Every panel of the dashboard, with its variables as "All" and a
    // range the run covers.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/grafana-dashboard.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut queries = Vec::new();
    panel_queries(&dashboard, &mut queries);
    assert!(queries.len() >= 20, "{queries:?}");
    // Per-tenant latency comes from backends that report it (QMP, libvirt,
    // BFQ's stats); blk-throttle on the rig's loop device gives none.
    let needs_latency_backend = ["iofloor_tenant_latency_seconds"];
    let mut empty = Vec::new();
    for q in &queries {
        let filled = q
            .replace("$device", ".*")
            .replace("$tenant", ".*")
            .replace("$__rate_interval", "10s")
            .replace("$__range", "5m");
        // A series the last scrapes brought (a reload's count) may need
        // one more scrape and evaluation to show.
        let mut result = prom.query(&filled);
        for _ in 0..10 {
            if !result.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
            result = prom.query(&filled);
        }
        eprintln!("  {} series: {q}", result.len());
        if result.is_empty() && !needs_latency_backend.iter().any(|m| q.contains(m)) {
            empty.push(q.clone());
        }
    }
    assert!(empty.is_empty(), "panels without data: {empty:#?}");
    // The load's rest is not needed: its fio ends with `cg`.
}
