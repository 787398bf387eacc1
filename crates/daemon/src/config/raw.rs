//! The configuration file as written: serde's form of each table, with
//! the spans of the tables the checks need for their errors. Nothing here
//! is checked beyond syntax, types and units; [`super::check`] turns it
//! into [`super::checked`]'s types.

use iofloor_core::policy::{FloorParams, TopThrottleParams};
use iofloor_core::units::quantity::{DurationQ, RateQ};
use iofloor_core::{CostParams, TenantClass};
use serde::Deserialize;
use std::path::PathBuf;
use toml::Spanned;

use super::checked::Share;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    pub(super) interval: Option<DurationQ>,
    pub(super) watch_interval: Option<DurationQ>,
    pub(super) state_file: Option<PathBuf>,
    pub(super) cgroup_root: Option<PathBuf>,
    pub(super) policy: Option<Spanned<PolicySection>>,
    pub(super) api: Option<Spanned<ApiSection>>,
    pub(super) cluster: Option<Spanned<ClusterSection>>,
    pub(super) libvirt: Option<Spanned<LibvirtSection>>,
    #[serde(default, rename = "runtime")]
    pub(super) runtimes: Vec<Spanned<RuntimeEntry>>,
    #[serde(default, rename = "device")]
    pub(super) devices: Vec<Spanned<DeviceEntry>>,
    #[serde(default, rename = "tenant")]
    pub(super) tenants: Vec<Spanned<TenantEntry>>,
    #[serde(default, rename = "group")]
    pub(super) groups: Vec<Spanned<GroupEntry>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GroupEntry {
    pub(super) name: String,
    pub(super) floor: Option<RateQ>,
    pub(super) ceiling: Option<RateQ>,
    pub(super) weight: Option<f64>,
    /// The group this one is in.
    pub(super) group: Option<String>,
    /// The cgroup its members live under: on cgroup v2, where their caps go, added up.
    pub(super) cgroup: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicySection {
    #[serde(default = "default_kind")]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) floor: FloorParams,
    #[serde(default, rename = "top-throttle")]
    pub(super) top_throttle: TopThrottleParams,
}

fn default_kind() -> String {
    "floor".into()
}

impl Default for PolicySection {
    fn default() -> Self {
        PolicySection {
            kind: default_kind(),
            floor: FloorParams::default(),
            top_throttle: TopThrottleParams::default(),
        }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct ApiSection {
    pub(super) listen: Option<String>,
    pub(super) unix_socket: Option<PathBuf>,
    pub(super) token: Option<String>,
    pub(super) token_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ClusterSection {
    pub(super) endpoints: Vec<String>,
    pub(super) name: Option<String>,
    pub(super) host: Option<String>,
    pub(super) device: Option<String>,
    pub(super) shared_device: Option<String>,
    pub(super) lease_ttl: Option<DurationQ>,
    pub(super) stale_after: Option<DurationQ>,
    pub(super) orphan_timeout: Option<DurationQ>,
    pub(super) request_timeout: Option<DurationQ>,
    pub(super) user: Option<String>,
    pub(super) password: Option<String>,
    pub(super) password_file: Option<PathBuf>,
    pub(super) ca_file: Option<PathBuf>,
    pub(super) cert_file: Option<PathBuf>,
    pub(super) key_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct LibvirtSection {
    pub(super) uri: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RuntimeEntry {
    pub(super) name: String,
    pub(super) socket: PathBuf,
    #[serde(default)]
    pub(super) trust_labels: bool,
    pub(super) device: Option<String>,
    pub(super) timeout: Option<DurationQ>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeviceEntry {
    pub(super) name: Option<String>,
    pub(super) path: Option<PathBuf>,
    pub(super) id: Option<String>,
    pub(super) model_file: Option<PathBuf>,
    pub(super) model: Option<CostParams>,
    #[serde(default)]
    pub(super) calibrate: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TenantEntry {
    pub(super) name: String,
    pub(super) cgroup: Option<String>,
    pub(super) qmp: Option<String>,
    pub(super) drive: Option<String>,
    pub(super) libvirt: Option<String>,
    pub(super) disk: Option<String>,
    pub(super) share: Option<Share>,
    pub(super) kubernetes: Option<String>,
    pub(super) container: Option<String>,
    pub(super) labels: Option<std::collections::BTreeMap<String, String>>,
    pub(super) runtime: Option<String>,
    pub(super) device: Option<String>,
    pub(super) class: Option<TenantClass>,
    pub(super) floor: Option<RateQ>,
    pub(super) ceiling: Option<RateQ>,
    pub(super) weight: Option<f64>,
    #[serde(default)]
    pub(super) latency_sensitive: bool,
    /// The `[[group]]` its tenants are in.
    pub(super) group: Option<String>,
}
