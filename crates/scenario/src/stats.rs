//! The two accumulators every platform fills while a run goes: a latency
//! distribution per tenant and the policy's decision times. One definition, so
//! a simulated and a real p99 are the same statistic.

use hdrhistogram::Histogram;
use iofloor_report::record::LatencySummary;
use std::time::Duration;

/// Completion latencies of one tenant after warm-up (1 ns to 1000 s, 2 significant digits).
#[derive(Debug, Clone)]
pub struct LatencyRecorder {
    hist: Histogram<u64>,
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        LatencyRecorder {
            hist: Histogram::new_with_bounds(1, 1_000_000_000_000, 2)
                .expect("constant histogram bounds are valid"),
        }
    }
}

impl LatencyRecorder {
    /// Records one completion; latencies beyond the range count as its maximum.
    pub fn record_ns(&mut self, latency_ns: u64) {
        self.hist.saturating_record(latency_ns.max(1));
    }

    pub fn summary(&self) -> LatencySummary {
        let ms = |ns: u64| ns as f64 / 1e6;
        let h = &self.hist;
        LatencySummary {
            count: h.len(),
            mean_ms: h.mean() / 1e6,
            p50_ms: ms(h.value_at_quantile(0.5)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        }
    }
}

/// How long the policy took to decide, over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DecisionStats {
    max_us: f64,
    sum_us: f64,
    count: u64,
}

impl DecisionStats {
    pub fn record(&mut self, took: Duration) {
        let us = took.as_secs_f64() * 1e6;
        self.max_us = self.max_us.max(us);
        self.sum_us += us;
        self.count += 1;
    }

    pub fn max_us(&self) -> f64 {
        self.max_us
    }

    pub fn mean_us(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_us / self.count as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_of_known_samples() {
        let mut r = LatencyRecorder::default();
        for ms in 1..=100u64 {
            r.record_ns(ms * 1_000_000);
        }
        let s = r.summary();
        assert_eq!(s.count, 100);
        assert!((s.p99_ms - 99.0).abs() < 1.0, "{s:?}");
        assert!((s.mean_ms - 50.5).abs() < 0.5, "{s:?}");
        let mut d = DecisionStats::default();
        assert_eq!(d.mean_us(), 0.0);
        d.record(Duration::from_micros(10));
        d.record(Duration::from_micros(30));
        assert_eq!((d.max_us(), d.mean_us()), (30.0, 20.0));
    }
}
