//! Formats: the stable JSON summary (the contract other tools read), Markdown
//! and HTML reports, and the results directory that holds the raw runs so
//! `iofloor report DIR` can rebuild everything without rerunning.

use crate::chart;
use crate::metrics::{compare, PolicyMeasures};
use crate::record::RunRecord;
use serde_json::{json, Map, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a run record: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Chart(#[from] chart::ChartError),
    #[error("{0}: no run records (runs/*.json) found")]
    Empty(PathBuf),
    #[error("{path}: run record of schema version {found}, newer than this iofloor reads (up to {supported}); use a newer iofloor to read it")]
    FutureSchema {
        path: PathBuf,
        found: u64,
        supported: u32,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn num(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else {
        Value::Null
    }
}

/// The summary JSON of the contract:
/// `{"scenario", "policies": {POLICY: {floor_miss_rate, work_conservation, ...}}}`.
pub fn summary_json(scenario: &str, compared: &[(String, PolicyMeasures)]) -> Value {
    let mut policies = Map::new();
    for (name, m) in compared {
        let tenants: Vec<Value> = m
            .tenants
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "class": t.class,
                    "unit": t.unit,
                    "floor": t.floor,
                    "noisy": t.noisy,
                    "floor_miss_rate": num(t.floor_miss_rate),
                    "min": num(t.min),
                    "max": num(t.max),
                    "avg": num(t.avg),
                    "p99_latency_ms": num(t.p99_latency_ms),
                    "alone_p99_ms": t.alone_p99_ms.map(num),
                })
            })
            .collect();
        policies.insert(
            name.clone(),
            json!({
                "floor_miss_rate": num(m.floor_miss_rate),
                "work_conservation": m.work_conservation.map(num),
                "work_conservation_contended": m.work_conservation_contended.map(num),
                "device_work_conservation": m.device_work_conservation.map(num),
                "unmanaged_cost": m.unmanaged_cost.map(num),
                "reaction_time_s": m.reaction_time_s.map(num),
                "reaction_times_s": m.reaction_times_s.iter().copied().map(num).collect::<Vec<_>>(),
                "unrecovered_steps": m.unrecovered_steps,
                "protected_p99_ratio": m.protected_p99_ratio.map(num),
                "aggregate_iops": num(m.aggregate_iops),
                "aggregate_bytes_per_s": num(m.aggregate_bytes_per_s),
                "aggregate_cost": num(m.aggregate_cost),
                "decision_time_us_max": num(m.decision_time_us_max),
                "windows_counted": m.windows_counted,
                "tenants": tenants,
                "groups": m.groups.iter().map(|g| json!({
                    "name": g.name,
                    "unit": g.unit,
                    "floor": g.floor,
                    "floor_miss_rate": num(g.floor_miss_rate),
                    "min": num(g.min),
                    "max": num(g.max),
                    "avg": num(g.avg),
                })).collect::<Vec<_>>(),
            }),
        );
    }
    json!({ "scenario": scenario, "policies": Value::Object(policies) })
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) => format!("{x:.digits$}"),
        None => "–".to_string(),
    }
}

fn fmt_pct(v: f64) -> String {
    format!("{:.1} %", v * 100.0)
}

fn fmt_tp(v: f64, unit: &str) -> String {
    match unit {
        "B/s" => format!("{:.0} KiB/s", v / 1024.0),
        "cost/s" => format!("{:.1} %", v * 100.0),
        _ => format!("{v:.0}"),
    }
}

/// The comparison table, one row per policy (Markdown).
pub fn comparison_table(compared: &[(String, PolicyMeasures)]) -> String {
    let mut s = String::new();
    s.push_str("| policy | floor-miss | work conservation | WC contended | reaction max / median (s) | protected p99 ratio | aggregate IOPS | aggregate MiB/s | max decision (µs) |\n");
    s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (name, m) in compared {
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} | {} / {}{} | {} | {:.0} | {:.2} | {:.1} |",
            fmt_pct(m.floor_miss_rate),
            match m.device_work_conservation {
                // With unmanaged load, the device-wide figure beside the
                // tenants' own (docs/metrics.md).
                Some(d) => format!("{} (device {d:.3})", fmt_opt(m.work_conservation, 3)),
                None => fmt_opt(m.work_conservation, 3),
            },
            fmt_opt(m.work_conservation_contended, 3),
            fmt_opt(m.reaction_time_s, 1),
            fmt_opt(median(&m.reaction_times_s), 1),
            if m.unrecovered_steps > 0 {
                format!(" ({} never)", m.unrecovered_steps)
            } else {
                String::new()
            },
            fmt_opt(m.protected_p99_ratio, 2),
            m.aggregate_iops,
            m.aggregate_bytes_per_s / 1048576.0,
            m.decision_time_us_max,
        );
    }
    s
}

/// Seed 001 Table 2: per-tenant min/max/avg under each policy, plus misses and p99.
pub fn tenant_table(compared: &[(String, PolicyMeasures)]) -> String {
    let mut s = String::new();
    s.push_str("| tenant | class | floor | policy | min | max | avg | floor-miss | p99 (ms) | alone p99 (ms) |\n");
    s.push_str("|---|---|---:|---|---:|---:|---:|---:|---:|---:|\n");
    let Some((_, first)) = compared.first() else {
        return s;
    };
    for (i, t) in first.tenants.iter().enumerate() {
        for (name, m) in compared {
            let tm = &m.tenants[i];
            let _ = writeln!(
                s,
                "| {}{} | {} | {} | {name} | {} | {} | {} | {} | {:.2} | {} |",
                tm.name,
                if tm.noisy { " (noisy)" } else { "" },
                tm.class,
                tm.floor
                    .map(|f| fmt_tp(f, &tm.unit))
                    .unwrap_or_else(|| "–".into()),
                fmt_tp(tm.min, &tm.unit),
                fmt_tp(tm.max, &tm.unit),
                fmt_tp(tm.avg, &tm.unit),
                fmt_pct(tm.floor_miss_rate),
                tm.p99_latency_ms,
                fmt_opt(tm.alone_p99_ms, 2),
            );
        }
        let _ = t;
    }
    s
}

/// Groups of tenants: each group's members together under each policy.
/// Empty when the scenario has no groups.
pub fn group_table(compared: &[(String, PolicyMeasures)]) -> String {
    let Some((_, first)) = compared.first().filter(|(_, m)| !m.groups.is_empty()) else {
        return String::new();
    };
    let mut s = String::new();
    s.push_str("| group | floor | policy | min | max | avg | floor-miss |\n");
    s.push_str("|---|---:|---|---:|---:|---:|---:|\n");
    for (i, _) in first.groups.iter().enumerate() {
        for (name, m) in compared {
            let g = &m.groups[i];
            let _ = writeln!(
                s,
                "| {} | {} | {name} | {} | {} | {} | {} |",
                g.name,
                g.floor
                    .map(|f| fmt_tp(f, &g.unit))
                    .unwrap_or_else(|| "–".into()),
                fmt_tp(g.min, &g.unit),
                fmt_tp(g.max, &g.unit),
                fmt_tp(g.avg, &g.unit),
                fmt_pct(g.floor_miss_rate),
            );
        }
    }
    s
}

/// Per load phase (between two load steps): each tenant's mean throughput
/// and latency under each policy, and alone where measured (seed 000 Fig. 6).
/// Empty when the scenario has no steps or too many to tabulate.
pub fn phase_table(runs: &[RunRecord]) -> String {
    let Some(first) = runs.first() else {
        return String::new();
    };
    if first.steps.is_empty() || first.steps.len() > 24 {
        return String::new();
    }
    let mut bounds = vec![0.0];
    bounds.extend(first.steps.iter().copied());
    bounds.push(first.duration_s);
    let mut s = String::from("| from (s) | tenant | ");
    for r in runs {
        let _ = write!(s, "{} | ", r.policy);
    }
    s.push_str("alone |\n|---:|---|");
    for _ in 0..=runs.len() {
        s.push_str("---:|");
    }
    s.push('\n');
    let cell = |ws: &mut dyn Iterator<Item = &crate::record::TenantWindow>, unit| {
        let (mut sum, mut lat, mut n, mut nl) = (0.0, 0.0, 0, 0);
        for w in ws {
            sum += w.got.in_unit(unit);
            n += 1;
            if let Some(l) = w.mean_latency_ms {
                lat += l;
                nl += 1;
            }
        }
        if n == 0 {
            return "–".to_string();
        }
        let tp = fmt_tp(sum / n as f64, iofloor_core::units::RateUnit::label(unit));
        if nl > 0 {
            format!("{tp} ({:.2} ms)", lat / nl as f64)
        } else {
            tp
        }
    };
    for ph in bounds.windows(2) {
        let (from, to) = (ph[0], ph[1]);
        let inside = |t: f64| t + 1e-9 >= from && t < to - 1e-9;
        for (i, t) in first.tenants.iter().enumerate() {
            let _ = write!(s, "| {from:.0} | {} | ", t.name);
            for r in runs {
                let mut it = r
                    .windows
                    .iter()
                    .filter(|w| inside(w.t))
                    .map(|w| &w.tenants[i]);
                let _ = write!(s, "{} | ", cell(&mut it, t.unit));
            }
            let mut alone = t
                .alone_windows
                .iter()
                .enumerate()
                .filter(|(k, _)| inside(*k as f64))
                .map(|(_, w)| w);
            let _ = writeln!(s, "{} |", cell(&mut alone, t.unit));
        }
    }
    s
}

/// Markdown report of one scenario.
pub fn markdown(runs: &[RunRecord], chart_dir: Option<&str>) -> String {
    let compared = compare(runs);
    let first = &runs[0];
    let mut s = String::new();
    let _ = writeln!(s, "# iofloor report: {}\n", first.scenario);
    let _ = writeln!(
        s,
        "Source: {}. Duration {:.0} s, warm-up {:.0} s, {:.0} s windows, control interval {} s. \
         Measures as defined in docs/metrics.md; throughput in each tenant's floor unit.\n",
        first.source, first.duration_s, first.warmup_s, first.window_s, first.control_interval_s
    );
    s.push_str("## Policies\n\n");
    s.push_str(&comparison_table(&compared));
    s.push_str("\n## Tenants (min / max / avg after warm-up, as seed 001 Table 2)\n\n");
    s.push_str(&tenant_table(&compared));
    let groups = group_table(&compared);
    if !groups.is_empty() {
        s.push_str("\n## Groups (members together, min / max / avg after warm-up)\n\n");
        s.push_str(&groups);
    }
    let phases = phase_table(runs);
    if !phases.is_empty() {
        s.push_str("\n## Per load phase (mean throughput, mean latency)\n\n");
        s.push_str(&phases);
    }
    if let Some(dir) = chart_dir {
        s.push_str("\n## Charts\n\n");
        for r in runs {
            let learns = r.learns_capacity();
            let kinds = ["throughput", "floors", "queue", "capacity"];
            for kind in kinds.into_iter().filter(|k| learns || *k != "capacity") {
                let _ = writeln!(s, "![{} {}]({dir}/{}-{kind}.svg)", r.policy, kind, r.policy);
            }
        }
    }
    s
}

fn md_table_to_html(md: &str) -> String {
    let mut out = String::from("<table>\n");
    for (n, line) in md.lines().enumerate() {
        if n == 1 {
            continue;
        }
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        let tag = if n == 0 { "th" } else { "td" };
        out.push_str("<tr>");
        for c in cells {
            let _ = write!(out, "<{tag}>{}</{tag}>", html_escape(c));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
    out
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Self-contained HTML report with the charts inline.
pub fn html(runs: &[RunRecord]) -> Result<String, ReportError> {
    let compared = compare(runs);
    let first = &runs[0];
    let mut s = String::new();
    let _ = write!(
        s,
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>iofloor: {0}</title>\
         <style>body{{font-family:sans-serif;max-width:1000px;margin:auto}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}td:first-child{{text-align:left}}</style>\
         </head><body><h1>iofloor report: {0}</h1>\
         <p>Source: {1}. Duration {2:.0} s, warm-up {3:.0} s, {4:.0} s windows, control interval {5} s. \
         Measures as defined in docs/metrics.md.</p><h2>Policies</h2>",
        html_escape(&first.scenario),
        html_escape(&first.source),
        first.duration_s,
        first.warmup_s,
        first.window_s,
        first.control_interval_s
    );
    s.push_str(&md_table_to_html(&comparison_table(&compared)));
    s.push_str("<h2>Tenants</h2>");
    s.push_str(&md_table_to_html(&tenant_table(&compared)));
    let phases = phase_table(runs);
    if !phases.is_empty() {
        s.push_str("<h2>Per load phase (mean throughput, mean latency)</h2>");
        s.push_str(&md_table_to_html(&phases));
    }
    for r in runs {
        let _ = write!(s, "<h2>{}</h2>", html_escape(&r.policy));
        for svg in [
            chart::stacked_throughput(r),
            chart::per_tenant_vs_floor(r),
            chart::queue_and_latency(r),
        ]
        .into_iter()
        .chain(chart::capacity(r))
        .chain(chart::curve(r))
        {
            s.push_str(&svg?);
        }
    }
    s.push_str("</body></html>\n");
    Ok(s)
}

/// Paths written by [`write_dir`].
#[derive(Debug, Clone)]
pub struct Written {
    pub summary: PathBuf,
    pub markdown: PathBuf,
    pub html: PathBuf,
}

/// Writes raw runs, summary, reports and charts into `dir`.
pub fn write_dir(dir: &Path, runs: &[RunRecord]) -> Result<Written, ReportError> {
    let runs_dir = dir.join("runs");
    std::fs::create_dir_all(&runs_dir).map_err(io_err(&runs_dir))?;
    for r in runs {
        let p = runs_dir.join(format!("{}.json", r.policy));
        let text = serde_json::to_string(r).expect("run records serialise");
        std::fs::write(&p, text).map_err(io_err(&p))?;
    }
    render_dir(dir, runs)
}

fn render_dir(dir: &Path, runs: &[RunRecord]) -> Result<Written, ReportError> {
    let charts = dir.join("charts");
    std::fs::create_dir_all(&charts).map_err(io_err(&charts))?;
    for r in runs {
        for (kind, svg) in [
            ("throughput", chart::stacked_throughput(r)),
            ("floors", chart::per_tenant_vs_floor(r)),
            ("queue", chart::queue_and_latency(r)),
        ]
        .into_iter()
        .chain(chart::capacity(r).map(|svg| ("capacity", svg)))
        .chain(chart::curve(r).map(|svg| ("curve", svg)))
        {
            let p = charts.join(format!("{}-{kind}.svg", r.policy));
            std::fs::write(&p, svg?).map_err(io_err(&p))?;
        }
    }
    let compared = compare(runs);
    let summary = dir.join("summary.json");
    let text =
        serde_json::to_string_pretty(&summary_json(&runs[0].scenario, &compared)).expect("json");
    std::fs::write(&summary, text).map_err(io_err(&summary))?;
    let markdown_path = dir.join("report.md");
    std::fs::write(&markdown_path, markdown(runs, Some("charts")))
        .map_err(io_err(&markdown_path))?;
    let html_path = dir.join("report.html");
    std::fs::write(&html_path, html(runs)?).map_err(io_err(&html_path))?;
    Ok(Written {
        summary,
        markdown: markdown_path,
        html: html_path,
    })
}

/// Reads the raw runs of a results directory, `none` first, then by name.
pub fn load_dir(dir: &Path) -> Result<Vec<RunRecord>, ReportError> {
    let runs_dir = dir.join("runs");
    let entries = std::fs::read_dir(&runs_dir).map_err(io_err(&runs_dir))?;
    let mut runs = Vec::new();
    for e in entries {
        let path = e.map_err(io_err(&runs_dir))?.path();
        if path.extension().is_some_and(|x| x == "json") {
            let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
            runs.push(parse_record(&path, &text)?);
        }
    }
    if runs.is_empty() {
        return Err(ReportError::Empty(dir.to_path_buf()));
    }
    runs.sort_by_key(|r| (r.policy != "none", r.policy.clone()));
    Ok(runs)
}

/// Reads one run record, refusing a schema newer than this build's before
/// looking at any other field (a newer layout may not parse, and must not be
/// half read).
pub fn parse_record(path: &Path, text: &str) -> Result<RunRecord, ReportError> {
    let parse_err = |source| ReportError::Parse {
        path: path.to_path_buf(),
        source,
    };
    let value: serde_json::Value = serde_json::from_str(text).map_err(parse_err)?;
    if let Some(found) = value.get("schema_version").and_then(|v| v.as_u64()) {
        if found > u64::from(crate::record::SCHEMA_VERSION) {
            return Err(ReportError::FutureSchema {
                path: path.to_path_buf(),
                found,
                supported: crate::record::SCHEMA_VERSION,
            });
        }
    }
    serde_json::from_value(value).map_err(parse_err)
}

/// Rebuilds summary, reports and charts from the raw runs in `dir`.
pub fn rebuild_dir(dir: &Path) -> Result<(Vec<RunRecord>, Written), ReportError> {
    let runs = load_dir(dir)?;
    let written = render_dir(dir, &runs)?;
    Ok((runs, written))
}
