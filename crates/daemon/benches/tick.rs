//! The daemon's control interval at scale: discovery of N cgroup v2 tenants
//! (a recorded `io` tree in a temporary directory, since this machine has no
//! v2 io controller), reading each one's `io.stat`, the `floor` policy's
//! decision, writing `io.max` where caps change, and publishing the view and
//! the metrics. Between intervals every tenant's counters grow (one tenant
//! in ten is noisy), outside the timed part.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use iofloor_daemon::config::Config;
use iofloor_daemon::metrics::Metrics;
use iofloor_daemon::service::{Service, Shared};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A present block device (the service skips a device that is gone): the
/// first non-loop disk with a size, as MAJ:MIN.
fn present_device() -> String {
    let mut found = None;
    for e in std::fs::read_dir("/sys/block")
        .expect("/sys/block")
        .flatten()
    {
        let name = e.file_name().to_string_lossy().to_string();
        let size: u64 = std::fs::read_to_string(e.path().join("size"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if size > 0 && !name.starts_with("loop") && !name.starts_with("ram") {
            found = std::fs::read_to_string(e.path().join("dev")).ok();
            break;
        }
    }
    found
        .expect("a block device with a size in /sys/block")
        .trim()
        .to_string()
}

struct Tree {
    dir: tempfile::TempDir,
    dev: String,
    tenants: usize,
    round: u64,
}

impl Tree {
    fn new(tenants: usize, dev: &str) -> Tree {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("cgroup.controllers"),
            "cpu io memory pids\n",
        )
        .unwrap();
        for i in 0..tenants {
            let cg = dir.path().join(format!("t{i}"));
            std::fs::create_dir(&cg).unwrap();
            std::fs::write(cg.join("io.max"), "").unwrap();
        }
        let mut tree = Tree {
            dir,
            dev: dev.to_string(),
            tenants,
            round: 0,
        };
        tree.advance();
        tree
    }

    /// One second of I/O: 100 random 4 KiB reads per tenant, 5,000 for every tenth.
    fn advance(&mut self) {
        self.round += 1;
        for i in 0..self.tenants {
            let per_s = if i % 10 == 0 { 5_000 } else { 100 };
            let ios = per_s * self.round;
            let stat = format!(
                "{} rbytes={} wbytes=0 rios={ios} wios=0 dbytes=0 dios=0\n",
                self.dev,
                ios * 4096
            );
            std::fs::write(self.dir.path().join(format!("t{i}/io.stat")), stat).unwrap();
        }
    }

    fn config(&self) -> Config {
        let root = self.dir.path();
        let text = format!(
            r#"interval = "1s"
state_file = "{state}"
cgroup_root = "{root}"
[api]
listen = "off"
[[device]]
id = "{dev}"
[device.model]
rbps = 100e9
rseqiops = 10e6
rrandiops = 10e6
wbps = 100e9
wseqiops = 10e6
wrandiops = 10e6
[[tenant]]
name = "t"
cgroup = "t*"
floor = "100 IOPS"
"#,
            state = root.join("state.json").display(),
            root = root.display(),
            dev = self.dev,
        );
        Config::parse(&text, &root.join("iofloor.toml")).expect("the bench config parses")
    }
}

fn service(config: Config) -> Service {
    let (ticks, _) = tokio::sync::broadcast::channel(16);
    let shared = Arc::new(Shared {
        view: Mutex::new(Service::initial_view(&config)),
        metrics: Metrics::new("bench"),
        ticks,
        token: Mutex::new(None),
        cluster: None,
    });
    Service::new(config, shared).expect("the service starts on the recorded tree")
}

fn bench(c: &mut Criterion) {
    let dev = present_device();
    let mut group = c.benchmark_group("daemon_tick");
    group.sample_size(10);
    for tenants in [100usize, 1_000, 10_000] {
        let mut tree = Tree::new(tenants, &dev);
        let mut svc = service(tree.config());
        // Adoption of every tenant, then a first interval with counters.
        let mut now = Duration::ZERO;
        svc.step(now);
        now += Duration::from_secs(1);
        tree.advance();
        svc.step(now);
        assert!(Path::new(&tree.dir.path().join("state.json")).exists());
        group.bench_function(format!("{tenants}"), |b| {
            b.iter_batched(
                || {
                    tree.advance();
                    now += Duration::from_secs(1);
                    now
                },
                |at| svc.step(at),
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // No plots: plotters here is built without system fonts.
    config = Criterion::default().without_plots();
    targets = bench
}
criterion_main!(benches);
