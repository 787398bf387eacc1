//! iofloor-report: what a run leaves behind and what is said about it. A
//! [`record::RunRecord`] holds the raw per-window figures of one policy on one
//! scenario, from the simulator or from a real device; [`metrics`] computes the
//! project's measures (floor-miss rate, work conservation, reaction time,
//! protected p99) exactly as docs/metrics.md defines them; [`render`] writes the
//! stable JSON summary, Markdown and HTML reports and the charts of [`chart`].
//! The simulator and the fio runner share all of it, so their figures compare.

pub mod chart;
pub mod metrics;
pub mod record;
pub mod render;

pub use metrics::{compare, measure, PolicyMeasures};
pub use record::RunRecord;
