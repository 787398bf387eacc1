//! `iofloor top`: a running daemon's tenants in the terminal, like `top`:
//! usage, floor and whether it is met, caps in force; refreshed every
//! control interval, sortable. Reads the same JSON API as the dashboard.
//! `--cluster` shows every host's tenants of the shared device, from any
//! agent (`/api/v1/cluster`).

use anyhow::Context;
use iofloor_cluster::view::TenantRow;
use iofloor_cluster::ClusterView;
use iofloor_core::units::{format_bytes, Rate};
use iofloor_daemon::view::{Status, TenantList, TenantView};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table};
use std::time::Duration;

#[derive(Clone, Copy, PartialEq, Eq)]
enum SortBy {
    Usage,
    Cost,
    Floor,
    Name,
}

impl SortBy {
    fn parse(s: &str) -> Option<SortBy> {
        Some(match s {
            "usage" => SortBy::Usage,
            "cost" => SortBy::Cost,
            "floor" => SortBy::Floor,
            "name" => SortBy::Name,
            _ => return None,
        })
    }

    fn next(self) -> SortBy {
        match self {
            SortBy::Usage => SortBy::Cost,
            SortBy::Cost => SortBy::Floor,
            SortBy::Floor => SortBy::Name,
            SortBy::Name => SortBy::Usage,
        }
    }

    fn label(self) -> &'static str {
        match self {
            SortBy::Usage => "usage (IOPS)",
            SortBy::Cost => "cost",
            SortBy::Floor => "floor met, then usage",
            SortBy::Name => "name",
        }
    }
}

fn fetch<T: serde::de::DeserializeOwned>(base: &str, path: &str) -> anyhow::Result<T> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let mut resp = ureq::get(&url)
        .call()
        .with_context(|| format!("GET {url}"))?;
    resp.body_mut()
        .read_json::<T>()
        .with_context(|| format!("GET {url}: not the iofloor API"))
}

fn sort(tenants: &mut [TenantView], by: SortBy) {
    let usage = |t: &TenantView| t.usage.map(|u| u.iops).unwrap_or(0.0);
    let cost = |t: &TenantView| t.usage.map(|u| u.cost).unwrap_or(0.0);
    match by {
        SortBy::Usage => tenants.sort_by(|a, b| usage(b).total_cmp(&usage(a))),
        SortBy::Cost => tenants.sort_by(|a, b| cost(b).total_cmp(&cost(a))),
        // Missed floors first: what an operator looks for.
        SortBy::Floor => tenants.sort_by(|a, b| {
            let rank = |t: &TenantView| match t.floor_met {
                Some(false) => 0,
                Some(true) => 1,
                None => 2,
            };
            rank(a).cmp(&rank(b)).then(usage(b).total_cmp(&usage(a)))
        }),
        SortBy::Name => tenants.sort_by(|a, b| a.name.cmp(&b.name)),
    }
}

fn rate_text(r: Option<Rate>) -> String {
    r.map(|r| r.to_string()).unwrap_or_else(|| "-".into())
}

fn caps_text(c: &iofloor_core::Caps) -> String {
    let mut parts = Vec::new();
    for (label, v, bytes) in [
        ("r", c.read_iops, false),
        ("w", c.write_iops, false),
        ("r", c.read_bps, true),
        ("w", c.write_bps, true),
    ] {
        if let Some(v) = v {
            parts.push(if bytes {
                format!("{label} {}/s", format_bytes(v))
            } else {
                format!("{label} {v:.0} IOPS")
            });
        }
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

const HEADER: [&str; 10] = [
    "TENANT",
    "CLASS",
    "IOPS",
    "BW/s",
    "COST%",
    "LAT ms",
    "FLOOR",
    "MET",
    "CAPS",
    "THROTTLED s",
];

fn row(t: &TenantView) -> [String; 10] {
    let (iops, bw, cost, lat) = match (&t.usage, t.available) {
        (Some(u), true) => (
            format!("{:.0}", u.iops),
            format_bytes(u.bytes_per_sec),
            format!("{:.1}", u.cost * 100.0),
            u.latency_us
                .map(|l| format!("{:.2}", l / 1e3))
                .unwrap_or_else(|| "-".into()),
        ),
        _ => {
            let why = if t.available {
                "-".to_string()
            } else {
                "unavailable".to_string()
            };
            (why, "-".into(), "-".into(), "-".into())
        }
    };
    let met = match t.floor_met {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "-",
    };
    [
        t.name.clone(),
        t.class.as_str().into(),
        iops,
        bw,
        cost,
        lat,
        rate_text(t.floor),
        met.into(),
        caps_text(&t.caps),
        format!("{:.0}", t.throttled_seconds),
    ]
}

/// The learned capacity beside what it was learned from: the estimate, the
/// curve's plateau, the last verdict and the curve's last points (I/Os in
/// flight → work served, `*` where the device was found full).
fn capacity_text(d: &iofloor_daemon::view::DeviceState) -> String {
    let Some(step) = &d.capacity_step else {
        return String::new();
    };
    let verdict = serde_json::to_value(step.verdict)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let plateau = step
        .plateau
        .map(|p| format!(" plateau {p:.2}"))
        .unwrap_or_default();
    let curve: Vec<String> = d
        .capacity_curve
        .iter()
        .rev()
        .take(4)
        .rev()
        .map(|p| {
            let full = if p.kind == iofloor_core::capacity::PointKind::Full {
                "*"
            } else {
                ""
            };
            format!("{:.1}→{:.2}{full}", p.in_flight, p.served)
        })
        .collect();
    let fault = step
        .fault
        .map(|f| format!(" (held: {f})"))
        .unwrap_or_default();
    format!(
        " capacity {:.2}{plateau} {verdict}{fault} curve {}",
        step.estimate,
        curve.join(" ")
    )
}

fn status_line(s: &Status) -> String {
    let devices: Vec<String> = s
        .devices
        .iter()
        .map(|d| {
            format!(
                "{} util {} queue {}{}",
                d.device,
                d.utilisation
                    .map(|u| format!("{:.0}%", u * 100.0))
                    .unwrap_or_else(|| "-".into()),
                d.avg_queue
                    .map(|q| format!("{q:.1}"))
                    .unwrap_or_else(|| "-".into()),
                capacity_text(d)
            )
        })
        .collect();
    let cluster = s
        .cluster
        .as_ref()
        .map(|c| {
            format!(
                " · cluster {}: {} is {} (allocator {}, {} hosts{}), caps {}{}",
                c.cluster,
                c.host,
                c.role,
                c.allocator.as_deref().unwrap_or("none"),
                c.hosts.len(),
                if c.connected {
                    ""
                } else {
                    ", etcd unreachable"
                },
                c.mode.as_deref().unwrap_or("-"),
                c.allocation_age_s
                    .map(|a| format!(" {a:.1}s old"))
                    .unwrap_or_default()
            )
        })
        .unwrap_or_default();
    format!(
        "iofloor {} · policy {} · interval {:.1}s · up {:.0}s · {} ticks, {} overruns · {}{cluster}",
        s.version,
        s.policy,
        s.interval_s,
        s.uptime_s,
        s.ticks,
        s.overruns,
        devices.join(" · ")
    )
}

/// The plain-text table of `--once`.
fn print_once(screen: &Screen) {
    for line in &screen.title {
        println!("{line}");
    }
    let mut widths: Vec<usize> = screen.header.iter().map(|h| h.len()).collect();
    for (r, _) in &screen.rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    println!("{}", line(screen.header.to_vec()));
    for (r, _) in &screen.rows {
        println!("{}", line(r.iter().map(String::as_str).collect()));
    }
}

/// What one refresh shows: title lines, a table, and which rows need an
/// operator's eye (a missed floor, an unavailable tenant).
struct Screen {
    title: Vec<String>,
    header: &'static [&'static str],
    widths: &'static [Constraint],
    rows: Vec<(Vec<String>, bool)>,
    table_title: &'static str,
}

const TENANT_WIDTHS: [Constraint; 10] = [
    Constraint::Min(16),
    Constraint::Length(9),
    Constraint::Length(8),
    Constraint::Length(11),
    Constraint::Length(6),
    Constraint::Length(7),
    Constraint::Length(12),
    Constraint::Length(4),
    Constraint::Min(14),
    Constraint::Length(11),
];

/// This daemon's tenants.
fn host_screen(url: &str, by: SortBy) -> anyhow::Result<(Screen, Duration)> {
    let status: Status = fetch(url, "/api/v1/status")?;
    let mut list: TenantList = fetch(url, "/api/v1/tenants")?;
    sort(&mut list.tenants, by);
    let rows = list
        .tenants
        .iter()
        .map(|t| {
            let alert = t.floor_met == Some(false) || !t.available;
            (row(t).to_vec(), alert)
        })
        .collect();
    let screen = Screen {
        title: vec![status_line(&status)],
        header: &HEADER,
        widths: &TENANT_WIDTHS,
        rows,
        table_title: " tenants ",
    };
    Ok((screen, Duration::from_secs_f64(status.interval_s)))
}

const CLUSTER_HEADER: [&str; 9] = [
    "HOST",
    "TENANT",
    "CLASS",
    "IOPS",
    "BW/s",
    "FLOOR",
    "USE/FLOOR",
    "CAPS",
    "ALLOCATED",
];

const CLUSTER_WIDTHS: [Constraint; 9] = [
    Constraint::Length(10),
    Constraint::Min(16),
    Constraint::Length(9),
    Constraint::Length(8),
    Constraint::Length(11),
    Constraint::Length(12),
    Constraint::Length(9),
    Constraint::Min(14),
    Constraint::Min(14),
];

/// Use against the floor, for floors in IOPS or bytes (a cost floor needs
/// the host's cost model, which the cluster view does not carry).
fn use_of_floor(t: &TenantRow) -> Option<f64> {
    match t.floor? {
        Rate::Iops(f) if f > 0.0 => Some(t.iops? / f),
        Rate::BytesPerSec(f) if f > 0.0 => Some(t.bytes_per_s? / f),
        _ => None,
    }
}

/// A tenant's row on the cluster screen, and whether it is short of its
/// floor (drawn highlighted).
fn cluster_row(host: &str, t: &TenantRow) -> (Vec<String>, bool) {
    let share = use_of_floor(t);
    let cells = vec![
        host.to_string(),
        t.name.clone(),
        t.class.as_str().into(),
        t.iops
            .map(|v| format!("{v:.0}"))
            .unwrap_or_else(|| "-".into()),
        t.bytes_per_s
            .map(format_bytes)
            .unwrap_or_else(|| "-".into()),
        rate_text(t.floor),
        share
            .map(|s| format!("{:.0} %", s * 100.0))
            .unwrap_or_else(|| "-".into()),
        caps_text(&t.caps),
        t.allocated
            .as_ref()
            .map(caps_text)
            .unwrap_or_else(|| "-".into()),
    ];
    (cells, share.is_some_and(|s| s < 0.95))
}

/// Every host's tenants of the shared device, from any agent.
fn cluster_screen(url: &str, by: SortBy) -> anyhow::Result<(Screen, Duration)> {
    let status: Status = fetch(url, "/api/v1/status")?;
    let view: ClusterView = fetch(url, "/api/v1/cluster")?;
    let mut tenants: Vec<(&str, &TenantRow)> = view
        .hosts
        .iter()
        .flat_map(|h| h.tenants.iter().map(move |t| (h.host.as_str(), t)))
        .collect();
    let usage = |t: &TenantRow| t.iops.unwrap_or(0.0);
    match by {
        SortBy::Usage | SortBy::Cost => tenants.sort_by(|a, b| usage(b.1).total_cmp(&usage(a.1))),
        // The lowest share of its floor first.
        SortBy::Floor => tenants.sort_by(|a, b| {
            let share = |t: &TenantRow| use_of_floor(t).unwrap_or(f64::INFINITY);
            share(a.1).total_cmp(&share(b.1))
        }),
        SortBy::Name => tenants.sort_by(|a, b| (a.0, &a.1.name).cmp(&(b.0, &b.1.name))),
    }
    let rows = tenants
        .iter()
        .map(|(host, t)| cluster_row(host, t))
        .collect();
    let hosts: Vec<String> = view
        .hosts
        .iter()
        .map(|h| format!("{} {:.0} IOPS", h.host, h.iops))
        .collect();
    let number = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into());
    let mut title = vec![
        status_line(&status),
        format!(
            "cluster {} · device {} · allocator {} (epoch {}) · capacity {} · floors {} · {} hosts: {}",
            view.cluster,
            view.device,
            view.allocator.as_deref().unwrap_or("none"),
            view.epoch.map(|e| e.to_string()).unwrap_or_else(|| "-".into()),
            number(view.capacity),
            number(view.floors),
            view.hosts.len(),
            hosts.join(", ")
        ),
    ];
    if !view.quiet.is_empty() {
        let quiet: Vec<String> = view
            .quiet
            .iter()
            .map(|q| format!("{} {:.3}", q.host, q.load))
            .collect();
        title.push(format!(
            "quiet hosts, caps still in force (last load): {}",
            quiet.join(", ")
        ));
    }
    let screen = Screen {
        title,
        header: &CLUSTER_HEADER,
        widths: &CLUSTER_WIDTHS,
        rows,
        table_title: " every host's tenants ",
    };
    Ok((screen, Duration::from_secs_f64(status.interval_s)))
}

/// A fetched screen: its title lines and the help above, the table below.
fn draw_screen(frame: &mut ratatui::Frame, [head, body]: [Rect; 2], screen: &Screen, by: SortBy) {
    let help = format!("sorted by {} · s: sort · q: quit", by.label());
    let lines = screen
        .title
        .iter()
        .map(|l| Line::from(l.clone()))
        .chain(std::iter::once(Line::from(help)))
        .collect::<Vec<_>>();
    frame.render_widget(Paragraph::new(lines), head);
    let rows = screen.rows.iter().map(|(cells, alert)| {
        let style = if *alert {
            Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED)
        } else {
            Style::default()
        };
        Row::new(cells.iter().map(|c| Cell::from(c.clone()))).style(style)
    });
    let table = Table::new(rows, screen.widths.to_vec())
        .header(
            Row::new(screen.header.to_vec()).style(Style::default().add_modifier(Modifier::BOLD)),
        )
        .block(Block::bordered().title(screen.table_title));
    frame.render_widget(table, body);
}

pub fn run(url: &str, sort_arg: &str, once: bool, cluster: bool) -> anyhow::Result<()> {
    let mut by = SortBy::parse(sort_arg).ok_or_else(|| {
        crate::common::bad(format!(
            "--sort: `{sort_arg}` is not one of usage, cost, floor, name"
        ))
    })?;
    let screen = |by: SortBy| {
        if cluster {
            cluster_screen(url, by)
        } else {
            host_screen(url, by)
        }
    };
    let (first, interval) = screen(by)?;
    if once {
        print_once(&first);
        return Ok(());
    }
    let refresh = interval.clamp(Duration::from_millis(100), Duration::from_secs(60));
    let mut terminal = ratatui::init();
    let result = (|| -> anyhow::Result<()> {
        loop {
            let fetched = screen(by);
            terminal.draw(|frame| {
                let [head, body] = Layout::vertical([Constraint::Length(3), Constraint::Min(0)])
                    .areas(frame.area());
                match &fetched {
                    Ok((screen, _)) => draw_screen(frame, [head, body], screen, by),
                    Err(e) => {
                        frame.render_widget(
                            Paragraph::new(format!("{e:#}\n(retrying; q to quit)")),
                            frame.area(),
                        );
                    }
                }
            })?;
            if crossterm::event::poll(refresh)? {
                if let crossterm::event::Event::Key(k) = crossterm::event::read()? {
                    use crossterm::event::KeyCode;
                    match k.code {
                        KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                        KeyCode::Char('c')
                            if k.modifiers
                                .contains(crossterm::event::KeyModifiers::CONTROL) =>
                        {
                            return Ok(())
                        }
                        KeyCode::Char('s') => by = by.next(),
                        _ => {}
                    }
                }
            }
        }
    })();
    ratatui::restore();
    result
}
