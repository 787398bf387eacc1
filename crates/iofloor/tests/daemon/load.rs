//! The API under load (issue 13): the daemon at 100 tenants and a 100 ms
//! interval, first quiet, then for 25 s with about 1,000 requests/s of mixed
//! reads and PATCHes from 8 client threads, 4 event-stream subscribers that
//! keep up and 2 that never read. It prints the request latency, the control
//! loop's tick duration and lateness (each tick's own figures, from the
//! event stream) in both phases, and the daemon's RSS; it asserts what is not
//! timing: every request answered, slow subscribers dropped, the daemon's
//! memory bounded.

use super::SERIAL;
use crate::common::real_environment;
use crate::harness::{config, Cgroups, Daemon};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// Long enough for a few hundred ticks in each phase (the tick figures'
// p99) and for the silent subscribers' buffers to fill; the README's figures
// are from 60-s runs.
const QUIET: Duration = Duration::from_secs(12);
const LOAD: Duration = Duration::from_secs(25);
const CLIENTS: usize = 8;
const RATE_PER_CLIENT: f64 = 125.0;

fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p * values.len() as f64).ceil() as usize).max(1);
    values[rank - 1]
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn subscribe(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // HTTP/1.0: the stream comes unchunked, one `data:` line per tick.
    write!(
        s,
        "GET /api/v1/samples HTTP/1.0\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    s
}

/// Each tick's own duration and lateness (ms), as the next tick reports it,
/// with the time it arrived.
type Timings = Arc<Mutex<Vec<(Instant, f64, f64)>>>;

fn record_ticks(stream: TcpStream, timings: Timings, stop: Arc<AtomicBool>) {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut lines = BufReader::new(stream).lines();
    while !stop.load(Ordering::Relaxed) {
        let Some(Ok(line)) = lines.next() else {
            panic!("the recording subscriber's stream ended");
        };
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let tick: serde_json::Value = serde_json::from_str(data).unwrap();
        let timing = &tick["timing"];
        if timing["samples"].as_u64().unwrap_or(0) > 0 {
            timings.lock().unwrap().push((
                Instant::now(),
                timing["last_duration_ms"].as_f64().unwrap(),
                timing["last_lateness_ms"].as_f64().unwrap(),
            ));
        }
    }
}

/// What the client threads saw: latencies (ms) and answers by status.
#[derive(Default)]
struct Seen {
    latency_ms: Vec<f64>,
    by_status: std::collections::BTreeMap<u16, u64>,
    failed: Vec<String>,
}

fn client(port: u16, id: usize, until: Instant, seen: Arc<Mutex<Seen>>) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into();
    let base = format!("http://127.0.0.1:{port}");
    let period = Duration::from_secs_f64(1.0 / RATE_PER_CLIENT);
    let mut next = Instant::now();
    let mut local = Seen::default();
    let mut i = id;
    while Instant::now() < until {
        let tenant = format!("t%2Ft{:03}", i % 100);
        let started = Instant::now();
        let answer = match i % 10 {
            0..=3 => agent.get(format!("{base}/api/v1/tenants")).call(),
            4 | 5 => agent.get(format!("{base}/api/v1/status")).call(),
            6 | 7 => agent
                .get(format!("{base}/api/v1/tenants/{tenant}?seconds=60"))
                .call(),
            8 => agent.get(format!("{base}/metrics")).call(),
            _ => agent
                .patch(format!("{base}/api/v1/tenants/{tenant}"))
                .header("Authorization", "Bearer let-me-in")
                .header("Content-Type", "application/json")
                .send(format!(r#"{{"weight": {}}}"#, 100 + i % 7)),
        };
        match answer {
            Ok(mut response) => {
                // Read the whole body: the latency is that of the answer.
                let _ = response.body_mut().read_to_vec();
                local.latency_ms.push(started.elapsed().as_secs_f64() * 1e3);
                *local
                    .by_status
                    .entry(response.status().as_u16())
                    .or_default() += 1;
            }
            Err(e) => local.failed.push(e.to_string()),
        }
        i += CLIENTS;
        next += period;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    let mut seen = seen.lock().unwrap();
    seen.latency_ms.extend(local.latency_ms);
    for (status, n) in local.by_status {
        *seen.by_status.entry(status).or_default() += n;
    }
    seen.failed.extend(local.failed);
}

/// Whether the daemon closed a stream its client never read: reading what
/// is buffered ends in EOF.
fn was_dropped(mut stream: TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(_) => return false,
        }
    }
}

#[test]
fn api_under_load_leaves_the_control_loop_on_time() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment() {
        return;
    }
    let (loop_device, cg, tenants) = Cgroups::hundred("apiload");
    let text = config(&loop_device.device, 200_000, &cg.parent, tenants)
        .replace("interval = \"1s\"", "interval = \"100ms\"");
    let daemon = Daemon::start(&text);
    daemon.wait_for("100 tenants", Duration::from_secs(10), |v| {
        v["tenants"].as_array().is_some_and(|a| a.len() == 100)
    });
    let pid = daemon.pid();
    let port = daemon.port;

    let timings: Timings = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let recorder = {
        let (stream, timings, stop) = (subscribe(port), timings.clone(), stop.clone());
        std::thread::spawn(move || record_ticks(stream, timings, stop))
    };
    // Past the first ticks (adoption of 100 tenants) before measuring.
    std::thread::sleep(Duration::from_secs(2));
    let quiet_from = Instant::now();
    let rss_start = rss_kib(pid);
    std::thread::sleep(QUIET);

    let load_from = Instant::now();
    let until = load_from + LOAD;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (stream, timings, stop) = (subscribe(port), Arc::default(), stop.clone());
            std::thread::spawn(move || record_ticks(stream, timings, stop))
        })
        .collect();
    let slow: Vec<TcpStream> = (0..2).map(|_| subscribe(port)).collect();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let seen = seen.clone();
            std::thread::spawn(move || client(port, id, until, seen))
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let load_secs = load_from.elapsed().as_secs_f64();
    let rss_end = rss_kib(pid);
    stop.store(true, Ordering::Relaxed);
    recorder.join().unwrap();
    for r in readers {
        r.join().unwrap();
    }
    let dropped = slow
        .into_iter()
        .filter(|s| was_dropped(s.try_clone().unwrap()))
        .count();

    let timings = timings.lock().unwrap();
    let phase = |from: Instant, to: Instant| {
        let (mut duration, mut lateness): (Vec<f64>, Vec<f64>) = timings
            .iter()
            .filter(|(at, _, _)| *at >= from && *at < to)
            .map(|(_, d, l)| (*d, *l))
            .unzip();
        (
            duration.len(),
            percentile(&mut duration, 0.5),
            percentile(&mut duration, 0.99),
            percentile(&mut lateness, 0.5),
            percentile(&mut lateness, 0.99),
        )
    };
    let quiet = phase(quiet_from, load_from);
    let loaded = phase(load_from, until);
    let mut seen = seen.lock().unwrap();
    let requests = seen.latency_ms.len();
    let (p50, p99) = (
        percentile(&mut seen.latency_ms, 0.5),
        percentile(&mut seen.latency_ms, 0.99),
    );
    let (_, status) = daemon.get("/api/v1/status");
    eprintln!(
        "api load: {requests} requests in {load_secs:.1} s ({:.0}/s) from {CLIENTS} clients, \
         answers by status {:?}, transport failures {}; latency p50 {p50:.2} ms, p99 {p99:.2} ms\n\
         ticks (100 tenants, 100 ms interval): quiet {} ticks, duration p50 {:.2} ms p99 {:.2} ms, \
         lateness p50 {:.2} ms p99 {:.2} ms; under load {} ticks, duration p50 {:.2} ms p99 {:.2} ms, \
         lateness p50 {:.2} ms p99 {:.2} ms; duration p99 ratio {:.2}, (duration + lateness) p99 ratio {:.2}\n\
         slow event-stream subscribers dropped: {dropped}/2; daemon RSS {rss_start} KiB -> {rss_end} KiB; \
         overruns {}",
        requests as f64 / load_secs,
        seen.by_status,
        seen.failed.len(),
        quiet.0,
        quiet.1,
        quiet.2,
        quiet.3,
        quiet.4,
        loaded.0,
        loaded.1,
        loaded.2,
        loaded.3,
        loaded.4,
        loaded.2 / quiet.2,
        (loaded.2 + loaded.4) / (quiet.2 + quiet.4),
        status["overruns"],
    );
    assert!(
        seen.failed.is_empty(),
        "requests failed: {:?}",
        &seen.failed[..seen.failed.len().min(5)]
    );
    let answered_ok: u64 = seen
        .by_status
        .iter()
        .filter(|(s, _)| [200, 503].contains(*s))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(answered_ok, requests as u64, "{:?}", seen.by_status);
    assert_eq!(dropped, 2, "a subscriber that never reads is dropped");
    assert!(
        quiet.0 > 100 && loaded.0 > 200,
        "ticks seen: {quiet:?} {loaded:?}"
    );
    // Bounded memory: the daemon keeps no per-request state.
    assert!(
        rss_end < rss_start + 64 * 1024,
        "{rss_start} -> {rss_end} KiB"
    );
}
