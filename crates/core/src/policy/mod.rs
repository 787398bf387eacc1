//! Throttle policies. A policy takes a [`Snapshot`] and returns one [`Caps`]
//! per tenant, in snapshot order. It never reads a clock or a file, so the
//! simulator, the benchmark runner and the daemon all drive the same code.

mod floor;
mod static_caps;
mod top_throttle;

pub use floor::{FloorParams, FloorPolicy};
pub use static_caps::StaticPolicy;
pub use top_throttle::{TopThrottleParams, TopThrottlePolicy};

use crate::cost::CostModel;
use crate::error::ValidationError;
use crate::judge::{self, Verdicts};
use crate::model::{Caps, Snapshot, TenantSample, TenantSpec, Usage};
use rustc_hash::FxHashMap as HashMap;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// A throttle policy.
pub trait Policy: Send {
    fn name(&self) -> &'static str;

    /// Decides the caps for every tenant of the snapshot, in its order.
    fn decide(&mut self, snapshot: &Snapshot) -> Vec<Caps>;

    /// What the last decision judged of the interval it decided on: called
    /// right after `decide` (or `decide_early`) with the same snapshot, so
    /// that what is shown follows the rule the policy decided by.
    fn verdicts(&self, snapshot: &Snapshot) -> Verdicts;

    /// The device capacity the policy currently believes in, in cost units
    /// per second, for metrics; `None` for policies that do not estimate it.
    fn capacity_estimate(&self) -> Option<f64> {
        None
    }

    /// How the capacity loop judged the interval of the last decision, for
    /// traces; `None` for policies that do not learn capacity.
    fn capacity_step(&self) -> Option<crate::capacity::CapacityStep> {
        None
    }

    /// The capacity loop's recent points of the device's curve (served
    /// against in flight), oldest first; empty for policies without one.
    fn capacity_curve(&self) -> Vec<crate::capacity::CurvePoint> {
        Vec::new()
    }

    /// Starts from a capacity another instance learned (a new cluster
    /// allocator taking over from the last allocation), as the level last
    /// known good: no probing past it until the device has shown room for a
    /// while. Policies that do not learn capacity ignore it.
    fn resume_capacity(&mut self, _estimate: f64) {}

    /// Whether the device, seen over part of an interval, shows something
    /// the next decision should not wait a whole interval for (a neighbour
    /// host's load stepping up, a tenant bursting back from idle). The
    /// caller then decides at once and starts the next interval from there.
    /// Policies that do not learn capacity never ask.
    fn wants_early_decision(&self, _device: &crate::model::DeviceSample) -> bool {
        false
    }

    /// Decides before the interval ended, after `wants_early_decision`: the
    /// samples cover the time since the last decision, partly before what
    /// the look saw; `seen` is the device over the stretch the look judged.
    fn decide_early(
        &mut self,
        snapshot: &Snapshot,
        _seen: &crate::model::DeviceSample,
    ) -> Vec<Caps> {
        self.decide(snapshot)
    }

    /// Caps decided between intervals on news from outside the counters (a
    /// cluster allocation that arrived after the last decision), for the
    /// tenants of the last snapshot in its order; `None`: nothing new, the
    /// caps in force stand. Asked at every look, so cheap without news.
    /// Local policies have none.
    fn decide_on_news(&mut self, _now: Duration) -> Option<Vec<Caps>> {
        None
    }

    /// Whether the active tenants' floors fit what the policy can hand out,
    /// for metrics and the API; `None` for policies that do not judge it.
    fn feasibility(&self) -> Option<Feasibility> {
        None
    }
}

/// Do the floors fit the device as the policy now sees it? All in cost
/// units per second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Feasibility {
    /// The capacity the policy believes in (learned, or the model's), less
    /// the load beside ours it was told of (`Snapshot::foreign_load`): what
    /// the floors must fit into.
    pub capacity: f64,
    /// What the floors of the tenants doing I/O cost.
    pub floors: f64,
    /// How much the floors exceed what is handed out (`target_utilisation` ×
    /// capacity); 0 when they fit. While positive, every entitlement is
    /// scaled down by the same factor.
    pub shortfall: f64,
    /// The mean device latency above which the device counts as
    /// overloaded, in µs (`CapacityLoop::latency_threshold_us`); `None`
    /// where a queue knee judges or there is no baseline yet.
    #[serde(default)]
    pub latency_threshold_us: Option<f64>,
    /// Whether the operator's `latency_target` is within the device's reach
    /// (not below 1.25 × its service time, `CapacityLoop::target_in_reach`); `None`
    /// without a target.
    #[serde(default)]
    pub latency_target_in_reach: Option<bool>,
}

impl Feasibility {
    pub fn feasible(&self) -> bool {
        self.shortfall <= 0.0
    }
}

/// What every policy knows about the device.
#[derive(Debug, Clone, Copy)]
pub struct PolicyContext {
    pub cost: CostModel,
    /// Capacity in cost units per second (1.0 when the cost model is exact).
    pub capacity: f64,
}

/// The policies, by the names the CLI and the config files use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    None,
    Static,
    TopThrottle,
    Floor,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::None,
        PolicyKind::Static,
        PolicyKind::TopThrottle,
        PolicyKind::Floor,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::None => "none",
            PolicyKind::Static => "static",
            PolicyKind::TopThrottle => "top-throttle",
            PolicyKind::Floor => "floor",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy `{0}` (known: none, static, top-throttle, floor)")]
pub struct UnknownPolicy(pub String);

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

/// Tunables of all policies; each section has defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyParams {
    pub floor: FloorParams,
    #[serde(rename = "top-throttle")]
    pub top_throttle: TopThrottleParams,
}

impl PolicyParams {
    /// Checks every section; the message names the offending key.
    pub fn validate(&self) -> Result<(), ValidationError> {
        self.floor.validate()?;
        let tt = &self.top_throttle;
        let bad = |key: &str, message: String| {
            Err(ValidationError::new(key, message).under("policy.top-throttle"))
        };
        if !(tt.rate > 0.0 && tt.rate < 1.0) {
            return bad("rate", format!("must be in (0, 1), got {}", tt.rate));
        }
        for (key, v) in [
            ("cap_interval_s", tt.cap_interval_s),
            ("cap_time_s", tt.cap_time_s),
        ] {
            if !(v > 0.0) {
                return bad(key, format!("must be positive, got {v}"));
            }
        }
        Ok(())
    }
}

/// Builds a policy by kind.
pub fn build(kind: PolicyKind, params: &PolicyParams, ctx: PolicyContext) -> Box<dyn Policy> {
    match kind {
        PolicyKind::None => Box::new(NonePolicy::new(ctx)),
        PolicyKind::Static => Box::new(StaticPolicy::new(ctx)),
        PolicyKind::TopThrottle => {
            Box::new(TopThrottlePolicy::new(params.top_throttle.clone(), ctx))
        }
        PolicyKind::Floor => Box::new(FloorPolicy::new(params.floor.clone(), ctx)),
    }
}

/// Best effort: no floors, nothing shared out; only the ceilings operators
/// set are held, as a static `io.max` would hold them. A ceiling is a limit
/// the operator chose, not capacity a policy leaves idle, so the reference
/// that work conservation is measured against honours it too.
pub struct NonePolicy {
    ctx: PolicyContext,
    mixes: MixMemory,
}

impl NonePolicy {
    pub fn new(ctx: PolicyContext) -> Self {
        NonePolicy {
            ctx,
            mixes: MixMemory::default(),
        }
    }
}

impl Policy for NonePolicy {
    fn name(&self) -> &'static str {
        "none"
    }
    fn decide(&mut self, snapshot: &Snapshot) -> Vec<Caps> {
        let mixes = self.mixes.observe(snapshot.tenants);
        let caps = snapshot
            .tenants
            .iter()
            .zip(&mixes)
            .map(|(t, mix)| match (t.spec.ceiling, mix) {
                (Some(ceiling), Some(mix)) => self
                    .ctx
                    .cost
                    .rate_to_cost(ceiling, mix)
                    .map_or(Caps::NONE, |c| self.ctx.cost.caps_for_cost(c, mix)),
                _ => Caps::NONE,
            })
            .collect();
        self.mixes.keep(mixes);
        caps
    }

    fn verdicts(&self, snapshot: &Snapshot) -> Verdicts {
        verdicts_at_model(&self.ctx, snapshot, judge::DEFAULT_BORDER)
    }
}

/// The verdicts of a policy that judges contention by its model alone, at
/// `border` ([`judge::contended_at_model`]).
pub(crate) fn verdicts_at_model(ctx: &PolicyContext, snapshot: &Snapshot, border: f64) -> Verdicts {
    let contended = judge::contended_at_model(snapshot, &ctx.cost, ctx.capacity, border);
    Verdicts::judge(snapshot, contended, &ctx.cost)
}

/// Per-tenant memory kept in the order of the last snapshot's tenants, so a
/// decision reads and writes it by index. Tenants come in the same order
/// (the same specs) interval after interval; only when the list changed are
/// the memories matched up again by name. Looked up by name in a hash map
/// every interval, the floor policy's memories were a fifth of a decision
/// at 10,000 tenants (hashing and comparing names).
#[derive(Debug)]
pub(crate) struct Roster<T> {
    specs: Vec<Arc<TenantSpec>>,
    values: Vec<T>,
    /// Changes whenever the tenants' specs do, for what is derived from
    /// them alone (the tree of groups).
    generation: u64,
}

impl<T> Default for Roster<T> {
    fn default() -> Self {
        Roster {
            specs: Vec::new(),
            values: Vec::new(),
            generation: 0,
        }
    }
}

impl<T: Default> Roster<T> {
    /// The memories lined up with `tenants`, lent out to be given back with
    /// [`Roster::put_back`]: a new tenant starts from `T::default()`, a gone
    /// one is forgotten. Lent rather than copied: at 10,000 tenants a copy
    /// moved half a megabyte each decision.
    pub(crate) fn take(&mut self, tenants: &[TenantSample]) -> Vec<T> {
        let same_specs = self.specs.len() == tenants.len()
            && self
                .specs
                .iter()
                .zip(tenants)
                .all(|(s, t)| Arc::ptr_eq(s, &t.spec));
        if same_specs && self.values.len() == tenants.len() {
            return std::mem::take(&mut self.values);
        }
        self.generation += 1;
        let same_names = self.specs.len() == tenants.len()
            && self.values.len() == tenants.len()
            && self
                .specs
                .iter()
                .zip(tenants)
                .all(|(s, t)| s.name == t.spec.name);
        let values = if same_names {
            std::mem::take(&mut self.values)
        } else {
            let mut kept: HashMap<&str, T> = self
                .specs
                .iter()
                .map(|s| s.name.as_str())
                .zip(self.values.drain(..))
                .collect();
            tenants
                .iter()
                .map(|t| kept.remove(t.spec.name.as_str()).unwrap_or_default())
                .collect()
        };
        self.specs = tenants.iter().map(|t| t.spec.clone()).collect();
        values
    }

    /// The memory of the tenant named `name`, for tests that set one up.
    #[cfg(test)]
    pub(crate) fn get_mut(&mut self, name: &str) -> Option<&mut T> {
        let i = self.specs.iter().position(|s| s.name == name)?;
        self.values.get_mut(i)
    }

    /// Moves on whenever the tenants' specs change.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Gives back what [`Roster::take`] lent, updated, in the same order.
    pub(crate) fn put_back(&mut self, values: Vec<T>) {
        debug_assert_eq!(values.len(), self.specs.len());
        self.values = values;
    }
}

/// Remembers each tenant's last non-idle traffic shape, so floors stated in
/// IOPS or bytes can be priced while the tenant is idle or unsampled.
#[derive(Debug, Default)]
pub(crate) struct MixMemory {
    mixes: Roster<Option<Usage>>,
}

impl MixMemory {
    /// Each tenant's mix: this interval's where it did I/O, else the last
    /// one it showed (`None` before its first I/O). To be given back with
    /// [`MixMemory::keep`] once the decision is made.
    pub(crate) fn observe(&mut self, tenants: &[TenantSample]) -> Vec<Option<Usage>> {
        let mut mixes = self.mixes.take(tenants);
        for (mix, t) in mixes.iter_mut().zip(tenants) {
            *mix = mix_seen(*mix, t);
        }
        mixes
    }

    pub(crate) fn keep(&mut self, mixes: Vec<Option<Usage>>) {
        self.mixes.put_back(mixes);
    }
}

/// A tenant's mix as [`MixMemory`] keeps it: this interval's where it did
/// I/O, else the one `remembered`.
pub(crate) fn mix_seen(remembered: Option<Usage>, t: &TenantSample) -> Option<Usage> {
    t.usage.filter(|u| !u.is_idle()).or(remembered)
}

/// Groups' floors, ceilings (infinite without one) and weights in cost
/// units, each priced at its members' traffic together (their remembered
/// mixes added up), in the order of [`Tree::groups`](crate::hierarchy::Tree).
pub(crate) struct PricedGroups {
    pub floor: Vec<f64>,
    pub ceiling: Vec<f64>,
    pub weight: Vec<f64>,
}

pub(crate) fn price_groups<'m>(
    tree: &crate::hierarchy::Tree,
    mixes: impl IntoIterator<Item = &'m Option<Usage>>,
    cost: &CostModel,
) -> PricedGroups {
    use crate::model::DirUsage;
    let parts = tree.sum_up_each(mixes.into_iter().map(|m| {
        m.map_or([0.0; 6], |u| {
            [
                u.read.ios,
                u.read.bytes,
                u.read.seq_ios,
                u.write.ios,
                u.write.bytes,
                u.write.seq_ios,
            ]
        })
    }));
    let mut out = PricedGroups {
        floor: Vec::with_capacity(tree.groups().len()),
        ceiling: Vec::with_capacity(tree.groups().len()),
        weight: Vec::with_capacity(tree.groups().len()),
    };
    for (k, g) in tree.groups().iter().enumerate() {
        let [r_ios, r_bytes, r_seq, w_ios, w_bytes, w_seq] = parts[tree.leaves() + k];
        let mix = Usage {
            read: DirUsage {
                ios: r_ios,
                bytes: r_bytes,
                seq_ios: r_seq,
            },
            write: DirUsage {
                ios: w_ios,
                bytes: w_bytes,
                seq_ios: w_seq,
            },
            latency_us: None,
        };
        out.floor.push(
            g.floor
                .and_then(|f| cost.rate_to_cost(f, &mix))
                .unwrap_or(0.0),
        );
        out.ceiling.push(
            g.ceiling
                .and_then(|c| cost.rate_to_cost(c, &mix))
                .unwrap_or(f64::INFINITY),
        );
        out.weight.push(g.weight.max(1e-9));
    }
    out
}

/// Whole seconds of a duration as f64.
pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[cfg(test)]
pub(crate) mod testutil {
    use crate::cost::{CostModel, CostParams};
    use crate::model::*;
    use crate::policy::PolicyContext;
    use crate::units::Rate;
    use std::sync::Arc;

    /// A device whose write cost is all bandwidth: 1,000 64 KiB writes per second fill it.
    pub fn ctx() -> PolicyContext {
        PolicyContext {
            cost: CostModel::new(CostParams {
                rbps: 128e6,
                rseqiops: 40_000.0,
                rrandiops: 20_000.0,
                wbps: 65.536e6,
                wseqiops: 16_000.0,
                wrandiops: 16_000.0,
            })
            .unwrap(),
            capacity: 1.0,
        }
    }

    pub fn writes64k(iops: f64) -> Usage {
        Usage {
            write: DirUsage {
                ios: iops,
                bytes: iops * 65536.0,
                seq_ios: 0.0,
            },
            ..Default::default()
        }
    }

    pub fn tenant(name: &str, floor_iops: Option<f64>, usage: Usage, caps: Caps) -> TenantSample {
        let mut spec = TenantSpec::new(name, TenantClass::Container);
        spec.floor = floor_iops.map(Rate::Iops);
        TenantSample {
            spec: Arc::new(spec),
            usage: Some(usage),
            caps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::{tenant, writes64k as writes};
    use super::*;

    fn names_of(tenants: &[TenantSample]) -> Vec<String> {
        tenants.iter().map(|t| t.spec.name.clone()).collect()
    }

    /// Each tenant's memory is its name, so a test sees whose it got.
    fn lend(roster: &mut Roster<String>, tenants: &[TenantSample]) -> Vec<String> {
        let mut values = roster.take(tenants);
        for (v, t) in values.iter_mut().zip(tenants) {
            if v.is_empty() {
                *v = t.spec.name.clone();
            }
        }
        roster.put_back(values.clone());
        values
    }

    #[test]
    fn a_roster_keeps_each_tenants_memory_however_the_list_changes() {
        let t = |n: &str| tenant(n, None, writes(1.0), Caps::NONE);
        let mut roster = Roster::default();
        let first = vec![t("a"), t("b"), t("c")];
        assert_eq!(lend(&mut roster, &first), names_of(&first));
        let generation = roster.generation();
        // The same specs again: nothing matched up, nothing derived rebuilt.
        assert_eq!(lend(&mut roster, &first), names_of(&first));
        assert_eq!(roster.generation(), generation);
        // Reordered, one gone, one new: each keeps its own, the new starts afresh.
        let second = vec![first[2].clone(), t("d"), first[0].clone()];
        let mut values = roster.take(&second);
        assert_eq!(values, ["c", "", "a"]);
        values[1] = "d".into();
        roster.put_back(values);
        assert!(roster.generation() > generation);
        // A gone tenant is forgotten: back later, it starts afresh.
        let third = vec![first[1].clone(), second[1].clone()];
        assert_eq!(roster.take(&third), ["", "d"]);
    }

    #[test]
    fn a_roster_sees_a_spec_changed_under_the_same_name() {
        let mut roster: Roster<u32> = Roster::default();
        let before = vec![tenant("a", None, writes(1.0), Caps::NONE)];
        let mut values = roster.take(&before);
        values[0] = 7;
        roster.put_back(values);
        let generation = roster.generation();
        let after = vec![tenant("a", Some(100.0), writes(1.0), Caps::NONE)];
        assert_eq!(roster.take(&after), [7], "the memory stays with the name");
        assert!(
            roster.generation() > generation,
            "what the specs give is rebuilt"
        );
    }
}
