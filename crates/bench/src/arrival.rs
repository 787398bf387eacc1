//! When a tenant's I/O really began, for the window it began in: fio
//! processes take a few hundred milliseconds to issue their first I/O after
//! they are started, so a tenant back from idle is active for only part of
//! its first window (see `TenantWindow::active_share`).

use iofloor_core::control::Counters;
use std::time::Duration;

/// Per tenant: started and not yet seen doing I/O (the last time it was
/// seen without, and its counters then), or seen beginning at a time.
#[derive(Debug, Default)]
pub(crate) struct Arrivals {
    awaiting: Vec<Option<(Duration, Counters)>>,
    began: Vec<Option<Duration>>,
}

fn ios(c: &Counters) -> u64 {
    c.read_ios.saturating_add(c.write_ios)
}

impl Arrivals {
    pub(crate) fn new(tenants: usize) -> Arrivals {
        Arrivals {
            awaiting: vec![None; tenants],
            began: vec![None; tenants],
        }
    }

    /// Tenant `i` had no process and was given some at `now`, its counters
    /// then being `counters`.
    pub(crate) fn started(&mut self, i: usize, now: Duration, counters: Counters) {
        if let Some(slot) = self.awaiting.get_mut(i) {
            *slot = Some((now, counters));
        }
    }

    /// The tenants still waiting for their first I/O.
    pub(crate) fn waiting(&self) -> impl Iterator<Item = usize> + '_ {
        self.awaiting
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.is_some().then_some(i))
    }

    /// Tenant `i`'s counters read at `now` (or later): if they moved, its
    /// I/O began after the last look that saw them still (the earliest it
    /// can have, so the share of the window judged is never too small).
    pub(crate) fn seen(&mut self, i: usize, now: Duration, counters: &Counters) {
        let Some(Some((quiet_at, at_start))) = self.awaiting.get(i) else {
            return;
        };
        if ios(counters) > ios(at_start) {
            self.began[i] = Some(*quiet_at);
            self.awaiting[i] = None;
        } else {
            self.awaiting[i] = Some((now, *at_start));
        }
    }

    /// The share of the window `(from, to]` after tenant `i`'s I/O began,
    /// if it began within it; forgotten once asked.
    pub(crate) fn active_share(&mut self, i: usize, from: Duration, to: Duration) -> Option<f64> {
        let began = self.began.get_mut(i)?.take()?;
        let span = to.saturating_sub(from).as_secs_f64();
        (began > from && span > 0.0)
            .then(|| (to.saturating_sub(began).as_secs_f64() / span).clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_ios(n: u64) -> Counters {
        Counters {
            read_ios: n,
            ..Default::default()
        }
    }

    #[test]
    fn io_that_begins_mid_window_is_judged_from_the_last_look_without_it() {
        let ms = Duration::from_millis;
        let mut a = Arrivals::new(2);
        a.started(1, ms(10_000), with_ios(5));
        a.seen(1, ms(10_050), &with_ios(5));
        a.seen(1, ms(10_400), &with_ios(5));
        assert_eq!(a.waiting().collect::<Vec<_>>(), vec![1]);
        a.seen(1, ms(10_450), &with_ios(40));
        assert_eq!(a.waiting().count(), 0);
        let share = a.active_share(1, ms(10_000), ms(11_000)).unwrap();
        assert!((share - 0.6).abs() < 1e-9, "{share}");
        assert_eq!(
            a.active_share(1, ms(11_000), ms(12_000)),
            None,
            "asked once"
        );
        assert_eq!(a.active_share(0, ms(10_000), ms(11_000)), None);
    }

    #[test]
    fn io_that_began_before_the_window_leaves_it_whole() {
        let ms = Duration::from_millis;
        let mut a = Arrivals::new(1);
        a.started(0, ms(9_990), with_ios(0));
        a.seen(0, ms(10_100), &with_ios(3));
        assert_eq!(a.active_share(0, ms(10_000), ms(11_000)), None);
    }
}
