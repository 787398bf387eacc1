//! The control loop's clock and its record: when the service started, how
//! many intervals ran (early or not, overrun or not), and how long the last
//! ones took and how late they started, kept so `/api/v1/status` can show
//! percentiles (the histograms in /metrics keep the whole run, in coarse
//! buckets). The loop's timing is this part's alone: the rest of the
//! service asks it.

use crate::view::{Percentiles, Status, TickStatus, TickTiming};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Ticks the status percentiles are taken over.
const KEPT: usize = 1000;

#[derive(Debug, Default)]
pub struct TickHistory {
    duration_ms: VecDeque<f64>,
    lateness_ms: VecDeque<f64>,
}

fn percentiles(values: &VecDeque<f64>) -> Percentiles {
    let mut sorted: Vec<f64> = values.iter().copied().collect();
    sorted.sort_by(f64::total_cmp);
    // Nearest rank: the smallest value with at least p of the samples at or below it.
    let at = |p: f64| {
        let rank = ((p * sorted.len() as f64).ceil() as usize).max(1);
        sorted.get(rank - 1).copied().unwrap_or(0.0)
    };
    Percentiles {
        p50: at(0.50),
        p99: at(0.99),
        max: sorted.last().copied().unwrap_or(0.0),
    }
}

impl TickHistory {
    pub fn record(&mut self, t: &TickTiming) {
        for (kept, d) in [
            (&mut self.duration_ms, t.duration),
            (&mut self.lateness_ms, t.lateness),
        ] {
            if kept.len() == KEPT {
                kept.pop_front();
            }
            kept.push_back(d.as_secs_f64() * 1e3);
        }
    }

    pub fn status(&self) -> TickStatus {
        TickStatus {
            samples: self.duration_ms.len(),
            last_duration_ms: self.duration_ms.back().copied().unwrap_or(0.0),
            last_lateness_ms: self.lateness_ms.back().copied().unwrap_or(0.0),
            duration_ms: percentiles(&self.duration_ms),
            lateness_ms: percentiles(&self.lateness_ms),
        }
    }
}

/// When an interval's counters count as read: at a time the caller gives
/// (benchmarks and tests that drive the clock themselves), or on the
/// service's clock as each device's counters are read, after discovery.
/// Rates are counts over the time between two readings, so that time must
/// be taken when the counters are, not before discovery, whose length
/// varies with what it finds and, on a loaded host, with the CPU it gets.
#[derive(Debug, Clone, Copy)]
pub(super) enum ReadTime {
    At(Duration),
    Live,
}

/// The service's clock and tick counts.
#[derive(Debug)]
pub(super) struct TickClock {
    started: Instant,
    ticks: u64,
    /// Ticks run before the interval ended, on what a look between
    /// intervals saw (`watch_interval`).
    early_ticks: u64,
    overruns: u64,
    history: TickHistory,
    last_tick: Option<Duration>,
}

impl TickClock {
    pub(super) fn start() -> TickClock {
        TickClock {
            started: Instant::now(),
            ticks: 0,
            early_ticks: 0,
            overruns: 0,
            history: TickHistory::default(),
            last_tick: None,
        }
    }

    /// Time since the service started: the control path's `now`.
    pub(super) fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// The time an interval is read at: `at`'s, or now.
    pub(super) fn time_of(&self, at: ReadTime) -> Duration {
        match at {
            ReadTime::At(now) => now,
            ReadTime::Live => self.now(),
        }
    }

    /// Intervals begun so far.
    pub(super) fn ticks(&self) -> u64 {
        self.ticks
    }

    /// Counts an interval beginning at `now`; returns the seconds since the
    /// last one began (0 for the first).
    pub(super) fn begin(&mut self, now: Duration) -> f64 {
        self.ticks += 1;
        let dt = self
            .last_tick
            .map(|t| now.saturating_sub(t).as_secs_f64())
            .unwrap_or(0.0);
        self.last_tick = Some(now);
        dt
    }

    /// Records how an interval went.
    pub(super) fn record(&mut self, timing: &TickTiming, overrun: bool) {
        self.history.record(timing);
        self.early_ticks += u64::from(timing.early);
        self.overruns += u64::from(overrun);
    }

    /// Writes the clock's part of the status.
    pub(super) fn show(&self, status: &mut Status) {
        status.uptime_s = self.now().as_secs_f64();
        status.ticks = self.ticks;
        status.overruns = self.overruns;
        status.early_ticks = self.early_ticks;
        status.tick = self.history.status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_of_the_last_ticks_by_nearest_rank() {
        let mut h = TickHistory::default();
        assert_eq!(h.status().samples, 0);
        for ms in 1..=(KEPT as u64 + 100) {
            h.record(&TickTiming {
                duration: Duration::from_millis(ms),
                lateness: Duration::from_millis(ms % 2),
                ..TickTiming::default()
            });
        }
        let s = h.status();
        // The first 100 ticks have been dropped: 101 ..= 1100 ms remain.
        assert_eq!(s.samples, KEPT);
        assert_eq!(s.duration_ms.p50, 600.0);
        assert_eq!(s.duration_ms.p99, 1090.0);
        assert_eq!(s.duration_ms.max, 1100.0);
        assert_eq!(s.lateness_ms.max, 1.0);
        assert_eq!((s.last_duration_ms, s.last_lateness_ms), (1100.0, 0.0));
    }
}
