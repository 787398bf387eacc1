//! iofloor-bench: the fio scenario runner. It plays a scenario file (the same
//! format the simulator reads) on a real block device: one cgroup per tenant,
//! fio processes started and stopped on the scenario's schedule inside them,
//! the chosen policy driven live through the cgroup backend at the control
//! interval, and per-second per-tenant series recorded from the cgroup
//! counters, /proc/diskstats and fio's per-I/O latency logs. Raw records come
//! first; the measures and reports are the simulator's (iofloor-report), so
//! the two compare and a report can be rebuilt from a results directory.
//! Everything it creates — cgroups, fio processes, throttles — is removed at
//! the end, on error and on Ctrl-C.

pub mod calibrate;
pub mod lag;
mod session;

use hdrhistogram::Histogram;
use iofloor_core::control::Controller;
use iofloor_core::cost::CostModel;
use iofloor_core::policy::{self, PolicyContext, PolicyKind};
use iofloor_core::units::{Rate, RateUnit};
use iofloor_core::Backend;
use iofloor_core::{Counters, DirUsage, Usage};
use iofloor_host::cgroup::{self, DevId};
use iofloor_host::diskstats::{DiskStat, DiskStats};
use iofloor_host::fio::{self, FioJob};
use iofloor_host::qmp_backend::{HybridBackend, QmpBackend, QmpTarget};
use iofloor_host::CgroupBackend;
use iofloor_report::record::{
    DeviceWindow, LatencySummary, RunRecord, TenantInfo, TenantWindow, Throughput, Window,
};
use iofloor_sim::scenario::{Job, Scenario};
use session::Session;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Bad input or an unusable machine: exit code 2.
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Host(#[from] iofloor_host::HostError),
    #[error("{0}")]
    Failed(String),
    #[error("interrupted")]
    Interrupted,
}

pub type Result<T> = std::result::Result<T, BenchError>;

/// How to run a scenario on a device.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub device: PathBuf,
    pub policies: Vec<PolicyKind>,
    pub cgroup_root: PathBuf,
    /// fio outputs and latency logs go here.
    pub work_dir: PathBuf,
    /// The cost model policies use; default: the scenario's device model.
    pub model: Option<CostModel>,
    /// Length of each protected tenant's alone run (its p99 baseline).
    pub alone: Duration,
    /// Idle time between runs, so one run's queue does not leak into the next.
    pub settle: Duration,
    /// Run VM tenants through QEMU's block layer (a qemu-storage-daemon per
    /// VM over the shared device, throttled over QMP) instead of as cgroups.
    pub vm_paths: bool,
}

/// Checks what a run needs and says clearly what is missing.
pub fn preflight(scenario: &Scenario, opts: &BenchOptions) -> Result<DevId> {
    if !rustix::process::geteuid().is_root() {
        return Err(BenchError::Invalid(
            "iofloor bench needs root (it creates cgroups and sets throttles)".into(),
        ));
    }
    let dev =
        DevId::of_block_device(&opts.device).map_err(|e| BenchError::Invalid(e.to_string()))?;
    cgroup::detect(&opts.cgroup_root).map_err(|e| BenchError::Invalid(e.to_string()))?;
    fio::check_version().map_err(|e| BenchError::Invalid(e.to_string()))?;
    let model = opts.model.unwrap_or(scenario.policy_model);
    let mixes: Vec<_> = scenario
        .tenants
        .iter()
        .map(|t| (&t.spec, scenario.expected_mix(t)))
        .collect();
    let verdict =
        iofloor_core::admission::check(&model, scenario.policy.floor.target_utilisation, &mixes);
    if !verdict.admitted {
        return Err(BenchError::Invalid(format!(
            "{}: admission control: {}",
            scenario.name,
            verdict.summary()
        )));
    }
    Ok(dev)
}

/// Total wall time a bench will take, for progress reporting.
pub fn planned_time(scenario: &Scenario, opts: &BenchOptions) -> Duration {
    let runs = policies_with_reference(&opts.policies).len() as u32;
    let alone = scenario.tenants.len() as u32;
    (scenario.duration + opts.settle) * runs
        + (opts.alone.min(scenario.duration) + opts.settle) * alone
}

fn policies_with_reference(policies: &[PolicyKind]) -> Vec<PolicyKind> {
    let mut out = vec![PolicyKind::None];
    for p in policies {
        if !out.contains(p) {
            out.push(*p);
        }
    }
    out
}

/// Runs the alone baselines and every policy (plus `none`); returns one record
/// per policy. `dev` is what [`preflight`] returned for `opts.device`.
pub fn run(
    scenario: &Scenario,
    opts: &BenchOptions,
    dev: DevId,
    stop: &AtomicBool,
    progress: &dyn Fn(f64, &str),
) -> Result<Vec<RunRecord>> {
    std::fs::create_dir_all(&opts.work_dir)
        .map_err(|e| BenchError::Failed(format!("{}: {e}", opts.work_dir.display())))?;
    let model = opts.model.unwrap_or(scenario.policy_model);
    let total = planned_time(scenario, opts).as_secs_f64().max(1.0);
    let mut elapsed = 0.0;

    // Alone baselines of every tenant: its p99 with the device to itself (the
    // protected tenants' reference) and, where the run covers the scenario,
    // what it got in each window (the demand of a closed-loop job).
    let mut alone_p99 = vec![None; scenario.tenants.len()];
    let mut alone_windows: Vec<Vec<TenantWindow>> = vec![Vec::new(); scenario.tenants.len()];
    for (i, t) in scenario.tenants.iter().enumerate() {
        let mut sc = scenario.alone(i);
        sc.duration = opts.alone.min(scenario.duration);
        sc.warmup = Duration::from_secs(1).min(sc.duration / 4);
        let label = format!("{} alone", t.spec.name);
        let rec = run_one(&sc, None, dev, opts, model, stop, &|f| {
            progress((elapsed + f * sc.duration.as_secs_f64()) / total, &label)
        })?;
        alone_p99[i] = Some(rec.latency[0].p99_ms);
        if sc.duration >= scenario.duration {
            alone_windows[i] = rec.windows.iter().map(|w| w.tenants[0].clone()).collect();
        }
        elapsed += sc.duration.as_secs_f64() + settle(opts, stop)?;
    }

    let mut records = Vec::new();
    for kind in policies_with_reference(&opts.policies) {
        let label = kind.as_str().to_string();
        let mut rec = run_one(scenario, Some(kind), dev, opts, model, stop, &|f| {
            progress(
                (elapsed + f * scenario.duration.as_secs_f64()) / total,
                &label,
            )
        })?;
        for (i, t) in rec.tenants.iter_mut().enumerate() {
            t.alone_p99_ms = alone_p99[i];
            t.alone_windows = alone_windows[i].clone();
        }
        for (k, w) in rec.windows.iter_mut().enumerate() {
            for (i, tw) in w.tenants.iter_mut().enumerate() {
                // A closed-loop job asks what it can get alone.
                if tw.demand.is_none() {
                    tw.demand = alone_windows[i].get(k).map(|a| a.got);
                }
            }
        }
        records.push(rec);
        elapsed += scenario.duration.as_secs_f64() + settle(opts, stop)?;
    }
    Ok(records)
}

fn settle(opts: &BenchOptions, stop: &AtomicBool) -> Result<f64> {
    let until = Instant::now() + opts.settle;
    while Instant::now() < until {
        if stop.load(Ordering::SeqCst) {
            return Err(BenchError::Interrupted);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(opts.settle.as_secs_f64())
}

/// One scheduled change of a job.
#[derive(Debug, Clone, Copy)]
struct Change {
    at: Duration,
    tenant: usize,
    job: usize,
    numjobs: u32,
    iodepth: u32,
}

fn changes(scenario: &Scenario) -> Vec<Change> {
    let mut out: Vec<Change> = scenario
        .tenants
        .iter()
        .enumerate()
        .flat_map(|(ti, t)| {
            t.jobs.iter().enumerate().flat_map(move |(ji, j)| {
                j.schedule.iter().map(move |(at, s)| Change {
                    at: *at,
                    tenant: ti,
                    job: ji,
                    numjobs: s.numjobs,
                    iodepth: s.iodepth,
                })
            })
        })
        .collect();
    out.sort_by_key(|c| c.at);
    out
}

fn job_usage(job: &Job, per_process_ios: f64) -> Usage {
    let seq = if job.rw.sequential() { 1.0 } else { 0.0 };
    let dir = |share: f64| DirUsage {
        ios: per_process_ios * share,
        bytes: per_process_ios * share * job.bs as f64,
        seq_ios: per_process_ios * share * seq,
    };
    Usage {
        read: dir(job.read_share),
        write: dir(1.0 - job.read_share),
        latency_us: None,
    }
}

/// What the tenant asks at the moment: the sum of its processes' rates, or
/// `None` (unbounded) if any running process is closed-loop.
fn declared_demand(
    scenario: &Scenario,
    tenant: usize,
    running: &[u32],
    model: &CostModel,
) -> Option<Throughput> {
    let mut u = Usage::default();
    for (job, &n) in scenario.tenants[tenant].jobs.iter().zip(running) {
        if n == 0 {
            continue;
        }
        let per_process_ios = match job.rate? {
            Rate::Iops(x) => x,
            Rate::BytesPerSec(b) => b / job.bs as f64,
            Rate::Cost(_) => return None,
        };
        let ju = job_usage(job, per_process_ios * n as f64);
        u.read.ios += ju.read.ios;
        u.read.bytes += ju.read.bytes;
        u.read.seq_ios += ju.read.seq_ios;
        u.write.ios += ju.write.ios;
        u.write.bytes += ju.write.bytes;
        u.write.seq_ios += ju.write.seq_ios;
    }
    Some(Throughput {
        iops: u.iops(),
        bytes_per_s: u.bytes_per_sec(),
        cost: model.cost_rate(&u),
    })
}

/// Share of a tenant's I/Os that are sequential, from its jobs (cgroups do not say).
fn seq_share(scenario: &Scenario, tenant: usize) -> f64 {
    let jobs = &scenario.tenants[tenant].jobs;
    jobs.iter().filter(|j| j.rw.sequential()).count() as f64 / jobs.len().max(1) as f64
}

fn window_throughput(
    prev: &Counters,
    cur: &Counters,
    secs: f64,
    seq: f64,
    model: &CostModel,
) -> Throughput {
    match iofloor_core::control::usage_between(prev, cur, Duration::from_secs_f64(secs)) {
        Some(mut u) => {
            u.read.seq_ios = u.read.ios * seq;
            u.write.seq_ios = u.write.ios * seq;
            Throughput {
                iops: u.iops(),
                bytes_per_s: u.bytes_per_sec(),
                cost: model.cost_rate(&u),
            }
        }
        None => Throughput::default(),
    }
}

fn device_sectors(dev: DevId) -> Result<u64> {
    let name = dev.kernel_name(Path::new("/sys"))?;
    let p = PathBuf::from(format!("/sys/class/block/{name}/size"));
    let text = std::fs::read_to_string(&p)
        .map_err(|e| BenchError::Failed(format!("{}: {e}", p.display())))?;
    text.trim()
        .parse()
        .map_err(|_| BenchError::Failed(format!("{}: not a number", p.display())))
}

/// Plays one scenario with one policy (None: no controller at all).
fn run_one(
    scenario: &Scenario,
    policy_kind: Option<PolicyKind>,
    dev: DevId,
    opts: &BenchOptions,
    model: CostModel,
    stop: &AtomicBool,
    progress: &dyn Fn(f64),
) -> Result<RunRecord> {
    let tag = policy_kind
        .map(|k| k.as_str().to_string())
        .unwrap_or_else(|| format!("alone-{}", scenario.tenants[0].spec.name));
    let work = opts.work_dir.join(&tag);
    std::fs::create_dir_all(&work)
        .map_err(|e| BenchError::Failed(format!("{}: {e}", work.display())))?;
    let mut session = Session::create(&opts.cgroup_root, dev, scenario, &tag)?;
    let n = scenario.tenants.len();

    // Offsets: each concurrently running process gets its own region.
    let max_procs: u32 = scenario
        .tenants
        .iter()
        .flat_map(|t| t.jobs.iter().map(|j| j.schedule.iter().map(|(_, s)| s.numjobs).max().unwrap_or(0)))
        .sum::<u32>()
        .max(1)
        // A depth change runs old and new processes side by side for a moment.
        * 2;
    let region = (device_sectors(dev)? * 512 / max_procs as u64) / (1 << 20) * (1 << 20);
    if region < 1 << 20 {
        return Err(BenchError::Invalid(format!(
            "{}: too small for {max_procs} fio processes",
            opts.device.display()
        )));
    }
    session.set_regions(max_procs, region);

    let mut backend = HybridBackend {
        cgroups: CgroupBackend::new(
            iofloor_host::cgroup::controller(&opts.cgroup_root, dev)?,
            Some(DiskStats::proc(dev)),
        ),
        qmp: QmpBackend::new(Duration::from_secs(2)),
    };
    let mut tenant_device: Vec<PathBuf> = Vec::with_capacity(n);
    for (i, t) in scenario.tenants.iter().enumerate() {
        if opts.vm_paths && t.spec.class == iofloor_core::TenantClass::Vm {
            let vm = session.add_vm_path(&opts.device, &work.join("vm-paths"))?;
            let disk = vm.device.clone().expect("a started VM path has a device");
            let stats_device = DevId::of_block_device(&disk)?;
            backend.qmp.add_tenant(
                &t.spec.name,
                &vm.socket,
                QmpTarget::Group {
                    group: "dev".into(),
                    stats_device,
                },
            );
            tenant_device.push(disk);
        } else {
            backend
                .cgroups
                .add_tenant(&t.spec.name, session.tenant_cgroup(i).to_path_buf());
            tenant_device.push(opts.device.clone());
        }
    }
    let specs: Vec<iofloor_core::TenantSpec> =
        scenario.tenants.iter().map(|t| t.spec.clone()).collect();
    let mut controller = policy_kind.map(|k| {
        let ctx = PolicyContext {
            cost: model,
            capacity: 1.0,
        };
        let specs = scenario
            .tenants
            .iter()
            .map(|t| std::sync::Arc::new(t.spec.clone()))
            .collect();
        Controller::new(policy::build(k, &scenario.policy, ctx), specs)
    });

    let plan = changes(scenario);
    let mut next_change = 0;
    let interval = scenario.interval;
    let duration = scenario.duration;
    let seq: Vec<f64> = (0..n).map(|i| seq_share(scenario, i)).collect();
    let mut running: Vec<Vec<u32>> = scenario
        .tenants
        .iter()
        .map(|t| vec![0; t.jobs.len()])
        .collect();
    let mut windows: Vec<Window> = Vec::new();
    let mut last_counters: Vec<Counters> = specs
        .iter()
        .map(|t| backend.read_counters(t).map_err(BenchError::from))
        .collect::<Result<_>>()?;
    let diskstats = DiskStats::proc(dev);
    let mut last_disk: DiskStat = diskstats.read()?;
    let mut dec_max = 0.0f64;
    let mut dec_sum = 0.0;
    let mut dec_n = 0u32;
    let mut errors_seen = std::collections::HashSet::new();

    let start = Instant::now();
    session.start = Some(start);
    let mut next_tick = Duration::ZERO;
    let mut next_window = Duration::from_secs(1);
    loop {
        if stop.load(Ordering::SeqCst) {
            return Err(BenchError::Interrupted);
        }
        let now = start.elapsed();
        while next_change < plan.len() && plan[next_change].at <= now {
            let c = plan[next_change];
            let job = &scenario.tenants[c.tenant].jobs[c.job];
            let remaining = duration.saturating_sub(now).as_secs_f64() + 1.0;
            session.set_processes(
                c.tenant,
                c.job,
                job,
                c.numjobs,
                c.iodepth,
                remaining,
                &tenant_device[c.tenant],
                &work,
            )?;
            running[c.tenant][c.job] = c.numjobs;
            next_change += 1;
        }
        if let Some(ctrl) = controller.as_mut().filter(|_| now >= next_tick) {
            let report = ctrl.tick(now, &mut backend);
            let us = report.decision_time.as_secs_f64() * 1e6;
            dec_max = dec_max.max(us);
            dec_sum += us;
            dec_n += 1;
            for (tenant, e) in report.errors {
                if errors_seen.insert(tenant.clone()) {
                    eprintln!("warning: tenant {tenant}: {e}");
                }
            }
            next_tick += interval;
        }
        if now >= next_window {
            let secs = 1.0;
            let mut tenants = Vec::with_capacity(n);
            for i in 0..n {
                let cur = backend.read_counters(&specs[i])?;
                tenants.push(TenantWindow {
                    got: window_throughput(&last_counters[i], &cur, secs, seq[i], &model),
                    demand: declared_demand(scenario, i, &running[i], &model),
                    mean_latency_ms: None,
                    cap_cost: None,
                });
                last_counters[i] = cur;
            }
            let disk = diskstats.read()?;
            let device = DeviceWindow {
                avg_queue: disk
                    .time_in_queue_ms
                    .saturating_sub(last_disk.time_in_queue_ms) as f64
                    / 1000.0
                    / secs,
                utilisation: (disk.io_ticks_ms.saturating_sub(last_disk.io_ticks_ms) as f64
                    / 1000.0
                    / secs)
                    .min(1.0),
                mean_latency_ms: None,
            };
            last_disk = disk;
            windows.push(Window {
                t: next_window.as_secs_f64() - 1.0,
                tenants,
                device,
            });
            progress((next_window.as_secs_f64() / duration.as_secs_f64()).min(1.0));
            next_window += Duration::from_secs(1);
        }
        if let Some(msg) = session.check_processes()? {
            return Err(BenchError::Failed(msg));
        }
        if now >= duration {
            break;
        }
        let wake = [
            next_window,
            next_tick,
            plan.get(next_change).map(|c| c.at).unwrap_or(duration),
            duration,
        ]
        .into_iter()
        .filter(|t| *t > now)
        .min()
        .unwrap_or(now);
        std::thread::sleep((wake - now).min(Duration::from_millis(50)));
    }
    let logs = session.stop_all()?;

    // Latency from fio's per-I/O logs: per-window means and the distribution after warm-up.
    let mut hists: Vec<Histogram<u64>> = (0..n)
        .map(|_| Histogram::new_with_bounds(1, 1_000_000_000_000, 2).expect("valid bounds"))
        .collect();
    let mut win_lat: Vec<Vec<(f64, u64)>> = vec![vec![(0.0, 0); windows.len()]; n];
    let mut dev_lat: Vec<(f64, u64)> = vec![(0.0, 0); windows.len()];
    for log in &logs {
        let path = log.path.clone();
        if !path.exists() {
            continue;
        }
        for (ms, lat_ns, _) in fio::read_lat_log(&path)? {
            let t = log.started.as_secs_f64() + ms as f64 / 1000.0;
            if t >= scenario.warmup.as_secs_f64() && t < duration.as_secs_f64() {
                hists[log.tenant].saturating_record(lat_ns.max(1));
            }
            let k = t as usize;
            if k < windows.len() {
                win_lat[log.tenant][k].0 += lat_ns as f64;
                win_lat[log.tenant][k].1 += 1;
                dev_lat[k].0 += lat_ns as f64;
                dev_lat[k].1 += 1;
            }
        }
    }
    for (k, w) in windows.iter_mut().enumerate() {
        for (i, tw) in w.tenants.iter_mut().enumerate() {
            let (sum, cnt) = win_lat[i][k];
            tw.mean_latency_ms = (cnt > 0).then(|| sum / cnt as f64 / 1e6);
        }
        let (sum, cnt) = dev_lat[k];
        w.device.mean_latency_ms = (cnt > 0).then(|| sum / cnt as f64 / 1e6);
    }
    session.cleanup()?;

    let tenants = scenario
        .tenants
        .iter()
        .map(|t| TenantInfo {
            name: t.spec.name.clone(),
            class: t.spec.class,
            noisy: t.noisy,
            floor: t.spec.floor,
            unit: t
                .spec
                .floor
                .map(|f| f.unit())
                .unwrap_or(RateUnit::BytesPerSec),
            alone_p99_ms: None,
            alone_windows: Vec::new(),
        })
        .collect();
    let latency = hists
        .iter()
        .map(|h| LatencySummary {
            count: h.len(),
            mean_ms: h.mean() / 1e6,
            p50_ms: h.value_at_quantile(0.5) as f64 / 1e6,
            p99_ms: h.value_at_quantile(0.99) as f64 / 1e6,
            p999_ms: h.value_at_quantile(0.999) as f64 / 1e6,
            max_ms: h.max() as f64 / 1e6,
        })
        .collect();
    let ios_completed = windows
        .iter()
        .flat_map(|w| w.tenants.iter().map(|t| t.got.iops))
        .sum::<f64>() as u64;
    Ok(RunRecord {
        scenario: scenario.name.clone(),
        policy: policy_kind.map(|k| k.as_str().to_string()).unwrap_or(tag),
        source: format!("device:{}", opts.device.display()),
        window_s: 1.0,
        warmup_s: scenario.warmup.as_secs_f64(),
        duration_s: duration.as_secs_f64(),
        control_interval_s: interval.as_secs_f64(),
        tenants,
        windows,
        steps: scenario.steps().iter().map(|d| d.as_secs_f64()).collect(),
        latency,
        decision_time_us_max: dec_max,
        decision_time_us_mean: if dec_n > 0 {
            dec_sum / dec_n as f64
        } else {
            0.0
        },
        ios_completed,
    })
}

/// Builds an fio job for one process of a scenario job.
pub(crate) fn fio_job(
    job: &Job,
    name: String,
    device: &Path,
    iodepth: u32,
    runtime_s: f64,
    work: &Path,
    offset: u64,
    size: u64,
) -> FioJob {
    let (rate_bytes, rate_iops) = match job.rate {
        Some(Rate::BytesPerSec(b)) => (Some(b.round().max(1.0) as u64), None),
        Some(Rate::Iops(i)) => (None, Some(i.round().max(1.0) as u64)),
        _ => (None, None),
    };
    let mixed = matches!(job.rw.as_fio(), "rw" | "randrw");
    let mut fj = FioJob::new(
        name.clone(),
        device,
        job.rw.as_fio(),
        job.bs,
        iodepth,
        runtime_s,
        work.join(format!("{name}.json")),
    );
    fj.rwmixread = mixed.then(|| (job.read_share * 100.0).round() as u8);
    fj.rate_bytes = rate_bytes;
    fj.rate_iops = rate_iops;
    fj.lat_log = Some(work.join(&name));
    fj.offset = offset;
    fj.size = size;
    fj
}
