//! Fuzz targets for every parser of iofloor that reads input from outside:
//! the service config, scenario and model files, unit strings, cgroup v1 and
//! v2 stat and limit files, `/proc/diskstats`, QMP replies, the state file,
//! API request bodies, etcd values, fio's output and the run records.
//!
//! Each target takes arbitrary bytes and must return without panicking,
//! whatever they hold; where a parse succeeds it also checks what the rest of
//! iofloor relies on (a limit read back is finite and positive, a rate is
//! finite and above zero, a decoded etcd value encodes again). AFL++ drives
//! them through `src/bin/fuzz.rs` (`scripts/fuzz.sh`); `cargo test` replays
//! each target's corpus and every input that once crashed it
//! (`fuzz/corpus/TARGET`, `fuzz/regressions/TARGET`).

use iofloor_core::{Caps, Rate};
use iofloor_host::DevId;
use std::path::Path;

/// A fuzz target: bytes in, a panic on a bug; it returns whether its parser
/// took the input (the corpus test checks that every target has seeds that
/// reach past the syntax checks).
pub type Target = fn(&[u8]) -> bool;

/// Every target, by the name `scripts/fuzz.sh` and the corpus folders use.
pub const TARGETS: &[(&str, Target)] = &[
    ("config", config),
    ("scenario", scenario),
    ("model_file", model_file),
    ("units", units),
    ("cgroup_v1", cgroup_v1),
    ("cgroup_v2", cgroup_v2),
    ("diskstats", diskstats),
    ("qmp", qmp),
    ("state_file", state_file),
    ("api_body", api_body),
    ("etcd_value", etcd_value),
    ("fio_output", fio_output),
    ("run_record", run_record),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

const ORIGIN: &str = "fuzz-input";

/// Text parsers see only UTF-8 (they read files with `read_to_string`, which
/// refuses anything else before a parser runs); lossy conversion keeps every
/// input useful to them.
fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

/// Inputs of the per-device files start with the device's `MAJ:MIN` line,
/// so the fuzzer can match or miss the device as the files do.
fn device_and_text(data: &[u8]) -> Option<(DevId, String)> {
    let text = text(data);
    let (first, rest) = text.split_once('\n')?;
    let dev: DevId = first.parse().ok()?;
    Some((dev, rest.to_string()))
}

fn check_rate(rate: Rate) {
    let v = rate.value();
    assert!(v.is_finite() && v > 0.0, "rate {rate:?} taken");
}

fn check_caps(caps: &Caps) {
    for v in [
        caps.read_iops,
        caps.write_iops,
        caps.read_bps,
        caps.write_bps,
    ]
    .into_iter()
    .flatten()
    {
        assert!(v.is_finite() && v >= 1.0, "cap {v} read from a file");
    }
}

pub fn config(data: &[u8]) -> bool {
    iofloor_daemon::config::Config::parse(&text(data), Path::new(ORIGIN)).is_ok()
}

pub fn scenario(data: &[u8]) -> bool {
    iofloor_scenario::Scenario::parse(&text(data), ORIGIN).is_ok()
}

pub fn model_file(data: &[u8]) -> bool {
    let Ok((model, knee)) =
        iofloor_host::calibrate::ModelFile::parse(&text(data), Path::new(ORIGIN))
    else {
        return false;
    };
    if let Some(knee) = knee {
        assert!(knee.is_finite() && knee > 0.0, "queue knee {knee} taken");
    }
    // Pricing an I/O with the model must stay finite.
    let cost = model.io_cost(iofloor_core::model::Direction::Read, 4096.0, false);
    assert!(cost.is_finite() && cost >= 0.0, "cost {cost}");
    true
}

pub fn units(data: &[u8]) -> bool {
    use iofloor_core::units::{parse_duration, parse_size};
    let text = text(data);
    let rate = Rate::parse(&text);
    if let Ok(rate) = rate {
        check_rate(rate);
        // What iofloor prints of a rate reads back as a rate.
        if let Ok(again) = Rate::parse(&rate.to_string()) {
            check_rate(again);
        }
    }
    let size = parse_size(&text);
    if let Ok(size) = size {
        assert!(size >= 1, "size {size}");
    }
    let duration = parse_duration(&text);
    rate.is_ok() || size.is_ok() || duration.is_ok()
}

pub fn cgroup_v1(data: &[u8]) -> bool {
    use iofloor_host::cgroup::{parse_v1_counts, parse_v1_limit};
    let Some((dev, text)) = device_and_text(data) else {
        return false;
    };
    let counts = parse_v1_counts(&text, dev, Path::new(ORIGIN));
    let limit = parse_v1_limit(&text, dev, Path::new(ORIGIN));
    if let Ok(Some(limit)) = limit {
        assert!(limit.is_finite() && limit >= 1.0, "limit {limit}");
    }
    counts.is_ok() || limit.is_ok()
}

pub fn cgroup_v2(data: &[u8]) -> bool {
    use iofloor_host::cgroup::{parse_v2_max, parse_v2_stat};
    let Some((dev, text)) = device_and_text(data) else {
        return false;
    };
    let stat = parse_v2_stat(&text, dev, Path::new(ORIGIN));
    let max = parse_v2_max(&text, dev, Path::new(ORIGIN));
    if let Ok(caps) = &max {
        check_caps(caps);
    }
    stat.is_ok() || max.is_ok()
}

pub fn diskstats(data: &[u8]) -> bool {
    let Some((dev, text)) = device_and_text(data) else {
        return false;
    };
    let Ok(stat) = iofloor_host::diskstats::parse(&text, dev, Path::new(ORIGIN)) else {
        return false;
    };
    let _ = stat.as_tenant_counters();
    let _ = stat.counters();
    true
}

pub fn qmp(data: &[u8]) -> bool {
    use iofloor_host::backends::qmp::{counters_from_stats, find_stats, vm_running, QmpTarget};
    use iofloor_host::qmp::{parse_reply, Reply};
    let Ok(reply) = parse_reply(&text(data)) else {
        return false;
    };
    let Reply::Return(value) = reply else {
        return true;
    };
    // The same answer as query-status and as query-blockstats.
    let _ = vm_running(&value);
    // Every drive the answer names, by device name and by qdev path.
    let names = value.as_array().into_iter().flatten().flat_map(|entry| {
        ["device", "qdev"]
            .into_iter()
            .filter_map(|key| entry.get(key)?.as_str().map(str::to_string))
    });
    for id in names.collect::<Vec<_>>() {
        if let Some(stats) = find_stats(&value, &QmpTarget::Drive { id }) {
            let _ = counters_from_stats(stats);
        }
    }
    true
}

pub fn state_file(data: &[u8]) -> bool {
    iofloor_daemon::ownership::parse_state(&text(data), Path::new(ORIGIN)).is_ok()
}

pub fn api_body(data: &[u8]) -> bool {
    let Ok(patch) = iofloor_daemon::api::parse_patch(data) else {
        return false;
    };
    for rate in [patch.floor, patch.ceiling].into_iter().flatten().flatten() {
        check_rate(rate);
    }
    if let Some(w) = patch.weight {
        assert!(w.is_finite() && w > 0.0, "weight {w} taken");
    }
    true
}

pub fn etcd_value(data: &[u8]) -> bool {
    use iofloor_cluster::wire::{Allocation, FloorSetting, HostReport};
    let mut taken = false;
    if let Ok(report) = HostReport::decode(data) {
        HostReport::decode(&report.encode()).expect("a decoded report encodes again");
        taken = true;
    }
    if let Ok(floor) = FloorSetting::decode(data) {
        if let Some(rate) = floor.floor {
            check_rate(rate);
        }
        FloorSetting::decode(&floor.encode()).expect("a decoded floor encodes again");
        taken = true;
    }
    if let Ok(allocation) = Allocation::decode(data) {
        Allocation::decode(&allocation.encode()).expect("a decoded allocation encodes again");
        taken = true;
    }
    let prefix = "/iofloor/c/v1/floors/";
    let key = format!("{prefix}t1");
    let _ = iofloor_cluster::runtime::decode_floors(prefix, vec![(key, data.to_vec())]);
    taken
}

pub fn fio_output(data: &[u8]) -> bool {
    let text = text(data);
    let output = iofloor_host::fio::parse_output(&text, Path::new(ORIGIN));
    let log = iofloor_host::fio::parse_lat_log(&text, Path::new(ORIGIN));
    output.is_ok() || log.is_ok()
}

pub fn run_record(data: &[u8]) -> bool {
    iofloor_report::render::parse_record(Path::new(ORIGIN), &text(data)).is_ok()
}
