//! The curve a device traces: work served against I/Os in flight, one point
//! per judged interval, old points forgotten and contradicted ones dropped,
//! so a device that changed is relearned from what it does now.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

use super::{IN_FLIGHT_NOISE, MEMORY_INTERVALS, SERVED_NOISE};

/// Points kept: about one per whole interval of a minute.
const POINTS: usize = MEMORY_INTERVALS as usize / 2;

/// How the loop judged the interval a point comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PointKind {
    /// The device was the limit: its served is the plateau.
    Full,
    /// An overload's queue draining, or a floor short by latency while the
    /// loop brings the queue down: no sign of the device unloaded.
    Draining,
    /// The device served what was asked of it.
    Served,
}

/// One judged interval (or a look that found the device full).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    /// Mean I/Os in flight at the device (its queue integral over time).
    pub in_flight: f64,
    /// Work served, cost units per second.
    pub served: f64,
    /// Mean time an I/O spent at the device (µs): in flight ÷ completions.
    pub latency_us: f64,
    /// What the policy handed out, cost units per second.
    pub handed: f64,
    /// A tenant was held by a cap of ours.
    pub capped: bool,
    pub kind: PointKind,
    /// Intervals since the point was taken.
    pub age: u32,
}

impl CurvePoint {
    /// What the point shows the device served: with tenants capped, no more
    /// than was handed out (past it is a backlog let through: a throttle's
    /// burst allowance after a lull, a tenant catching up).
    pub(crate) fn shown(&self) -> f64 {
        match self.capped {
            true => self.served.min(self.handed * (1.0 + SERVED_NOISE)),
            false => self.served,
        }
    }

    /// Whether `new` shows this older point to be from a device that has
    /// since changed. A full point's served is the most the device gave at
    /// any queue: served past it (shown, not a backlog) means the device
    /// grew, a new full point below it that it shrank. Any other point is
    /// contradicted by more work with clearly fewer in flight (faster since),
    /// the same work with clearly more in flight at no less handed out, or a
    /// full point below what it served at no more in flight (slower since).
    fn contradicted_by(&self, new: &CurvePoint) -> bool {
        let more = |a: f64, b: f64| a > b * (1.0 + SERVED_NOISE);
        let fewer = |a: f64, b: f64| a * (1.0 + IN_FLIGHT_NOISE) < b;
        let new_full = new.kind == PointKind::Full;
        let grew = more(new.served, self.served) && new.shown() >= new.served;
        if self.kind == PointKind::Full {
            return grew || (new_full && more(self.served, new.served));
        }
        let same_work = same_work(new.served, self.served);
        (new_full && more(self.served, new.served) && self.in_flight <= new.in_flight)
            || (grew && fewer(new.in_flight, self.in_flight))
            || (same_work
                && !new_full
                && fewer(self.in_flight, new.in_flight)
                && new.handed >= self.handed * (1.0 - SERVED_NOISE))
    }
}

/// Served within [`SERVED_NOISE`] of each other, either way: the same work.
fn same_work(a: f64, b: f64) -> bool {
    a <= b * (1.0 + SERVED_NOISE) && b <= a * (1.0 + SERVED_NOISE)
}

/// The recent points, newest last, and what the device delivered in the
/// memory's whole intervals, which no contradiction erases (BBR's windowed
/// maximum of the delivery rate).
#[derive(Debug, Clone, Default)]
pub struct Curve {
    points: VecDeque<CurvePoint>,
    /// What the device served over each two points in a row, and the age.
    delivered: VecDeque<(f64, u32)>,
}

impl Curve {
    pub fn points(&self) -> impl Iterator<Item = &CurvePoint> {
        self.points.iter()
    }

    /// Adds a point, first dropping those it contradicts (the newer wins:
    /// a device changes, noise does not pass these margins); a full one
    /// and the least latency's outlive the others when the ring is full.
    pub fn add(&mut self, point: CurvePoint) {
        // Delivered over two whole intervals in a row: one alone may be a
        // throttle's burst allowance after a lull (the rig: 1.2 of itself).
        let sustained = self.newest().map_or(0.0, |p| p.shown().min(point.shown()));
        self.delivered.push_back((sustained, point.age));
        self.points.retain(|old| !old.contradicted_by(&point));
        if self.points.len() == POINTS {
            // The least latency stays for its memory as a full point does:
            // a device held at its plateau for a minute otherwise showed
            // its queued latency as its own, unqueued.
            let least = self.least_latency_us();
            let oldest = self
                .points
                .iter()
                .position(|p| p.kind != PointKind::Full && Some(p.latency_us) != least);
            self.points.remove(oldest.unwrap_or(0));
        }
        self.points.push_back(point);
    }

    fn newest(&self) -> Option<&CurvePoint> {
        self.points.back()
    }

    /// Ages everything by an interval and forgets what is past the memory.
    pub fn age(&mut self) {
        self.points.iter_mut().for_each(|p| p.age += 1);
        self.points.retain(|p| p.age <= MEMORY_INTERVALS);
        self.delivered.iter_mut().for_each(|d| d.1 += 1);
        self.delivered.retain(|d| d.1 <= MEMORY_INTERVALS);
    }

    /// The most the device delivered in the memory, whatever it does now.
    pub fn most_delivered(&self) -> f64 {
        self.delivered.iter().map(|d| d.0).fold(0.0, f64::max)
    }

    /// Forgets every point but the newest: the device got faster, and what
    /// bounded it before (its plateau among it) is gone.
    pub fn forget_all_but_newest(&mut self) {
        let newest = self.points.pop_back();
        self.points.clear();
        self.points.extend(newest);
    }

    /// Forgets the newest point if it found the device full: a tenant left
    /// during its interval, and its shortfall was its leaving.
    pub fn forget_newest_full(&mut self) {
        if self.newest().is_some_and(|p| p.kind == PointKind::Full) {
            self.points.pop_back();
        }
    }

    /// The plateau: the most served in an interval that found the device
    /// full (BBR's bottleneck bandwidth); `None` while none has.
    pub fn plateau(&self) -> Option<f64> {
        let full = self.points.iter().filter(|p| p.kind == PointKind::Full);
        full.map(|p| p.served).reduce(f64::max)
    }

    /// Intervals since the newest point that found the device full; `None`
    /// while none has.
    pub fn plateau_age(&self) -> Option<u32> {
        let full = self.points.iter().filter(|p| p.kind == PointKind::Full);
        full.map(|p| p.age).min()
    }

    /// The least latency seen (µs): the device's own (BBR's minimum RTT).
    pub fn least_latency_us(&self) -> Option<f64> {
        self.points.iter().map(|p| p.latency_us).reduce(f64::min)
    }

    /// Whether a remembered point did a quarter less work than `new` at a
    /// latency within noise of its: served work grew with the I/Os in
    /// flight at one latency, the linear part of the curve, up to `new`.
    /// Less apart is no evidence: a device at its plateau serves within a
    /// few per cent of it whatever it is handed, at one latency.
    pub(crate) fn linear_up_to(&self, new: &CurvePoint) -> bool {
        self.points.iter().any(|p| {
            p.served <= new.served * (1.0 - IN_FLIGHT_NOISE)
                && p.latency_us * (1.0 + IN_FLIGHT_NOISE) >= new.latency_us
        })
    }

    /// The most a remembered point shows the device served.
    pub fn most_shown(&self) -> f64 {
        self.points.iter().map(|p| p.shown()).fold(0.0, f64::max)
    }

    /// Whether `new` did the same work with [`IN_FLIGHT_NOISE`] fewer I/Os
    /// in flight than most (three at least) of the remembered points that
    /// served as much with no more handed out, within two noise margins
    /// (less handed out queues less on any device; less work is another
    /// place on the curve; a ceiling stepped down since hands out a little
    /// less than the points under the last one): the curve
    /// moved left, a neighbour left or a slow phase ended. Most, not all:
    /// the interval of the change itself is on the curve too. In flight
    /// rather than latency: a load beside ours on this host counts in both,
    /// and its in flight falls further.
    pub fn shows_faster(&self, new: &CurvePoint) -> bool {
        let comparable = self.points.iter().filter(|p| {
            p.kind == PointKind::Served
                && p.handed <= new.handed * (1.0 + 2.0 * SERVED_NOISE)
                && same_work(p.served, new.served)
        });
        let (mut more, mut all) = (0, 0);
        for p in comparable {
            all += 1;
            if new.in_flight <= p.in_flight * (1.0 - IN_FLIGHT_NOISE) {
                more += 1;
            }
        }
        more >= 3 && 2 * more > all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(in_flight: f64, served: f64, kind: PointKind) -> CurvePoint {
        CurvePoint {
            in_flight,
            served,
            latency_us: in_flight / served,
            handed: served,
            capped: true,
            kind,
            age: 0,
        }
    }

    #[test]
    fn the_plateau_is_the_most_a_full_interval_served() {
        let mut c = Curve::default();
        c.add(point(0.5, 0.5, PointKind::Served));
        assert_eq!(c.plateau(), None);
        c.add(point(8.0, 0.95, PointKind::Full));
        c.add(point(20.0, 0.97, PointKind::Full));
        assert_eq!(c.plateau(), Some(0.97));
    }

    #[test]
    fn a_smaller_device_drops_what_the_larger_one_served() {
        let mut c = Curve::default();
        c.add(point(3.0, 0.97, PointKind::Served));
        c.add(point(30.0, 1.0, PointKind::Full));
        // Cut by 15 %: full at 0.85 with a longer queue.
        c.add(point(40.0, 0.85, PointKind::Full));
        assert_eq!(c.plateau(), Some(0.85));
        assert!(c.points().all(|p| p.served <= 0.85 + 1e-9));
    }

    #[test]
    fn a_point_serving_more_at_as_many_in_flight_drops_the_old_plateau() {
        let mut c = Curve::default();
        c.add(point(10.0, 0.8, PointKind::Full));
        c.add(point(10.0, 0.95, PointKind::Served));
        assert_eq!(c.plateau(), None);
    }

    #[test]
    fn a_busy_device_still_serving_more_with_more_in_flight_keeps_its_points() {
        let mut c = Curve::default();
        for (n, x) in [(0.3, 0.5), (1.5, 0.7), (4.0, 0.9), (9.0, 0.95)] {
            c.add(point(n, x, PointKind::Served));
        }
        assert_eq!(c.points().count(), 4);
    }

    #[test]
    fn the_same_work_in_far_fewer_in_flight_shows_a_faster_device() {
        let mut c = Curve::default();
        for _ in 0..3 {
            c.add(point(6.0, 0.8, PointKind::Served));
        }
        assert!(c.shows_faster(&point(2.0, 0.8, PointKind::Served)));
        assert!(!c.shows_faster(&point(5.5, 0.8, PointKind::Served)));
        // Less served waits less on any device: no sign.
        assert!(!c.shows_faster(&point(2.0, 0.5, PointKind::Served)));
    }

    #[test]
    fn old_points_are_forgotten() {
        let mut c = Curve::default();
        c.add(point(10.0, 0.8, PointKind::Full));
        for _ in 0..=MEMORY_INTERVALS {
            c.age();
        }
        assert_eq!(c.points().count(), 0);
    }
}
