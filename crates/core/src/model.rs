//! The data a policy sees and returns: tenants, their per-interval usage, the
//! device's state, and throttle caps. Plain values, no I/O, no clock.

use crate::error::ValidationError;
use crate::units::Rate;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// How a tenant reaches the device. VMs go through the hypervisor's block layer
/// (slower per I/O, throttled at the VMM); containers go straight to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TenantClass {
    #[default]
    Container,
    Vm,
}

impl TenantClass {
    pub fn as_str(self) -> &'static str {
        match self {
            TenantClass::Container => "container",
            TenantClass::Vm => "vm",
        }
    }
}

/// Default weight, as for cgroup v2 `io.weight`.
pub const DEFAULT_WEIGHT: f64 = 100.0;

/// What a tenant is promised: a floor it can count on, an optional ceiling it
/// never exceeds, and a weight for sharing what is left over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantSpec {
    pub name: String,
    pub class: TenantClass,
    pub floor: Option<Rate>,
    pub ceiling: Option<Rate>,
    pub weight: f64,
    /// A tenant that needs its fast path, not only its floor (seed 000's
    /// containers): under contention it may take what VMs hold above theirs.
    #[serde(default)]
    pub latency_sensitive: bool,
    /// The group the tenant belongs to, if any: the group's floor is shared
    /// by its members, and what one member leaves goes to its siblings first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<Arc<GroupSpec>>,
}

/// A group of tenants (a customer, a pod, a VM's disks) with a promise of its
/// own: a floor its members share (their own floors first, then by weight),
/// a ceiling they never exceed together, and a weight among its siblings.
/// Groups nest through `parent`; a group is known by its name, unique among
/// the groups of a device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupSpec {
    pub name: String,
    pub floor: Option<Rate>,
    pub ceiling: Option<Rate>,
    pub weight: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Arc<GroupSpec>>,
    /// Its members' caps are enforced as one limit (a QEMU throttle group,
    /// a cgroup v2 parent's `io.max`) holding their caps added up: the
    /// policy then gives them caps that add up to what the group as a whole
    /// may use, not to what each alone may.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_limit: bool,
}

impl GroupSpec {
    pub fn new(name: impl Into<String>) -> Self {
        GroupSpec {
            name: name.into(),
            floor: None,
            ceiling: None,
            weight: DEFAULT_WEIGHT,
            parent: None,
            shared_limit: false,
        }
    }

    /// The group and its ancestors, innermost first.
    pub fn lineage(self: &Arc<Self>) -> impl Iterator<Item = &Arc<GroupSpec>> {
        std::iter::successors(Some(self), |g| g.parent.as_ref())
    }
}

impl TenantSpec {
    pub fn new(name: impl Into<String>, class: TenantClass) -> Self {
        TenantSpec {
            name: name.into(),
            class,
            floor: None,
            ceiling: None,
            weight: DEFAULT_WEIGHT,
            latency_sensitive: false,
            group: None,
        }
    }

    pub fn with_floor(mut self, floor: Rate) -> Self {
        self.floor = Some(floor);
        self
    }

    /// Checks the promise makes sense: positive rates, a ceiling not below
    /// the floor (when in the same unit), a weight in (0, 10000] as for
    /// cgroup v2 `io.weight`. The message names the key.
    pub fn check_promise(&self) -> Result<(), ValidationError> {
        check_promise(self.floor, self.ceiling, Some(self.weight))
    }
}

/// [`TenantSpec::check_promise`] on parts, for files and API bodies that
/// give only some of them.
pub fn check_promise(
    floor: Option<Rate>,
    ceiling: Option<Rate>,
    weight: Option<f64>,
) -> Result<(), ValidationError> {
    if let Some(w) = weight {
        if !(w > 0.0 && w <= 10000.0) {
            return Err(ValidationError::new(
                "weight",
                format!("must be in (0, 10000], got {w}"),
            ));
        }
    }
    for (key, rate) in [("floor", floor), ("ceiling", ceiling)] {
        if let Some(r) = rate {
            if !(r.value() > 0.0 && r.value().is_finite()) {
                return Err(ValidationError::new(
                    key,
                    format!("must be positive, got {r}"),
                ));
            }
        }
    }
    if let (Some(f), Some(c)) = (floor, ceiling) {
        if f.unit() == c.unit() && c.value() < f.value() {
            return Err(ValidationError::new(
                "ceiling",
                format!("{c} is below `floor` {f}"),
            ));
        }
    }
    Ok(())
}

/// Read or write: the kernel throttles and counts them separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Read,
    Write,
}

/// One direction's traffic over an interval, as rates per second.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct DirUsage {
    pub ios: f64,
    pub bytes: f64,
    /// The part of `ios` that was sequential (0 when unknown: priced as random,
    /// which is the conservative choice).
    pub seq_ios: f64,
}

impl DirUsage {
    pub fn avg_size(&self) -> Option<f64> {
        (self.ios > 0.0).then(|| self.bytes / self.ios)
    }

    fn scaled(&self, k: f64) -> DirUsage {
        DirUsage {
            ios: self.ios * k,
            bytes: self.bytes * k,
            seq_ios: self.seq_ios * k,
        }
    }
}

/// A tenant's traffic over one control interval, as rates per second.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub read: DirUsage,
    pub write: DirUsage,
    /// Mean completion latency in microseconds, where the backend can see it.
    pub latency_us: Option<f64>,
}

impl Usage {
    pub fn dir(&self, d: Direction) -> &DirUsage {
        match d {
            Direction::Read => &self.read,
            Direction::Write => &self.write,
        }
    }

    pub fn iops(&self) -> f64 {
        self.read.ios + self.write.ios
    }

    pub fn bytes_per_sec(&self) -> f64 {
        self.read.bytes + self.write.bytes
    }

    pub fn is_idle(&self) -> bool {
        self.iops() <= 0.0
    }

    /// The same mix at `k` times the rate.
    pub fn scaled(&self, k: f64) -> Usage {
        Usage {
            read: self.read.scaled(k),
            write: self.write.scaled(k),
            latency_us: self.latency_us,
        }
    }
}

/// Device-wide state over the interval, like iostat's `%util` and `aqu-sz`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct DeviceSample {
    /// Fraction of the interval with at least one I/O in flight (0..1).
    pub utilisation: f64,
    /// Mean number of I/Os queued or in flight at the device.
    pub avg_queue: f64,
    /// I/Os completed per second (all of this host's, managed or not).
    #[serde(default)]
    pub iops: f64,
}

impl DeviceSample {
    /// Mean time an I/O spent at the device, in µs (Little's law: queue over
    /// throughput); `None` without completions.
    pub fn mean_latency_us(&self) -> Option<f64> {
        (self.iops > 0.0 && self.avg_queue.is_finite()).then(|| self.avg_queue / self.iops * 1e6)
    }
}

/// Throttle limits for one tenant; `None` means no limit. These map one to one
/// onto blk-throttle's `{read,write}_{iops,bps}_device`, cgroup v2 `io.max`
/// and QEMU's `iops_rd/iops_wr/bps_rd/bps_wr`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Caps {
    pub read_iops: Option<f64>,
    pub write_iops: Option<f64>,
    pub read_bps: Option<f64>,
    pub write_bps: Option<f64>,
}

impl Caps {
    pub const NONE: Caps = Caps {
        read_iops: None,
        write_iops: None,
        read_bps: None,
        write_bps: None,
    };

    pub fn is_unlimited(&self) -> bool {
        *self == Caps::NONE
    }

    pub fn iops(&self, d: Direction) -> Option<f64> {
        match d {
            Direction::Read => self.read_iops,
            Direction::Write => self.write_iops,
        }
    }

    pub fn bps(&self, d: Direction) -> Option<f64> {
        match d {
            Direction::Read => self.read_bps,
            Direction::Write => self.write_bps,
        }
    }

    /// Each limit the tighter of the two (a limit beats none).
    pub fn tighter(&self, other: &Caps) -> Caps {
        let min = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Caps {
            read_iops: min(self.read_iops, other.read_iops),
            write_iops: min(self.write_iops, other.write_iops),
            read_bps: min(self.read_bps, other.read_bps),
            write_bps: min(self.write_bps, other.write_bps),
        }
    }

    /// The caps in force over two spans, `self` for `own` seconds and
    /// `other` for `others`: each limit its time-weighted mean, none where
    /// either span had none.
    pub fn blended(&self, own: f64, other: &Caps, others: f64) -> Caps {
        if others <= 0.0 {
            return *self;
        }
        if own <= 0.0 {
            return *other;
        }
        let mean = |a: Option<f64>, b: Option<f64>| Some((a? * own + b? * others) / (own + others));
        Caps {
            read_iops: mean(self.read_iops, other.read_iops),
            write_iops: mean(self.write_iops, other.write_iops),
            read_bps: mean(self.read_bps, other.read_bps),
            write_bps: mean(self.write_bps, other.write_bps),
        }
    }

    /// Kernel interfaces take whole numbers, and 0 means "no limit" there, so a
    /// cap is rounded up and never below 1.
    pub fn rounded(&self) -> Caps {
        let r = |v: Option<f64>| v.map(|x| x.ceil().max(1.0));
        Caps {
            read_iops: r(self.read_iops),
            write_iops: r(self.write_iops),
            read_bps: r(self.read_bps),
            write_bps: r(self.write_bps),
        }
    }
}

/// One tenant as the policy sees it at a decision.
#[derive(Debug, Clone)]
pub struct TenantSample {
    pub spec: Arc<TenantSpec>,
    /// `None` when there is no trustworthy sample this interval (first read,
    /// counters went backwards, read failed): the policy keeps what it had.
    pub usage: Option<Usage>,
    /// The caps in force during the interval: where they changed within it
    /// (a cluster allocation applied as it arrives), each limit's
    /// time-weighted mean.
    pub caps: Caps,
}

/// Everything a policy decides on. Time is given, never read.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot<'a> {
    /// Time since the controller started.
    pub now: Duration,
    /// Length of the interval the samples cover.
    pub interval: Duration,
    pub device: Option<DeviceSample>,
    pub tenants: &'a [TenantSample],
    /// Load on the device the policy knows of but does not decide, in cost
    /// units per second: in a cluster, the tenants of a host whose agent is
    /// gone, still running at the caps it left. It is part of what the
    /// device serves, and what it uses is not there to hand out. 0 on a
    /// single host (load nobody reports is learned from the device alone).
    pub foreign_load: f64,
}

impl Snapshot<'_> {
    /// [`Snapshot::foreign_load`] as a load: a negative or non-finite
    /// figure (a report gone wrong) counts as none.
    pub fn foreign_load(&self) -> f64 {
        if self.foreign_load.is_finite() {
            self.foreign_load.max(0.0)
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Caps;

    #[test]
    fn blended_caps_are_time_weighted_and_none_where_a_span_had_none() {
        let iops = |v: Option<f64>| Caps {
            read_iops: v,
            write_bps: Some(1e6),
            ..Caps::NONE
        };
        let mean = iops(Some(100.0)).blended(1.0, &iops(Some(300.0)), 3.0);
        assert_eq!(mean.read_iops, Some(250.0));
        assert_eq!(mean.write_bps, Some(1e6));
        assert_eq!(
            iops(None).blended(1.0, &iops(Some(300.0)), 3.0).read_iops,
            None
        );
        assert_eq!(
            iops(None).blended(0.0, &iops(Some(300.0)), 3.0).read_iops,
            Some(300.0)
        );
        assert_eq!(
            iops(Some(100.0)).blended(2.0, &iops(None), 0.0).read_iops,
            Some(100.0)
        );
    }
}
