//! The checked configuration the service runs on: every value in range,
//! every name resolved, paths absolute. Made only by [`super::check`].

use iofloor_core::units::Rate;
use iofloor_core::{CostModel, GroupSpec, PolicyKind, PolicyParams, TenantClass};
use iofloor_host::DevId;
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where the API listens and who may change things. Its `Debug` leaves the
/// token out, so no log of a config can show it.
#[derive(Clone, PartialEq)]
pub struct ApiConfig {
    /// TCP address; `None` when switched off (`listen = "off"`).
    pub listen: Option<std::net::SocketAddr>,
    pub unix_socket: Option<PathBuf>,
    /// Bearer token for changes over TCP; without one, changes are accepted
    /// only over the unix socket.
    pub token: Option<String>,
}

impl std::fmt::Debug for ApiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiConfig")
            .field("listen", &self.listen)
            .field("unix_socket", &self.unix_socket)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Cluster mode (`[cluster]`): this daemon is one agent of a cluster whose
/// hosts share a device, coordinated through etcd (docs/cluster.md).
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    pub name: String,
    /// This host's name in the cluster; unique among running agents.
    pub host: String,
    /// Index into `devices` of the shared device.
    pub device: usize,
    /// The shared device's cluster-wide name (each host reaches it through
    /// its own block device).
    pub shared_device: String,
    pub lease_ttl: Duration,
    /// An allocation older than this is never applied.
    pub stale_after: Duration,
    /// How long the allocator reserves the last load of a host that stopped
    /// reporting with its caps in force (`None`: until it reports again).
    pub orphan_timeout: Option<Duration>,
    pub etcd: iofloor_cluster::EtcdOptions,
}

/// How a device's cost model is obtained.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    Inline(CostModel),
    File(PathBuf),
    /// Run `iofloor calibrate` on start (writes to the device: scratch devices only).
    Calibrate,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeviceConfig {
    pub name: String,
    /// The block device node, when given by path (checked again each interval).
    pub path: Option<PathBuf>,
    pub id: DevId,
    pub model: ModelSource,
}

/// Where a tenant lives.
#[derive(Debug, Clone, PartialEq)]
pub enum TenantSource {
    /// A cgroup path relative to the cgroup root; may be a glob.
    Cgroup(String),
    /// A QEMU monitor socket (may be a glob) and the drive to control.
    Qmp { socket: String, drive: String },
    /// A libvirt domain (name, glob of names, or UUID) and its disk
    /// targets (`vda`, or a glob; `*`: all of them).
    Libvirt { domain: String, disk: String },
    /// Kubernetes pods' containers under the `kubepods` cgroup (relative to
    /// the cgroup root, or `auto`: whichever cgroup driver made one), a
    /// group per pod (crate::kubernetes).
    Kubernetes { kubepods: String },
    /// Containers found through a runtime's API (crate::containers): by
    /// name (a glob), by labels (each value a glob), or both; of one
    /// `[[runtime]]` (its index) or any. `labelled`: the runtime's own
    /// entry for its containers that declare a promise in labels.
    Container {
        runtime: Option<usize>,
        name: Option<String>,
        labels: std::collections::BTreeMap<String, String>,
        labelled: bool,
    },
}

/// A container runtime's API socket (`[[runtime]]`).
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeConfig {
    pub name: String,
    pub socket: PathBuf,
    /// Its containers' `io.iofloor.*` labels are promises iofloor keeps.
    pub trust_labels: bool,
    /// Index into `devices` of the device labelled containers use.
    pub device: Option<usize>,
    /// How long one question to the runtime may take.
    pub timeout: Duration,
}

/// Who holds a tenant entry's floor, ceiling and weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Share {
    /// Each VM (libvirt domain): its disks share them as one group.
    Vm,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TenantConfig {
    pub name: String,
    pub source: TenantSource,
    /// Index into `Config::devices`.
    pub device: usize,
    pub class: TenantClass,
    pub floor: Option<Rate>,
    pub ceiling: Option<Rate>,
    pub weight: f64,
    pub latency_sensitive: bool,
    /// The group its tenants are in (every match of a glob).
    pub group: Option<Arc<GroupSpec>>,
    /// That group's own cgroup (`[[group]] cgroup`), relative to the
    /// cgroup root: on cgroup v2 its members' caps go to its `io.max`,
    /// added up, where they live under it.
    pub group_cgroup: Option<PathBuf>,
    /// `share = "vm"`: the floor, ceiling and weight are each VM's, shared
    /// by its disks (a group per VM, in `group` if given).
    pub share: Option<Share>,
}

impl TenantConfig {
    /// The key its source is written under.
    pub(super) fn source_key(&self) -> &'static str {
        match self.source {
            TenantSource::Cgroup(_) => "cgroup",
            TenantSource::Qmp { .. } => "qmp",
            TenantSource::Libvirt { .. } => "libvirt",
            TenantSource::Kubernetes { .. } => "kubernetes",
            TenantSource::Container { name: Some(_), .. } => "container",
            TenantSource::Container { .. } => "labels",
        }
    }
}

impl TenantSource {
    pub fn pattern(&self) -> &str {
        match self {
            TenantSource::Cgroup(p) => p,
            TenantSource::Qmp { socket, .. } => socket,
            TenantSource::Libvirt { domain, .. } => domain,
            TenantSource::Kubernetes { kubepods } => kubepods,
            TenantSource::Container { name, .. } => name.as_deref().unwrap_or("*"),
        }
    }

    /// Whether the pattern matches many paths (each becomes a tenant).
    pub fn is_glob(&self) -> bool {
        let glob = |p: &str| p.contains(['*', '?', '[']);
        match self {
            TenantSource::Libvirt { domain, disk } => glob(domain) || glob(disk),
            TenantSource::Kubernetes { .. } => true,
            TenantSource::Container {
                name,
                labels,
                labelled,
                ..
            } => *labelled || !labels.is_empty() || name.as_deref().is_none_or(glob),
            _ => glob(self.pattern()),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub file: PathBuf,
    pub interval: Duration,
    /// How often the devices are looked at between intervals, for an
    /// overload to decide on at once (None: never; always None with a cluster).
    pub watch_interval: Option<Duration>,
    pub state_file: PathBuf,
    /// `None`: detected (v2 with io at /sys/fs/cgroup, else v1 blkio).
    pub cgroup_root: Option<PathBuf>,
    pub policy: PolicyKind,
    pub params: PolicyParams,
    pub api: ApiConfig,
    pub devices: Vec<DeviceConfig>,
    pub tenants: Vec<TenantConfig>,
    /// The `[[group]]`s in file order (tenants hold theirs).
    pub groups: Vec<Arc<GroupSpec>>,
    /// The libvirt connection URI (`[libvirt] uri`).
    pub libvirt_uri: String,
    /// Container runtimes asked for their containers (`[[runtime]]`).
    pub runtimes: Vec<RuntimeConfig>,
    pub cluster: Option<ClusterConfig>,
}
