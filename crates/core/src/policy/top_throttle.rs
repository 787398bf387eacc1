//! `top-throttle`: Algorithm 1 of the seed paper (seed 001, §3.4), the
//! published baseline iofloor is measured against.
//!
//! Every `cap_interval` the controller sums the tenants' bandwidth and IOPS of
//! the last sample. If the bandwidth sum exceeds `border` × the device's
//! maximum, the tenant with the highest bandwidth is capped at `rate` × its
//! bandwidth for `cap_time`; IOPS are handled the same way, independently. A
//! tenant capped again has its cap replaced and its timer restarted. Caps are
//! never released early and never raised: the weaknesses the paper names.
//!
//! The paper gives border 90 %, cap_time 60 s and cap_interval 5 s; it does not
//! state `rate` (only 0 < rate < 1), so 0.5 is the default here.

use super::{secs, Policy, PolicyContext};
use crate::model::{Caps, Direction, Snapshot, Usage};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopThrottleParams {
    /// Share of the device maximum above which control starts.
    pub border: f64,
    /// Factor applied to the top tenant's current value.
    pub rate: f64,
    /// How long a cap stays, in seconds.
    pub cap_time_s: f64,
    /// Decision period, in seconds.
    pub cap_interval_s: f64,
    /// Maximum bandwidth of the workload in bytes/s (measured beforehand, as in
    /// the paper). Default: derived from the cost model for the current mix.
    pub max_bps: Option<f64>,
    /// Maximum IOPS of the workload. Default: from the cost model, as above.
    pub max_iops: Option<f64>,
}

impl Default for TopThrottleParams {
    fn default() -> Self {
        TopThrottleParams {
            border: crate::judge::DEFAULT_BORDER,
            rate: 0.5,
            cap_time_s: 60.0,
            cap_interval_s: 5.0,
            max_bps: None,
            max_iops: None,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct ActiveCap {
    bps: Option<(f64, Duration)>,
    iops: Option<(f64, Duration)>,
}

pub struct TopThrottlePolicy {
    params: TopThrottleParams,
    ctx: PolicyContext,
    last_run: Option<Duration>,
    caps: HashMap<String, ActiveCap>,
}

impl TopThrottlePolicy {
    pub fn new(params: TopThrottleParams, ctx: PolicyContext) -> Self {
        TopThrottlePolicy {
            params,
            ctx,
            last_run: None,
            caps: HashMap::new(),
        }
    }

    fn run_algorithm(&mut self, snapshot: &Snapshot) {
        let now = snapshot.now;
        let cap_time = Duration::from_secs_f64(self.params.cap_time_s);
        let usages: Vec<(&str, Usage)> = snapshot
            .tenants
            .iter()
            .filter_map(|t| t.usage.map(|u| (t.spec.name.as_str(), u)))
            .collect();
        let bsum: f64 = usages.iter().map(|(_, u)| u.bytes_per_sec()).sum();
        let isum: f64 = usages.iter().map(|(_, u)| u.iops()).sum();
        let cost_sum: f64 = usages.iter().map(|(_, u)| self.ctx.cost.cost_rate(u)).sum();
        // The device's maximum for the current workload: what it would do at full cost.
        let full = |sum: f64| {
            if cost_sum > 0.0 {
                sum * self.ctx.capacity / cost_sum
            } else {
                f64::INFINITY
            }
        };
        let b_border = self.params.border * self.params.max_bps.unwrap_or_else(|| full(bsum));
        let i_border = self.params.border * self.params.max_iops.unwrap_or_else(|| full(isum));
        let top = |key: fn(&Usage) -> f64| {
            usages
                .iter()
                .max_by(|a, b| key(&a.1).total_cmp(&key(&b.1)))
                .map(|(n, u)| (n.to_string(), key(u)))
        };
        if bsum > b_border {
            if let Some((name, b)) = top(Usage::bytes_per_sec) {
                self.caps.entry(name).or_default().bps =
                    Some((self.params.rate * b, now + cap_time));
            }
        }
        if isum > i_border {
            if let Some((name, i)) = top(Usage::iops) {
                self.caps.entry(name).or_default().iops =
                    Some((self.params.rate * i, now + cap_time));
            }
        }
    }
}

/// Splits a total cap (QEMU's `bps`/`iops` totals) between the kernel's read
/// and write caps by the tenant's current mix. A direction without traffic
/// gets the whole total rather than zero, which would stop it dead.
fn split(
    total: f64,
    mix: Option<&Usage>,
    per_dir: impl Fn(&Usage, Direction) -> f64,
) -> (f64, f64) {
    let (r, w) = match mix {
        Some(u) => (per_dir(u, Direction::Read), per_dir(u, Direction::Write)),
        None => (0.0, 0.0),
    };
    let share = |x: f64| if x > 0.0 { total * x / (r + w) } else { total };
    (share(r), share(w))
}

impl Policy for TopThrottlePolicy {
    fn name(&self) -> &'static str {
        "top-throttle"
    }

    /// Contended by the border it throttles at.
    fn verdicts(&self, snapshot: &Snapshot) -> crate::judge::Verdicts {
        super::verdicts_at_model(&self.ctx, snapshot, self.params.border)
    }

    fn decide(&mut self, snapshot: &Snapshot) -> Vec<Caps> {
        let now = snapshot.now;
        let due = match self.last_run {
            None => true,
            Some(last) => secs(now.saturating_sub(last)) + 1e-9 >= self.params.cap_interval_s,
        };
        if due {
            self.last_run = Some(now);
            self.run_algorithm(snapshot);
        }
        for cap in self.caps.values_mut() {
            if cap.bps.is_some_and(|(_, until)| until <= now) {
                cap.bps = None;
            }
            if cap.iops.is_some_and(|(_, until)| until <= now) {
                cap.iops = None;
            }
        }
        self.caps.retain(|_, c| c.bps.is_some() || c.iops.is_some());
        snapshot
            .tenants
            .iter()
            .map(|t| {
                let Some(active) = self.caps.get(&t.spec.name) else {
                    return Caps::NONE;
                };
                let mix = t.usage.as_ref();
                let mut caps = Caps::NONE;
                if let Some((bps, _)) = active.bps {
                    let (r, w) = split(bps, mix, |u, d| u.dir(d).bytes);
                    caps.read_bps = Some(r);
                    caps.write_bps = Some(w);
                }
                if let Some((iops, _)) = active.iops {
                    let (r, w) = split(iops, mix, |u, d| u.dir(d).ios);
                    caps.read_iops = Some(r);
                    caps.write_iops = Some(w);
                }
                caps
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::*;

    #[test]
    fn caps_the_top_tenant_for_cap_time_every_cap_interval() {
        let mut p = TopThrottlePolicy::new(TopThrottleParams::default(), ctx());
        let tenants = vec![
            tenant("noisy", None, writes64k(700.0), Caps::NONE),
            tenant("quiet", None, writes64k(250.0), Caps::NONE),
        ];
        let at = |s| Snapshot {
            now: Duration::from_secs(s),
            interval: Duration::from_secs(1),
            device: None,
            tenants: &tenants,
            foreign_load: 0.0,
        };
        let caps = p.decide(&at(0));
        assert!(
            (caps[0].write_iops.unwrap() - 350.0).abs() < 1e-6,
            "{caps:?}"
        );
        assert!((caps[0].write_bps.unwrap() - 350.0 * 65536.0).abs() < 1.0);
        // No reads: the read caps get the whole total, not zero.
        assert!((caps[0].read_iops.unwrap() - 350.0).abs() < 1e-6);
        assert_eq!(caps[1], Caps::NONE);
        // Not re-evaluated before cap_interval, kept until cap_time.
        assert_eq!(p.decide(&at(3)), caps);
        // Held at its cap, the total is below the border: no new cap, the old one stays.
        let held = vec![
            tenant("noisy", None, writes64k(350.0), caps[0]),
            tenant("quiet", None, writes64k(250.0), Caps::NONE),
        ];
        let at59 = Snapshot {
            now: Duration::from_secs(59),
            interval: Duration::from_secs(1),
            device: None,
            tenants: &held,
            foreign_load: 0.0,
        };
        assert_eq!(p.decide(&at59), caps);
        let quiet_load = vec![
            tenant("noisy", None, writes64k(100.0), caps[0]),
            tenant("quiet", None, writes64k(100.0), Caps::NONE),
        ];
        let later = Snapshot {
            now: Duration::from_secs(61),
            interval: Duration::from_secs(1),
            device: None,
            tenants: &quiet_load,
            foreign_load: 0.0,
        };
        assert_eq!(p.decide(&later), vec![Caps::NONE, Caps::NONE]);
    }
}
