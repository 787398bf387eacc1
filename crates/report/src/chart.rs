//! Charts of a run, as SVG: the stacked per-tenant throughput of seed 001
//! Fig. 3(a)(b), each tenant against its floor, and the device queue with the
//! response time of Fig. 3(c)(d). Text is drawn with a bundled font, so no
//! system font library is needed.

use crate::record::RunRecord;
use plotters::prelude::*;
use std::sync::Once;

static FONT: &[u8] = include_bytes!("../../../assets/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

fn register_font() {
    REGISTER.call_once(|| {
        // Only fails if the bundled file is not a font, which a test would catch.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

const W: u32 = 900;
const H: u32 = 360;

fn palette(i: usize) -> RGBColor {
    const COLOURS: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    COLOURS[i % COLOURS.len()]
}

/// The unit charts use: the tenants' common floor unit, else cost.
fn chart_unit(run: &RunRecord) -> iofloor_core::units::RateUnit {
    let first = run.tenants.first().map(|t| t.unit);
    match first {
        Some(u) if run.tenants.iter().all(|t| t.unit == u) => u,
        _ => iofloor_core::units::RateUnit::Cost,
    }
}

/// Scale and label for a unit's axis.
fn axis(unit: iofloor_core::units::RateUnit) -> (f64, &'static str) {
    use iofloor_core::units::RateUnit::*;
    match unit {
        Iops => (1.0, "IOPS"),
        BytesPerSec => (1.0 / 1048576.0, "MiB/s"),
        Cost => (100.0, "% of device (cost)"),
    }
}

type ChartResult = Result<String, ChartError>;

/// Why plotters could not draw a chart into its SVG string.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    // Debug, not Display: the text this message has always shown.
    #[error("chart drawing failed: {0:?}")]
    Drawing(#[from] DrawingAreaErrorKind<std::io::Error>),
}

/// The legend box every chart draws.
fn legend<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> Result<(), ChartError>
where
    X: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(position)
        .draw()?;
    Ok(())
}

/// Stacked per-tenant throughput over time.
pub fn stacked_throughput(run: &RunRecord) -> ChartResult {
    register_font();
    let unit = chart_unit(run);
    let (scale, label) = axis(unit);
    let n = run.tenants.len();
    let mut stacks: Vec<Vec<(f64, f64)>> = vec![Vec::new(); n];
    let mut top = 0.0f64;
    for w in &run.windows {
        let mut acc = 0.0;
        for (stack, tw) in stacks.iter_mut().zip(&w.tenants) {
            acc += tw.got.in_unit(unit) * scale;
            stack.push((w.t, acc));
        }
        top = top.max(acc);
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("{} / {}: stacked throughput", run.scenario, run.policy),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..run.duration_s.max(1.0), 0.0..(top * 1.1).max(1e-9))?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc(label)
            .draw()?;
        for i in (0..n).rev() {
            let colour = palette(i);
            chart
                .draw_series(
                    AreaSeries::new(stacks[i].iter().copied(), 0.0, colour.mix(0.8))
                        .border_style(colour),
                )?
                .label(run.tenants[i].name.clone())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled())
                });
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        root.present()?;
    }
    Ok(svg)
}

/// Each tenant's throughput as a line, its floor dashed in the same colour.
pub fn per_tenant_vs_floor(run: &RunRecord) -> ChartResult {
    register_font();
    let unit = chart_unit(run);
    let (scale, label) = axis(unit);
    let top = run
        .windows
        .iter()
        .flat_map(|w| w.tenants.iter().map(|t| t.got.in_unit(unit) * scale))
        .fold(0.0f64, f64::max)
        .max(
            run.tenants
                .iter()
                .filter_map(|t| t.floor)
                .map(|f| f.value() * scale)
                .fold(0.0, f64::max),
        );
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "{} / {}: each tenant against its floor (dashed)",
                    run.scenario, run.policy
                ),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..run.duration_s.max(1.0), 0.0..(top * 1.1).max(1e-9))?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc(label)
            .draw()?;
        for (i, t) in run.tenants.iter().enumerate() {
            let colour = palette(i);
            chart
                .draw_series(LineSeries::new(
                    run.windows
                        .iter()
                        .map(|w| (w.t, w.tenants[i].got.in_unit(unit) * scale)),
                    colour.stroke_width(2),
                ))?
                .label(t.name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 15, y)], colour.stroke_width(2))
                });
            if let Some(floor) = t.floor.filter(|f| f.unit() == unit) {
                let y = floor.value() * scale;
                chart.draw_series(DashedLineSeries::new(
                    [(0.0, y), (run.duration_s, y)],
                    6,
                    4,
                    colour.stroke_width(1),
                ))?;
            }
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        root.present()?;
    }
    Ok(svg)
}

/// Device queue size and mean response time over time.
pub fn queue_and_latency(run: &RunRecord) -> ChartResult {
    register_font();
    let q_top = run
        .windows
        .iter()
        .map(|w| w.device.avg_queue)
        .fold(0.0f64, f64::max)
        .max(1.0);
    let l_top = run
        .windows
        .iter()
        .filter_map(|w| w.device.mean_latency_ms)
        .fold(0.0f64, f64::max)
        .max(1e-3);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "{} / {}: device queue and response time",
                    run.scenario, run.policy
                ),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .right_y_label_area_size(60)
            .build_cartesian_2d(0.0..run.duration_s.max(1.0), 0.0..q_top * 1.1)?
            .set_secondary_coord(0.0..run.duration_s.max(1.0), 0.0..l_top * 1.1);
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc("queue size (I/Os)")
            .draw()?;
        chart
            .configure_secondary_axes()
            .y_desc("mean response time (ms)")
            .draw()?;
        let blue = palette(0);
        let red = palette(3);
        chart
            .draw_series(LineSeries::new(
                run.windows.iter().map(|w| (w.t, w.device.avg_queue)),
                blue.stroke_width(2),
            ))?
            .label("queue size")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 15, y)], blue.stroke_width(2))
            });
        chart
            .draw_secondary_series(LineSeries::new(
                run.windows
                    .iter()
                    .filter_map(|w| w.device.mean_latency_ms.map(|l| (w.t, l))),
                red.stroke_width(2),
            ))?
            .label("response time")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], red.stroke_width(2)));
        legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        root.present()?;
    }
    Ok(svg)
}

/// The capacity the policy learned against what the device could do, over
/// time, both as multiples of the model's; `None` for a run whose policy
/// learns none.
pub fn capacity(run: &RunRecord) -> Option<ChartResult> {
    run.learns_capacity().then(|| capacity_chart(run))
}

fn capacity_chart(run: &RunRecord) -> ChartResult {
    register_font();
    let learned: Vec<(f64, f64)> = run
        .windows
        .iter()
        .filter_map(|w| w.device.capacity.map(|c| (w.t, c)))
        .collect();
    let truth: Vec<(f64, f64)> = run
        .windows
        .iter()
        .filter_map(|w| w.device.true_capacity.map(|c| (w.t, c)))
        .collect();
    let top = learned
        .iter()
        .chain(&truth)
        .map(|(_, c)| *c)
        .filter(|c| c.is_finite())
        .fold(1.0f64, f64::max);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("{} / {}: learned capacity", run.scenario, run.policy),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..run.duration_s.max(1.0), 0.0..top * 1.15)?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc("capacity (x the model's)")
            .draw()?;
        let green = palette(2);
        if !truth.is_empty() {
            chart
                .draw_series(LineSeries::new(truth, green.stroke_width(4)))?
                .label("what the device could do")
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 15, y)], green.stroke_width(4))
                });
        }
        let blue = palette(0);
        chart
            .draw_series(LineSeries::new(learned, blue.stroke_width(2)))?
            .label("learned")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 15, y)], blue.stroke_width(2))
            });
        legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        root.present()?;
    }
    Ok(svg)
}

/// The device's curve as the capacity loop traced it: work served against
/// I/Os in flight at each decision (a whole interval, or a look's stretch),
/// those that found the device full apart: where the curve flattens is its
/// plateau (docs/policies.md#closed-loop-capacity). `None` for a run whose
/// policy learns no capacity.
pub fn curve(run: &RunRecord) -> Option<ChartResult> {
    (!run.capacity_trace.is_empty()).then(|| curve_chart(run, &run.capacity_trace))
}

fn curve_chart(run: &RunRecord, trace: &[crate::record::CapacityTraceEntry]) -> ChartResult {
    use iofloor_core::capacity::Verdict;
    register_font();
    let points: Vec<(f64, f64, bool)> = trace
        .iter()
        .filter_map(|e| {
            let n = e.step.seen.avg_queue?;
            (n.is_finite() && e.step.seen.served.is_finite() && e.step.seen.served > 0.0)
                .then_some((n, e.step.seen.served, e.step.verdict == Verdict::Overloaded))
        })
        .collect();
    let right = points.iter().map(|p| p.0).fold(1.0f64, f64::max);
    let top = points.iter().map(|p| p.1).fold(0.1f64, f64::max);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "{} / {}: served against in flight",
                    run.scenario, run.policy
                ),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .build_cartesian_2d((0.0..right * 1.05).log_scale(), 0.0..top * 1.15)?;
        chart
            .configure_mesh()
            .x_desc("I/Os in flight (mean)")
            .y_desc("served (x the model's capacity)")
            .draw()?;
        for (full, color, label) in [
            (false, palette(0), "interval"),
            (true, palette(3), "found full"),
        ] {
            chart
                .draw_series(
                    points
                        .iter()
                        .filter(|p| p.2 == full)
                        .map(|p| Circle::new((p.0.max(1e-3), p.1), 3, color.filled())),
                )?
                .label(label)
                .legend(move |(x, y)| Circle::new((x + 7, y), 3, color.filled()));
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        root.present()?;
    }
    Ok(svg)
}
