//! What travels through etcd: each agent's [`HostReport`] (its tenants, their
//! usage and caps, its view of the shared device) and the allocator's
//! [`Allocation`] for each host. JSON with a schema version, so a value from
//! a newer iofloor or plain garbage is refused with a reason, never a panic.

use iofloor_core::{Caps, DeviceSample, Rate, TenantSpec, Usage, ValidationError};
use serde::{Deserialize, Serialize};

/// The schema these types are written in. A reader refuses values of a
/// higher version (they may mean something it does not know) and of 0.
pub const SCHEMA: u32 = 1;

/// One tenant as its host sees it over the last interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantReport {
    pub spec: TenantSpec,
    /// `None` when the host had no trustworthy sample (first interval,
    /// counters reset, read failed).
    pub usage: Option<Usage>,
    /// The caps in force during the interval.
    pub caps: Caps,
}

impl From<&iofloor_core::TenantSample> for TenantReport {
    fn from(t: &iofloor_core::TenantSample) -> TenantReport {
        TenantReport {
            spec: (*t.spec).clone(),
            usage: t.usage,
            caps: t.caps,
        }
    }
}

/// What an agent publishes each interval for one shared device, under a key
/// bound to its lease: when the host dies, the report goes with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostReport {
    pub schema: u32,
    pub host: String,
    /// The shared device's name in the cluster (not the local node: each
    /// host reaches the same storage through its own block device).
    pub device: String,
    /// Increases with every report of this agent process.
    pub seq: u64,
    /// Length of the interval the samples cover, in seconds.
    pub interval_s: f64,
    /// This host's view of the shared device: only its own I/O.
    pub local_device: Option<DeviceSample>,
    pub tenants: Vec<TenantReport>,
}

/// The caps the allocator gives one host's tenants of one shared device.
/// Written under a fence (only the current allocator's write lands) and not
/// bound to a lease: a host keeps reading its last allocation when the
/// allocator dies, and judges by `epoch`, `seq` and its own clock whether it
/// is still fresh.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    pub schema: u32,
    pub host: String,
    pub device: String,
    /// The allocator's term: the create revision of its election key. A
    /// higher epoch is a newer allocator; a lower one is never applied.
    pub epoch: i64,
    /// Increases with each allocation within an epoch.
    pub seq: u64,
    /// The allocator's interval, in seconds.
    pub interval_s: f64,
    /// The shared device's capacity the allocator believes in, in cost
    /// units per second, and what every host's active floors cost: the host's
    /// fallback rule when the allocator goes quiet.
    pub capacity: f64,
    pub floors: f64,
    /// Hosts that reported this interval.
    pub hosts: usize,
    /// Caps per tenant of this host, by tenant name.
    pub caps: Vec<(String, Caps)>,
    /// What this host's tenants used in the report this allocation answers,
    /// in cost units per second. Should the host stop reporting with its
    /// caps still in force (agent killed, host cut off), the allocator
    /// counts it as load it cannot cap (crate::allocate). Absent in
    /// allocations of earlier iofloors: 0.
    #[serde(default)]
    pub load: f64,
    /// Whether the allocator judged the shared device contended this
    /// interval: the verdict the host's service shows with its tenants'
    /// floors. Absent in allocations of earlier iofloors.
    #[serde(default)]
    pub contended: Option<bool>,
}

/// A tenant's floor set for the whole cluster (`iofloor cluster set-floor`):
/// it replaces the floor the host files give every tenant of that name on
/// the shared device. Deleting it gives the host files' floors back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FloorSetting {
    pub schema: u32,
    pub tenant: String,
    /// `None`: no floor, whatever the host files say.
    pub floor: Option<Rate>,
}

/// Why a value read from etcd was not used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    /// Not JSON of this schema at all. serde's error is kept as its text:
    /// it is neither Clone nor comparable, and this error is both.
    #[error("not an iofloor {what} (schema {SCHEMA}): {detail}")]
    Garbage { what: &'static str, detail: String },
    /// Well-formed JSON of this schema with a value no iofloor would write.
    #[error("not an iofloor {what} (schema {SCHEMA}): {source}")]
    Invalid {
        what: &'static str,
        #[source]
        source: Invalid,
    },
    #[error("{what} of schema {found}, newer than this iofloor's {SCHEMA}: upgrade this host")]
    FutureSchema { what: &'static str, found: u32 },
}

/// A value that parses but would be applied as nonsense.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Invalid {
    #[error("interval_s {0} is not an interval")]
    Interval(f64),
    #[error("tenant `{tenant}`: cap {cap} is not a limit")]
    Cap { tenant: String, cap: f64 },
    #[error("{key} {value} is not a share of the device")]
    Share { key: &'static str, value: f64 },
    #[error("tenant `{tenant}`: {source}")]
    Promise {
        tenant: String,
        #[source]
        source: ValidationError,
    },
}

impl Invalid {
    /// Names the tenant whose promise (floor, ceiling, weight) is refused.
    fn promise(tenant: &str) -> impl FnOnce(ValidationError) -> Invalid + '_ {
        move |source| Invalid::Promise {
            tenant: tenant.to_string(),
            source,
        }
    }
}

#[derive(Deserialize)]
struct SchemaOnly {
    schema: u32,
}

fn decode<T: serde::de::DeserializeOwned + Check>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, WireError> {
    // The version first, so a newer writer's value is named as such rather
    // than as garbage because a field changed.
    let version: SchemaOnly = serde_json::from_slice(bytes).map_err(|e| WireError::Garbage {
        what,
        detail: e.to_string(),
    })?;
    if version.schema > SCHEMA {
        return Err(WireError::FutureSchema {
            what,
            found: version.schema,
        });
    }
    if version.schema == 0 {
        return Err(WireError::Garbage {
            what,
            detail: "schema 0".into(),
        });
    }
    let value: T = serde_json::from_slice(bytes).map_err(|e| WireError::Garbage {
        what,
        detail: e.to_string(),
    })?;
    value
        .check()
        .map_err(|source| WireError::Invalid { what, source })?;
    Ok(value)
}

/// What JSON's types cannot say about a value read from etcd: a floor of
/// zero or a negative cap parses, and would be applied as written.
trait Check {
    fn check(&self) -> Result<(), Invalid>;
}

fn check_caps(tenant: &str, caps: &Caps) -> Result<(), Invalid> {
    for v in [
        caps.read_iops,
        caps.write_iops,
        caps.read_bps,
        caps.write_bps,
    ]
    .into_iter()
    .flatten()
    {
        if !(v.is_finite() && v >= 0.0) {
            return Err(Invalid::Cap {
                tenant: tenant.to_string(),
                cap: v,
            });
        }
    }
    Ok(())
}

/// An interval as the daemon's config allows it, in seconds, or 0: an
/// agent's first tick has no interval behind it yet, and its report (and an
/// allocation made only of such reports) says so. The allocator takes the
/// longest interval its reports give.
fn check_interval(interval_s: f64) -> Result<(), Invalid> {
    if !(0.0..=3600.0).contains(&interval_s) {
        return Err(Invalid::Interval(interval_s));
    }
    Ok(())
}

impl Check for HostReport {
    fn check(&self) -> Result<(), Invalid> {
        check_interval(self.interval_s)?;
        for t in &self.tenants {
            t.spec
                .check_promise()
                .map_err(Invalid::promise(&t.spec.name))?;
            check_caps(&t.spec.name, &t.caps)?;
        }
        Ok(())
    }
}

impl Check for FloorSetting {
    fn check(&self) -> Result<(), Invalid> {
        iofloor_core::model::check_promise(self.floor, None, None)
            .map_err(Invalid::promise(&self.tenant))
    }
}

impl Check for Allocation {
    fn check(&self) -> Result<(), Invalid> {
        check_interval(self.interval_s)?;
        for (key, v) in [
            ("capacity", self.capacity),
            ("floors", self.floors),
            ("load", self.load),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(Invalid::Share { key, value: v });
            }
        }
        self.caps
            .iter()
            .try_for_each(|(tenant, caps)| check_caps(tenant, caps))
    }
}

impl HostReport {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a report is plain data")
    }
    pub fn decode(bytes: &[u8]) -> Result<HostReport, WireError> {
        decode("host report", bytes)
    }
}

impl FloorSetting {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a floor setting is plain data")
    }
    pub fn decode(bytes: &[u8]) -> Result<FloorSetting, WireError> {
        decode("floor setting", bytes)
    }
}

impl Allocation {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an allocation is plain data")
    }
    pub fn decode(bytes: &[u8]) -> Result<Allocation, WireError> {
        decode("allocation", bytes)
    }

    pub fn caps_of(&self, tenant: &str) -> Option<Caps> {
        self.caps
            .iter()
            .find(|(name, _)| name == tenant)
            .map(|(_, caps)| *caps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocation() -> Allocation {
        Allocation {
            schema: SCHEMA,
            host: "h1".into(),
            device: "shared".into(),
            epoch: 7,
            seq: 3,
            interval_s: 1.0,
            capacity: 0.9,
            floors: 0.5,
            hosts: 3,
            caps: vec![(
                "t1".into(),
                Caps {
                    read_iops: Some(500.0),
                    ..Caps::NONE
                },
            )],
            load: 0.2,
            contended: None,
        }
    }

    #[test]
    fn values_read_back_as_written() {
        let a = allocation();
        assert_eq!(Allocation::decode(&a.encode()).unwrap(), a);
        assert_eq!(a.caps_of("t1").unwrap().read_iops, Some(500.0));
        assert_eq!(a.caps_of("t2"), None);
    }

    #[test]
    fn garbage_and_future_schemas_are_refused_with_a_reason() {
        let e = Allocation::decode(b"\xff\x00 not json").unwrap_err();
        assert!(matches!(e, WireError::Garbage { .. }), "{e}");
        let e = Allocation::decode(br#"{"schema": 2, "whatever": true}"#).unwrap_err();
        assert_eq!(
            e,
            WireError::FutureSchema {
                what: "allocation",
                found: 2
            }
        );
        assert!(e.to_string().contains("newer"), "{e}");
        let e = HostReport::decode(br#"{"schema": 1, "host": 5}"#).unwrap_err();
        assert!(e.to_string().contains("host report"), "{e}");
        let e = HostReport::decode(br#"{"schema": 0}"#).unwrap_err();
        assert!(matches!(e, WireError::Garbage { .. }), "{e}");
    }

    /// Found by fuzzing: well-formed JSON with a floor of zero was taken as
    /// a cluster floor; a negative cap would have been applied as 1 IOPS.
    #[test]
    fn values_that_parse_but_promise_nothing_sane_are_refused() {
        let floor = br#"{"schema": 1, "tenant": "t1", "floor": {"unit": "iops", "value": 0}}"#;
        let e = FloorSetting::decode(floor).unwrap_err();
        assert!(e.to_string().contains("`t1`: `floor`"), "{e}");
        let mut a = allocation();
        a.caps[0].1.write_bps = Some(-5.0);
        let e = Allocation::decode(&a.encode()).unwrap_err();
        assert!(e.to_string().contains("cap -5"), "{e}");
        assert!(
            matches!(&e, WireError::Invalid { source: Invalid::Cap { tenant, .. }, .. } if tenant == "t1"),
            "{e:?}"
        );
    }

    #[test]
    fn an_allocation_from_before_load_reads_as_no_load_and_a_negative_load_is_refused() {
        let mut json: serde_json::Value = serde_json::from_slice(&allocation().encode()).unwrap();
        json.as_object_mut().unwrap().remove("load");
        let earlier = Allocation::decode(json.to_string().as_bytes()).unwrap();
        assert_eq!(earlier.load, 0.0);
        let mut a = allocation();
        a.load = -0.1;
        let e = Allocation::decode(&a.encode()).unwrap_err();
        assert!(e.to_string().contains("load -0.1"), "{e}");
    }

    /// Found on the test bed: every agent's first report (its first tick
    /// has no interval behind it) was refused with a warning per host.
    #[test]
    fn a_first_tick_has_no_interval_and_is_taken_but_a_negative_one_is_not() {
        let mut a = allocation();
        a.interval_s = 0.0;
        assert_eq!(Allocation::decode(&a.encode()).unwrap(), a);
        for bad in [-1.0, 3601.0] {
            a.interval_s = bad;
            let e = Allocation::decode(&a.encode()).unwrap_err();
            assert!(e.to_string().contains("not an interval"), "{e}");
        }
    }
}
