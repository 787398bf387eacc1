//! The daemon's configuration file (TOML, documented in docs/config.md).
//!
//! Every error names the file, the line and the key: syntax and type errors
//! come from the TOML parser with their span; checks that need more than one
//! value (a ceiling below its floor, an unknown device) use the span of the
//! table they are about. Unknown keys are errors, never ignored.

use iofloor_core::policy::{FloorParams, TopThrottleParams};
use iofloor_core::units::quantity::{DurationQ, RateQ};
use iofloor_core::units::Rate;
use iofloor_core::{
    CostModel, CostParams, GroupSpec, PolicyKind, PolicyParams, TenantClass, ValidationError,
};
use iofloor_host::DevId;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use toml::Spanned;

/// A configuration that could not be read or makes no sense, with where.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{file}{}: {message}", .line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ConfigError {
    pub file: String,
    pub line: Option<usize>,
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    interval: Option<DurationQ>,
    watch_interval: Option<DurationQ>,
    state_file: Option<PathBuf>,
    cgroup_root: Option<PathBuf>,
    policy: Option<Spanned<PolicySection>>,
    api: Option<Spanned<ApiSection>>,
    cluster: Option<Spanned<ClusterSection>>,
    libvirt: Option<Spanned<LibvirtSection>>,
    #[serde(default, rename = "runtime")]
    runtimes: Vec<Spanned<RuntimeEntry>>,
    #[serde(default, rename = "device")]
    devices: Vec<Spanned<DeviceEntry>>,
    #[serde(default, rename = "tenant")]
    tenants: Vec<Spanned<TenantEntry>>,
    #[serde(default, rename = "group")]
    groups: Vec<Spanned<GroupEntry>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupEntry {
    name: String,
    floor: Option<RateQ>,
    ceiling: Option<RateQ>,
    weight: Option<f64>,
    /// The group this one is in.
    group: Option<String>,
    /// The cgroup its members live under: on cgroup v2, where their caps go, added up.
    cgroup: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicySection {
    #[serde(default = "default_kind")]
    kind: String,
    #[serde(default)]
    floor: FloorParams,
    #[serde(default, rename = "top-throttle")]
    top_throttle: TopThrottleParams,
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
struct ApiSection {
    listen: Option<String>,
    unix_socket: Option<PathBuf>,
    token: Option<String>,
    token_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterSection {
    endpoints: Vec<String>,
    name: Option<String>,
    host: Option<String>,
    device: Option<String>,
    shared_device: Option<String>,
    lease_ttl: Option<DurationQ>,
    stale_after: Option<DurationQ>,
    orphan_timeout: Option<DurationQ>,
    request_timeout: Option<DurationQ>,
    user: Option<String>,
    password: Option<String>,
    password_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

/// The cluster section's times, checked against each other and the interval.
struct ClusterTiming {
    lease_ttl: Duration,
    stale_after: Duration,
    orphan_timeout: Option<Duration>,
    request_timeout: Duration,
}

impl ClusterSection {
    fn timing(
        &self,
        interval: Duration,
        bad: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<ClusterTiming, ConfigError> {
        let lease_ttl = self
            .lease_ttl
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(3));
        // etcd's default election timeout is 1 s; a shorter lease would
        // expire on an ordinary leader change.
        if lease_ttl < Duration::from_secs(2) || lease_ttl.subsec_nanos() != 0 {
            return Err(bad(
                "lease_ttl",
                format!("must be whole seconds, at least 2s, got {lease_ttl:?}"),
            ));
        }
        let stale_after = self.stale_after.map(|d| d.0).unwrap_or(interval * 3);
        if stale_after < interval {
            return Err(bad(
                "stale_after",
                format!("must be at least the interval ({interval:?}), got {stale_after:?}"),
            ));
        }
        let orphan_timeout = self.orphan_timeout.map(|d| d.0);
        if let Some(timeout) = orphan_timeout.filter(|t| *t < lease_ttl) {
            return Err(bad(
                "orphan_timeout",
                format!(
                    "must be at least lease_ttl ({lease_ttl:?}): a host is quiet only once its lease ends, got {timeout:?}"
                ),
            ));
        }
        let request_timeout = self
            .request_timeout
            .map(|d| d.0)
            .unwrap_or(interval.min(Duration::from_secs(1)));
        if request_timeout < Duration::from_millis(50) {
            return Err(bad(
                "request_timeout",
                format!("must be at least 50ms, got {request_timeout:?}"),
            ));
        }
        Ok(ClusterTiming {
            lease_ttl,
            stale_after,
            orphan_timeout,
            request_timeout,
        })
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct LibvirtSection {
    uri: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuntimeEntry {
    name: String,
    socket: PathBuf,
    #[serde(default)]
    trust_labels: bool,
    device: Option<String>,
    timeout: Option<DurationQ>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceEntry {
    name: Option<String>,
    path: Option<PathBuf>,
    id: Option<String>,
    model_file: Option<PathBuf>,
    model: Option<CostParams>,
    #[serde(default)]
    calibrate: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    name: String,
    cgroup: Option<String>,
    qmp: Option<String>,
    drive: Option<String>,
    libvirt: Option<String>,
    disk: Option<String>,
    share: Option<Share>,
    kubernetes: Option<String>,
    container: Option<String>,
    labels: Option<std::collections::BTreeMap<String, String>>,
    runtime: Option<String>,
    device: Option<String>,
    class: Option<TenantClass>,
    floor: Option<RateQ>,
    ceiling: Option<RateQ>,
    weight: Option<f64>,
    #[serde(default)]
    latency_sensitive: bool,
    /// The `[[group]]` its tenants are in.
    group: Option<String>,
}

/// A token or password file: a regular file of at most 64 KiB. A config
/// naming `/dev/zero`, a pipe or a huge file is refused instead of read
/// without end.
fn read_secret(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    const MAX: u64 = 64 * 1024;
    let file = std::fs::File::open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut text = String::new();
    file.take(MAX + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX {
        return Err(std::io::Error::other("larger than 64 KiB: not a secret"));
    }
    Ok(text)
}

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
    fn source_key(&self) -> &'static str {
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

pub const DEFAULT_STATE_FILE: &str = "/run/iofloor/state.json";
/// Where Linux mounts cgroup hierarchies.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";
/// The hierarchies below [`CGROUP_MOUNT`] that may hold the I/O controller
/// when it is not at the mount itself: the hybrid layout's v2, v1 `blkio`.
pub const IO_HIERARCHIES: [&str; 2] = ["unified", "blkio"];
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9180";

/// Line (1-based) of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|&b| b == b'\n')
        .count()
        + 1
}

/// The key path serde_path_to_error reports, without the private keys
/// through which toml hands over a `Spanned` value.
fn key_path(path: &serde_path_to_error::Path) -> String {
    path.iter()
        .filter(|seg| !matches!(seg, serde_path_to_error::Segment::Map { key } if key.starts_with("$__")))
        .fold(String::new(), |mut out, seg| {
            match seg {
                serde_path_to_error::Segment::Seq { index } => out.push_str(&format!("[{index}]")),
                other => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(&other.to_string());
                }
            }
            out
        })
}

/// Checks of a file already parsed: each knows the file's text (for lines)
/// and where relative paths are anchored.
struct Checker<'t> {
    text: &'t str,
    shown: String,
    base: PathBuf,
    /// Where cgroup hierarchies are mounted: the usual place and the
    /// configured `cgroup_root`. A tenant's `cgroup` that starts there is a
    /// filesystem path, not a cgroup path.
    mounts: Vec<PathBuf>,
}

impl Checker<'_> {
    /// An error about `key` in the table whose span is `span`.
    fn error(&self, span: Option<&std::ops::Range<usize>>, e: ValidationError) -> ConfigError {
        ConfigError {
            file: self.shown.clone(),
            line: span.map(|s| line_of(self.text, s.start)),
            message: e.to_string(),
        }
    }

    fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base.join(p)
        }
    }

    /// A `cgroup` is a path inside the hierarchy (`/` is its root, as in
    /// `/proc/PID/cgroup`). One that starts where hierarchies are mounted
    /// would be looked for under the root again and never found, leaving
    /// the tenant unmanaged without a word; it is refused with the path to
    /// give instead.
    fn not_a_mount_path(&self, cgroup: &str) -> Result<(), ValidationError> {
        let path = Path::new(cgroup);
        let Some(rest) = self.mounts.iter().find_map(|m| path.strip_prefix(m).ok()) else {
            return Ok(());
        };
        // The hierarchy's own directory (`blkio`, `unified`) is part of the
        // root, not of the tenant's path.
        let rest = IO_HIERARCHIES
            .iter()
            .find_map(|h| rest.strip_prefix(h).ok())
            .unwrap_or(rest);
        Err(ValidationError::new(
            "cgroup",
            format!(
                "`{cgroup}` is a path in the filesystem; give the cgroup's path under the \
                 cgroup root (`cgroup_root`, detected when not set), e.g. `{}`",
                rest.display()
            ),
        ))
    }

    /// An error for a top-level key, at the first line that sets it.
    fn top_level_error(&self, key: &str, message: String) -> ConfigError {
        let line = self
            .text
            .lines()
            .position(|l| {
                l.trim_start()
                    .strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with('='))
            })
            .map(|i| i + 1);
        ConfigError {
            file: self.shown.clone(),
            line,
            message: ValidationError::new(key, message).to_string(),
        }
    }

    fn interval(&self, interval: Option<DurationQ>) -> Result<Duration, ConfigError> {
        let interval = interval.map(|d| d.0).unwrap_or(Duration::from_secs(1));
        if interval < Duration::from_millis(100) || interval > Duration::from_secs(60) {
            return Err(self.top_level_error(
                "interval",
                format!("must be between 100ms and 60s, got {interval:?}"),
            ));
        }
        Ok(interval)
    }

    fn watch_interval(
        &self,
        given: Option<DurationQ>,
        interval: Duration,
        cluster: bool,
    ) -> Result<Option<Duration>, ConfigError> {
        iofloor_core::control::watch_interval(interval, given.map(|d| d.0), cluster)
            .map_err(|e| self.top_level_error("watch_interval", e.to_string()))
    }

    fn policy(
        &self,
        section: Option<Spanned<PolicySection>>,
    ) -> Result<(PolicyKind, PolicyParams), ConfigError> {
        let (span, section) = match section {
            Some(p) => (Some(p.span()), p.into_inner()),
            None => (None, PolicySection::default()),
        };
        let policy: PolicyKind =
            section
                .kind
                .parse()
                .map_err(|e: iofloor_core::policy::UnknownPolicy| {
                    self.error(
                        span.as_ref(),
                        ValidationError::new("policy.kind", e.to_string()),
                    )
                })?;
        let params = PolicyParams {
            floor: section.floor,
            top_throttle: section.top_throttle,
        };
        params
            .validate()
            .map_err(|e| self.error(span.as_ref(), e))?;
        Ok((policy, params))
    }

    fn api(&self, section: Option<Spanned<ApiSection>>) -> Result<ApiConfig, ConfigError> {
        let (span, section) = match section {
            Some(a) => (Some(a.span()), a.into_inner()),
            None => (None, ApiSection::default()),
        };
        let bad = |key: &str, message: String| {
            self.error(
                span.as_ref(),
                ValidationError::new(key, message).under("api"),
            )
        };
        let listen = match section.listen.as_deref().unwrap_or(DEFAULT_LISTEN) {
            "off" => None,
            addr => Some(addr.parse().map_err(|e| {
                bad(
                    "listen",
                    format!("`{addr}` is not an address such as {DEFAULT_LISTEN} ({e})"),
                )
            })?),
        };
        let token = match (section.token, section.token_file) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "token",
                    "give `api.token` or `api.token_file`, not both".into(),
                ))
            }
            (Some(t), None) => Some(t),
            (None, Some(f)) => {
                let f = self.resolve(&f);
                let t = read_secret(&f)
                    .map_err(|e| bad("token_file", format!("{}: {e}", f.display())))?;
                Some(t.trim().to_string())
            }
            (None, None) => None,
        };
        if token.as_deref() == Some("") {
            return Err(bad("token", "must not be empty".into()));
        }
        Ok(ApiConfig {
            listen,
            unix_socket: section.unix_socket.map(|p| self.resolve(&p)),
            token,
        })
    }

    fn cluster(
        &self,
        section: Option<Spanned<ClusterSection>>,
        devices: &[DeviceConfig],
        interval: Duration,
    ) -> Result<Option<ClusterConfig>, ConfigError> {
        let Some(section) = section else {
            return Ok(None);
        };
        let span = section.span();
        let c = section.into_inner();
        let bad = |key: &str, message: String| {
            self.error(
                Some(&span),
                ValidationError::new(key, message).under("cluster"),
            )
        };
        if c.endpoints.is_empty() {
            return Err(bad(
                "endpoints",
                "give at least one etcd endpoint, such as \"http://10.0.0.1:2379\"".into(),
            ));
        }
        if let Some(e) = c
            .endpoints
            .iter()
            .find(|e| !(e.starts_with("http://") || e.starts_with("https://")))
        {
            return Err(bad(
                "endpoints",
                format!("`{e}` is not a URL such as http://10.0.0.1:2379"),
            ));
        }
        let key_part = |key: &str, v: &str| -> Result<(), ConfigError> {
            if v.is_empty() || v.contains('/') || v.chars().any(char::is_whitespace) {
                return Err(bad(
                    key,
                    format!("`{v}` must be a non-empty name without `/` or spaces"),
                ));
            }
            Ok(())
        };
        let name = c.name.clone().unwrap_or_else(|| "iofloor".into());
        key_part("name", &name)?;
        let host = match &c.host {
            Some(h) => h.clone(),
            None => machine_hostname().map_err(|e| {
                bad(
                    "host",
                    format!("not given and the hostname is unreadable: {e}"),
                )
            })?,
        };
        key_part("host", &host)?;
        let device = match &c.device {
            Some(n) => devices
                .iter()
                .position(|d| &d.name == n)
                .ok_or_else(|| bad("device", format!("no [[device]] named `{n}`")))?,
            None if devices.len() == 1 => 0,
            None if devices.is_empty() => {
                return Err(bad("device", "no [[device]] is configured to share".into()))
            }
            None => {
                return Err(bad(
                    "device",
                    "name the shared [[device]] (there is more than one)".into(),
                ))
            }
        };
        let shared_device = c
            .shared_device
            .clone()
            .unwrap_or_else(|| devices[device].name.clone());
        key_part("shared_device", &shared_device)?;
        let timing = c.timing(interval, &bad)?;
        Ok(Some(ClusterConfig {
            name,
            host,
            device,
            shared_device,
            lease_ttl: timing.lease_ttl,
            stale_after: timing.stale_after,
            orphan_timeout: timing.orphan_timeout,
            etcd: self.etcd_options(c, timing.request_timeout, &bad)?,
        }))
    }

    /// How the cluster section says to reach etcd (endpoints checked):
    /// credentials and TLS files (which must exist).
    fn etcd_options(
        &self,
        c: ClusterSection,
        request_timeout: Duration,
        bad: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<iofloor_cluster::EtcdOptions, ConfigError> {
        let password = match (c.password, c.password_file) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "password",
                    "give `password` or `password_file`, not both".into(),
                ))
            }
            (Some(p), None) => Some(p),
            (None, Some(f)) => {
                let f = self.resolve(&f);
                let secret = read_secret(&f)
                    .map_err(|e| bad("password_file", format!("{}: {e}", f.display())))?;
                Some(secret.trim().to_string())
            }
            (None, None) => None,
        };
        let user = match (c.user, password) {
            (Some(u), Some(p)) => Some((u, p)),
            (None, None) => None,
            _ => return Err(bad("user", "`user` and a password go together".into())),
        };
        if c.cert_file.is_some() != c.key_file.is_some() {
            return Err(bad(
                "cert_file",
                "`cert_file` and `key_file` go together (mutual TLS)".into(),
            ));
        }
        for (key, file) in [
            ("ca_file", &c.ca_file),
            ("cert_file", &c.cert_file),
            ("key_file", &c.key_file),
        ] {
            if let Some(f) = file {
                let f = self.resolve(f);
                std::fs::metadata(&f).map_err(|e| bad(key, format!("{}: {e}", f.display())))?;
            }
        }
        Ok(iofloor_cluster::EtcdOptions {
            endpoints: c.endpoints,
            user,
            ca_file: c.ca_file.map(|p| self.resolve(&p)),
            cert_file: c.cert_file.map(|p| self.resolve(&p)),
            key_file: c.key_file.map(|p| self.resolve(&p)),
            request_timeout,
        })
    }

    fn device(&self, d: DeviceEntry) -> Result<DeviceConfig, ValidationError> {
        let (id, path) = match (&d.path, &d.id) {
            (Some(p), None) => {
                let id = DevId::of_block_device(p)
                    .map_err(|e| ValidationError::new("path", e.to_string()))?;
                (id, Some(p.clone()))
            }
            (None, Some(text)) => {
                let id: DevId = text.parse().map_err(|e: iofloor_host::HostError| {
                    ValidationError::new("id", e.to_string())
                })?;
                (id, None)
            }
            _ => {
                return Err(ValidationError::new(
                    "path",
                    "give exactly one of `path` and `id` (major:minor)",
                ))
            }
        };
        let model = match (d.model, d.model_file, d.calibrate) {
            (Some(p), None, false) => ModelSource::Inline(
                CostModel::new(p).map_err(|e| ValidationError::new("model", e.to_string()))?,
            ),
            (None, Some(f), false) => ModelSource::File(self.resolve(&f)),
            (None, None, true) => ModelSource::Calibrate,
            _ => {
                return Err(ValidationError::new(
                    "model",
                    "give exactly one of `[device.model]`, `model_file` and `calibrate = true`",
                ))
            }
        };
        let name = d.name.unwrap_or_else(|| match &path {
            Some(p) => p.display().to_string(),
            None => id.to_string(),
        });
        Ok(DeviceConfig {
            name,
            path,
            id,
            model,
        })
    }

    fn devices(
        &self,
        entries: Vec<Spanned<DeviceEntry>>,
    ) -> Result<Vec<DeviceConfig>, ConfigError> {
        // No device is a valid config: the package ships one, and the
        // service then controls nothing until a device is added (`iofloor
        // run --check` and the service's start say so).
        let mut devices: Vec<DeviceConfig> = Vec::new();
        for (i, entry) in entries.into_iter().enumerate() {
            let span = entry.span();
            let here = format!("device[{i}]");
            let d = self
                .device(entry.into_inner())
                .map_err(|e| self.error(Some(&span), e.under(&here)))?;
            if devices.iter().any(|o| o.name == d.name || o.id == d.id) {
                let e = ValidationError::new(
                    "name",
                    format!("device `{}` ({}) is listed twice", d.name, d.id),
                );
                return Err(self.error(Some(&span), e.under(&here)));
            }
            devices.push(d);
        }
        Ok(devices)
    }

    /// The `[[runtime]]`s: a name, its API socket, and for one whose labels
    /// are trusted the device its labelled containers use.
    fn runtimes(
        &self,
        entries: Vec<Spanned<RuntimeEntry>>,
        devices: &[DeviceConfig],
    ) -> Result<Vec<RuntimeConfig>, ConfigError> {
        let mut runtimes: Vec<RuntimeConfig> = Vec::new();
        for (i, entry) in entries.into_iter().enumerate() {
            let span = entry.span();
            let r = entry.into_inner();
            let bad =
                |e: ValidationError| self.error(Some(&span), e.under(&format!("runtime[{i}]")));
            if r.name.trim().is_empty()
                || r.name.contains(['/', '"', '\\'])
                || r.name.chars().any(char::is_control)
            {
                return Err(bad(ValidationError::new(
                    "name",
                    "must be non-empty, without `/`, quotes or control characters",
                )));
            }
            if runtimes.iter().any(|o| o.name == r.name) {
                return Err(bad(ValidationError::new("name", "used twice")));
            }
            let device = if r.trust_labels {
                Some(
                    device_named(
                        r.device.as_deref(),
                        devices,
                        "runtime's labelled containers",
                    )
                    .map_err(bad)?,
                )
            } else if r.device.is_some() {
                return Err(bad(ValidationError::new(
                    "device",
                    "is where labelled containers' promises apply: it goes with `trust_labels = true`",
                )));
            } else {
                None
            };
            let timeout = r.timeout.map(|d| d.0).unwrap_or(Duration::from_secs(2));
            if timeout < Duration::from_millis(10) || timeout > Duration::from_secs(30) {
                return Err(bad(ValidationError::new(
                    "timeout",
                    format!("must be between 10ms and 30s, got {timeout:?}"),
                )));
            }
            runtimes.push(RuntimeConfig {
                name: r.name,
                socket: self.resolve(&r.socket),
                trust_labels: r.trust_labels,
                device,
                timeout,
            });
        }
        Ok(runtimes)
    }

    fn tenant(
        &self,
        mut t: TenantEntry,
        devices: &[DeviceConfig],
        runtimes: &[RuntimeConfig],
    ) -> Result<TenantConfig, ValidationError> {
        if t.name.trim().is_empty()
            || t.name.contains(['/', '"', '\\'])
            || t.name.chars().any(char::is_control)
        {
            return Err(ValidationError::new(
                "name",
                "must be non-empty, without `/`, quotes or control characters",
            ));
        }
        let source = self.source(&mut t, runtimes)?;
        let class = t.class.unwrap_or(match source {
            TenantSource::Cgroup(_)
            | TenantSource::Kubernetes { .. }
            | TenantSource::Container { .. } => TenantClass::Container,
            TenantSource::Qmp { .. } | TenantSource::Libvirt { .. } => TenantClass::Vm,
        });
        let device = device_named(t.device.as_deref(), devices, "tenant")?;
        let weight = t.weight.unwrap_or(iofloor_core::model::DEFAULT_WEIGHT);
        let (floor, ceiling) = (t.floor.map(|f| f.0), t.ceiling.map(|c| c.0));
        iofloor_core::model::check_promise(floor, ceiling, Some(weight))?;
        Ok(TenantConfig {
            name: t.name,
            source,
            device,
            class,
            floor,
            ceiling,
            weight,
            latency_sensitive: t.latency_sensitive,
            group: None,
            group_cgroup: None,
            share: t.share,
        })
    }

    /// Where a tenant entry's I/O is found: one cgroup, QEMU drive, libvirt
    /// domain, the kubelet's pods or a runtime's containers (taken out of `t`).
    fn source(
        &self,
        t: &mut TenantEntry,
        runtimes: &[RuntimeConfig],
    ) -> Result<TenantSource, ValidationError> {
        if t.container.is_some() || t.labels.is_some() {
            return container_source(t, runtimes);
        }
        if t.runtime.is_some() {
            return Err(ValidationError::new(
                "runtime",
                "goes with `container` or `labels` (a runtime's containers)",
            ));
        }
        if t.libvirt.is_none() && t.disk.is_some() {
            return Err(ValidationError::new(
                "disk",
                "goes with `libvirt` (a domain's disk)",
            ));
        }
        if t.share.is_some() && t.libvirt.is_none() {
            return Err(ValidationError::new(
                "share",
                "`share = \"vm\"` goes with `libvirt` (a VM's disks share its floor)",
            ));
        }
        let source = match (
            t.cgroup.take(),
            t.qmp.take(),
            t.drive.take(),
            t.libvirt.take(),
            t.kubernetes.take(),
        ) {
            (None, None, None, None, Some(kubepods)) => {
                if kubepods.trim().is_empty() || kubepods.split('/').any(|p| p == "..") {
                    return Err(ValidationError::new(
                        "kubernetes",
                        "must be `auto` or the kubepods cgroup (`kubepods`, `kubepods.slice`), without `..`",
                    ));
                }
                TenantSource::Kubernetes { kubepods }
            }
            (None, None, None, Some(domain), None) => {
                if domain.trim().is_empty() {
                    return Err(ValidationError::new(
                        "libvirt",
                        "must name a domain, a glob or a UUID",
                    ));
                }
                let disk = t.disk.take().unwrap_or_else(|| "*".into());
                if disk.is_empty() || disk.contains('/') {
                    return Err(ValidationError::new(
                        "disk",
                        format!("`{disk}` is not a disk target such as `vda` (or a glob)"),
                    ));
                }
                TenantSource::Libvirt { domain, disk }
            }
            (Some(c), None, None, None, None) => {
                self.not_a_mount_path(&c)?;
                let c = c.trim_start_matches('/').to_string();
                if c.split('/').any(|part| part == "..") {
                    return Err(ValidationError::new("cgroup", "`..` is not allowed"));
                }
                TenantSource::Cgroup(c)
            }
            (None, Some(q), Some(drive), None, None) => TenantSource::Qmp {
                socket: self.resolve(Path::new(&q)).display().to_string(),
                drive,
            },
            (None, Some(_), None, None, None) => {
                return Err(ValidationError::new(
                    "drive",
                    "`qmp` needs `drive` (the drive's id or qdev path)",
                ))
            }
            _ => {
                return Err(ValidationError::new(
                    "cgroup",
                    "give one of `cgroup`, `qmp` with `drive`, `libvirt`, `kubernetes`, `container` or `labels`",
                ))
            }
        };
        Ok(source)
    }

    fn tenants(
        &self,
        entries: Vec<Spanned<TenantEntry>>,
        devices: &[DeviceConfig],
        runtimes: &[RuntimeConfig],
    ) -> Result<Vec<TenantConfig>, ConfigError> {
        let mut tenants: Vec<TenantConfig> = Vec::new();
        for (i, entry) in entries.into_iter().enumerate() {
            let span = entry.span();
            let t = entry.into_inner();
            // The name helps find the entry; the index is the key path.
            let here = format!("tenant[{i}]");
            let named = t.name.clone();
            let located = |e: ValidationError| {
                let mut err = self.error(Some(&span), e.under(&here));
                err.message = format!("{} (tenant `{named}`)", err.message);
                err
            };
            if tenants.iter().any(|o| o.name == t.name) {
                return Err(located(ValidationError::new("name", "used twice")));
            }
            let tenant = self.tenant(t, devices, runtimes).map_err(located)?;
            // One cgroup, drive or disk is one tenant, in one group: two
            // entries naming it would give it two promises.
            if let Some(j) = tenants
                .iter()
                .position(|o| o.source == tenant.source && o.device == tenant.device)
            {
                return Err(located(ValidationError::new(
                    tenant.source_key(),
                    format!(
                        "`{}` on this device is `tenant[{j}]`'s too: a tenant is named once (and is in one group)",
                        tenant.source.pattern()
                    ),
                )));
            }
            tenants.push(tenant);
        }
        Ok(tenants)
    }

    /// The `[[group]]`s, checked as scenarios check them
    /// (iofloor_core::hierarchy), and each tenant entry given the group it
    /// names. `named` holds each tenant entry's `group` and span.
    fn groups(
        &self,
        entries: Vec<Spanned<GroupEntry>>,
        named: &[(Option<String>, std::ops::Range<usize>)],
        tenants: &mut [TenantConfig],
    ) -> Result<Vec<Arc<GroupSpec>>, ConfigError> {
        use iofloor_core::hierarchy::{build_groups, check_member_floors, GroupDef};
        let spans: Vec<std::ops::Range<usize>> = entries.iter().map(|e| e.span()).collect();
        let mut cgroups = Vec::with_capacity(entries.len());
        let defs: Vec<GroupDef> = entries
            .into_iter()
            .map(|e| {
                let g = e.into_inner();
                cgroups.push(g.cgroup);
                GroupDef {
                    name: g.name,
                    floor: g.floor.map(|f| f.0),
                    ceiling: g.ceiling.map(|c| c.0),
                    weight: g.weight,
                    parent: g.group,
                }
            })
            .collect();
        let at = |(i, e): (usize, ValidationError)| {
            self.error(spans.get(i), e.under(&format!("group[{i}]")))
        };
        let cgroups = cgroups
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                c.map(|c| self.group_cgroup(&c))
                    .transpose()
                    .map_err(|e| at((i, e)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let groups = build_groups(&defs).map_err(at)?;
        if let Some(i) = defs
            .iter()
            .position(|g| tenants.iter().any(|t| t.name == g.name))
        {
            return Err(at((
                i,
                ValidationError::new("name", format!("`{}` names a tenant too", defs[i].name)),
            )));
        }
        let mut members = Vec::new();
        for (ti, (name, span)) in named.iter().enumerate() {
            let Some(name) = name else { continue };
            let Some(g) = groups.iter().position(|g| g.name == *name) else {
                return Err(self.error(
                    Some(span),
                    ValidationError::new("group", format!("`{name}` is not a `[[group]]`"))
                        .under(&format!("tenant[{ti}]")),
                ));
            };
            tenants[ti].group = Some(groups[g].clone());
            tenants[ti].group_cgroup = cgroups[g].clone();
            members.push((g, tenants[ti].floor));
        }
        check_member_floors(&groups, members).map_err(at)?;
        if let Some(e) = one_limit_refused(&groups, &cgroups, tenants) {
            return Err(at(e));
        }
        Ok(groups)
    }

    /// A `[[group]]`'s `cgroup`: one cgroup's path under the root, as a
    /// tenant's (no glob: a group has one cgroup).
    fn group_cgroup(&self, cgroup: &str) -> Result<PathBuf, ValidationError> {
        self.not_a_mount_path(cgroup)?;
        let c = cgroup.trim_start_matches('/');
        if c.is_empty() || c.split('/').any(|part| part == "..") || c.contains(['*', '?', '[']) {
            return Err(ValidationError::new(
                "cgroup",
                format!("`{cgroup}` must name one cgroup under the root, without `..` or a glob"),
            ));
        }
        Ok(PathBuf::from(c))
    }
}

/// Why a group with a `cgroup` cannot hold its members' caps as one limit
/// there, if it cannot: one limit holds what the members may use together,
/// so no member may have a floor or ceiling of its own, nor be a group.
fn one_limit_refused(
    groups: &[Arc<GroupSpec>],
    cgroups: &[Option<PathBuf>],
    tenants: &[TenantConfig],
) -> Option<(usize, ValidationError)> {
    let refused = |g: &GroupSpec, why: String| {
        ValidationError::new(
            "cgroup",
            format!(
                "`{}`'s members share one limit on its cgroup, so {why}; without `cgroup` \
                 each member is capped on its own",
                g.name
            ),
        )
    };
    for (i, g) in groups.iter().enumerate() {
        if cgroups[i].is_none() {
            continue;
        }
        let member = tenants.iter().find(|t| {
            t.group.as_ref().is_some_and(|m| m.name == g.name)
                && (t.floor.is_some() || t.ceiling.is_some())
        });
        if let Some(t) = member {
            return Some((
                i,
                refused(
                    g,
                    format!(
                        "member `{}` may not have a floor or ceiling of its own",
                        t.name
                    ),
                ),
            ));
        }
        if let Some(inner) = groups
            .iter()
            .find(|o| o.parent.as_ref().is_some_and(|p| p.name == g.name))
        {
            return Some((
                i,
                refused(g, format!("group `{}` may not be inside it", inner.name)),
            ));
        }
    }
    None
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        // Absolute, so a reload finds the file whatever the working directory.
        let path = &std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: shown.clone(),
            line: None,
            message: e.to_string(),
        })?;
        Config::parse(&text, path)
    }

    /// The file as written: syntax, types and units. An error names the key
    /// by its path, as serde walked it, and the line where the parser was.
    fn read(text: &str, shown: &str) -> Result<File, ConfigError> {
        let error = |e: toml::de::Error, key: Option<String>| ConfigError {
            file: shown.to_string(),
            line: e.span().map(|s| line_of(text, s.start)),
            message: match key.filter(|k| !k.is_empty()) {
                Some(key) => format!("`{key}`: {}", e.message().trim()),
                None => e.message().trim().to_string(),
            },
        };
        let de = toml::Deserializer::parse(text).map_err(|e| error(e, None))?;
        serde_path_to_error::deserialize(de).map_err(|e| {
            let key = key_path(e.path());
            error(e.into_inner(), Some(key))
        })
    }

    /// Parses config text; `path` names it in errors and anchors relative paths.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let shown = path.display().to_string();
        let file = Config::read(text, &shown)?;
        let mut check = Checker {
            text,
            shown,
            base: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
            mounts: vec![PathBuf::from(CGROUP_MOUNT)],
        };
        let cgroup_root = file.cgroup_root.as_deref().map(|p| check.resolve(p));
        check.mounts.extend(cgroup_root.clone());
        let interval = check.interval(file.interval)?;
        let (policy, params) = check.policy(file.policy)?;
        let api = check.api(file.api)?;
        let devices = check.devices(file.devices)?;
        let named: Vec<(Option<String>, std::ops::Range<usize>)> = file
            .tenants
            .iter()
            .map(|t| (t.get_ref().group.clone(), t.span()))
            .collect();
        let runtime_spans: Vec<std::ops::Range<usize>> =
            file.runtimes.iter().map(|r| r.span()).collect();
        let runtimes = check.runtimes(file.runtimes, &devices)?;
        let mut tenants = check.tenants(file.tenants, &devices, &runtimes)?;
        let groups = check.groups(file.groups, &named, &mut tenants)?;
        labelled_tenants(&runtimes, &mut tenants).map_err(|(i, e)| {
            let e = ValidationError::new("name", e).under(&format!("runtime[{i}]"));
            check.error(runtime_spans.get(i), e)
        })?;
        let cluster = check.cluster(file.cluster, &devices, interval)?;
        let watch_interval =
            check.watch_interval(file.watch_interval, interval, cluster.is_some())?;
        let libvirt_uri = match file.libvirt.map(|l| (l.span(), l.into_inner())) {
            Some((span, LibvirtSection { uri: Some(uri) })) => {
                if uri.trim().is_empty() || uri.contains('\0') {
                    return Err(check.error(
                        Some(&span),
                        ValidationError::new(
                            "libvirt.uri",
                            "must be a libvirt URI such as qemu:///system",
                        ),
                    ));
                }
                uri
            }
            _ => iofloor_host::backends::libvirt::DEFAULT_URI.to_string(),
        };
        Ok(Config {
            file: path.to_path_buf(),
            interval,
            watch_interval,
            state_file: file
                .state_file
                .map(|p| check.resolve(&p))
                .unwrap_or_else(|| DEFAULT_STATE_FILE.into()),
            cgroup_root,
            policy,
            params,
            api,
            devices,
            tenants,
            groups,
            libvirt_uri,
            runtimes,
            cluster,
        })
    }
}

/// The index of the device a tenant (or a runtime's labelled containers,
/// `what`) names, or of the only one.
fn device_named(
    name: Option<&str>,
    devices: &[DeviceConfig],
    what: &str,
) -> Result<usize, ValidationError> {
    match name {
        Some(name) => devices
            .iter()
            .position(|d| d.name == name)
            .ok_or_else(|| ValidationError::new("device", format!("no [[device]] named `{name}`"))),
        None if devices.len() == 1 => Ok(0),
        None if devices.is_empty() => Err(ValidationError::new(
            "device",
            format!("no [[device]] is configured: add the one this {what} uses"),
        )),
        None => Err(ValidationError::new(
            "device",
            "is needed when there are several devices",
        )),
    }
}

/// A tenant entry's containers: `container` (a name or glob), `labels`
/// (each value a glob), of the `[[runtime]]` `runtime` names or of any.
fn container_source(
    t: &mut TenantEntry,
    runtimes: &[RuntimeConfig],
) -> Result<TenantSource, ValidationError> {
    let others = [
        ("cgroup", t.cgroup.is_some()),
        ("qmp", t.qmp.is_some()),
        ("libvirt", t.libvirt.is_some()),
        ("kubernetes", t.kubernetes.is_some()),
    ];
    if let Some((key, _)) = others.iter().find(|(_, given)| *given) {
        return Err(ValidationError::new(
            *key,
            "a tenant is found one way: `container`/`labels` or this, not both",
        ));
    }
    if runtimes.is_empty() {
        return Err(ValidationError::new(
            "container",
            "containers are found through a runtime: add a [[runtime]] with its socket",
        ));
    }
    let runtime = match t.runtime.take() {
        Some(name) => Some(
            runtimes
                .iter()
                .position(|r| r.name == name)
                .ok_or_else(|| {
                    ValidationError::new("runtime", format!("no [[runtime]] named `{name}`"))
                })?,
        ),
        None => None,
    };
    let name = t.container.take();
    if let Some(n) = &name {
        if n.trim().is_empty() || glob::Pattern::new(n).is_err() {
            return Err(ValidationError::new(
                "container",
                format!("`{n}` is not a container name or glob"),
            ));
        }
    }
    let labels = t.labels.take().unwrap_or_default();
    for (key, value) in &labels {
        if key.trim().is_empty() || glob::Pattern::new(value).is_err() {
            return Err(ValidationError::new(
                "labels",
                format!("`{key} = \"{value}\"` is not a label and a value (or glob)"),
            ));
        }
    }
    if name.is_none() && labels.is_empty() {
        return Err(ValidationError::new(
            "labels",
            "must name at least one label (or give `container`)",
        ));
    }
    Ok(TenantSource::Container {
        runtime,
        name,
        labels,
        labelled: false,
    })
}

/// For each runtime whose labels are trusted, the entry of its containers
/// that declare a promise in `io.iofloor.*` labels and that no tenant entry
/// names, appended after the file's: tenants named `RUNTIME/CONTAINER`.
/// `Err` names the runtime whose name a tenant entry already has.
fn labelled_tenants(
    runtimes: &[RuntimeConfig],
    tenants: &mut Vec<TenantConfig>,
) -> Result<(), (usize, String)> {
    for (i, r) in runtimes.iter().enumerate() {
        let Some(device) = r.device.filter(|_| r.trust_labels) else {
            continue;
        };
        if tenants.iter().any(|t| t.name == r.name) {
            return Err((
                i,
                format!(
                    "`{}` is a tenant's name too: its labelled containers are named `{}/CONTAINER`",
                    r.name, r.name
                ),
            ));
        }
        tenants.push(TenantConfig {
            name: r.name.clone(),
            source: TenantSource::Container {
                runtime: Some(i),
                name: None,
                labels: Default::default(),
                labelled: true,
            },
            device,
            class: TenantClass::Container,
            floor: None,
            ceiling: None,
            weight: iofloor_core::model::DEFAULT_WEIGHT,
            latency_sensitive: false,
            group: None,
            group_cgroup: None,
            share: None,
        });
    }
    Ok(())
}

/// The machine's hostname, as the kernel has it.
pub fn machine_hostname() -> std::io::Result<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
interval = "500ms"
state_file = "state.json"

[policy]
kind = "floor"
[policy.floor]
queue_knee = 4

[api]
listen = "127.0.0.1:0"
token = "s3cret"

[[device]]
name = "data"
id = "7:0"
[device.model]
rbps = 200e6
rseqiops = 2000
rrandiops = 2000
wbps = 200e6
wseqiops = 2000
wrandiops = 2000

[[tenant]]
name = "pods"
cgroup = "/kubepods*/pod*"
floor = "100 IOPS"

[[tenant]]
name = "vm1"
qmp = "/run/vm1.qmp"
drive = "drive0"
floor = "10MiB/s"
ceiling = "20 MiB/s"
weight = 200
"#;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/iofloor/test.toml"))
    }

    #[test]
    fn a_full_config_parses() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.interval, Duration::from_millis(500));
        assert_eq!(c.state_file, PathBuf::from("/etc/iofloor/state.json"));
        assert_eq!(c.params.floor.queue_knee, Some(4.0));
        assert_eq!(c.api.token.as_deref(), Some("s3cret"));
        assert_eq!(c.devices[0].id, DevId { major: 7, minor: 0 });
        assert_eq!(
            c.tenants[0].source,
            TenantSource::Cgroup("kubepods*/pod*".into())
        );
        assert!(c.tenants[0].source.is_glob());
        assert_eq!(c.tenants[0].class, TenantClass::Container);
        assert_eq!(c.tenants[1].class, TenantClass::Vm);
        assert_eq!(
            c.tenants[1].floor,
            Some(Rate::BytesPerSec(10.0 * 1048576.0))
        );
        assert_eq!(c.tenants[1].weight, 200.0);
        // A config in a log never shows the token.
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("<redacted>"),
            "{shown}"
        );
    }

    #[test]
    fn the_shipped_example_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/iofloor.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        // Its device does not exist here: checked by path at load time.
        let text = text
            .replace("path = \"/dev/nvme0n1\"", "id = \"259:0\"")
            .replace("token_file", "# token_file");
        let c = Config::parse(&text, &path).unwrap();
        // Its four entries and the runtime's own for labelled containers.
        assert_eq!(c.tenants.len(), 5);
        assert_eq!(c.tenants[2].floor, Some(Rate::Cost(0.1)));
        assert!(c.tenants[0].source.is_glob());
        assert_eq!(c.tenants[4].name, "podman");
    }

    /// The package's config (packaging/deb) names no device: valid, and
    /// the service controls nothing until one is added.
    #[test]
    fn the_packaged_config_parses_without_a_device() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/deb/iofloor.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        // Its token file is made at install.
        let text = text.replace("token_file", "# token_file");
        let c = Config::parse(&text, &path).unwrap();
        assert!(c.devices.is_empty() && c.tenants.is_empty());
        assert_eq!(c.api.listen, Some("127.0.0.1:9180".parse().unwrap()));
    }

    /// The DaemonSet's ConfigMap holds a config this daemon takes.
    #[test]
    fn the_kubernetes_manifest_carries_a_valid_config() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kubernetes/daemonset.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let mut found = None;
        for doc in serde_norway::Deserializer::from_str(&text) {
            let v: serde_norway::Value = serde::Deserialize::deserialize(doc).unwrap();
            if v["kind"].as_str() == Some("ConfigMap") {
                found = v["data"]["iofloor.toml"].as_str().map(str::to_string);
            }
        }
        let toml = found.expect("a ConfigMap with iofloor.toml");
        let c = Config::parse(&toml, Path::new("/etc/iofloor/iofloor.toml")).unwrap();
        assert_eq!(
            c.tenants[0].source,
            TenantSource::Kubernetes {
                kubepods: "auto".into()
            }
        );
        assert_eq!(
            c.cgroup_root.as_deref(),
            Some(Path::new("/host/sys/fs/cgroup"))
        );
    }

    fn error_of(text: &str) -> ConfigError {
        parse(text).unwrap_err()
    }

    #[test]
    fn runtimes_and_container_tenants_parse_and_refuse_bad_entries_at_their_line() {
        let device = "[[device]]\nname = \"data\"\nid = \"7:0\"\nmodel = { rbps = 1e9, rseqiops = 1e3, rrandiops = 1e3, wbps = 1e9, wseqiops = 1e3, wrandiops = 1e3 }\n";
        let runtime = "[[runtime]]\nname = \"podman\"\nsocket = \"/run/podman/podman.sock\"\ntrust_labels = true\n";
        let with = |rest: &str| format!("{device}{runtime}\n{rest}");
        let c = parse(&with(
            "[[tenant]]\nname = \"db\"\ncontainer = \"db-*\"\nlabels = { tier = \"gold\" }\nruntime = \"podman\"\nfloor = \"500iops\"\n",
        ))
        .unwrap();
        assert_eq!(c.runtimes[0].device, Some(0));
        assert_eq!(c.runtimes[0].timeout, Duration::from_secs(2));
        assert!(matches!(
            &c.tenants[0].source,
            TenantSource::Container { runtime: Some(0), name: Some(n), labels, labelled: false }
                if n == "db-*" && labels["tier"] == "gold"
        ));
        assert_eq!(c.tenants[0].class, TenantClass::Container);
        // The runtime's own entry for its labelled containers, after the file's.
        assert_eq!(c.tenants[1].name, "podman");
        assert!(matches!(
            c.tenants[1].source,
            TenantSource::Container { labelled: true, .. }
        ));
        for (rest, line, expected) in [
            (
                "[[tenant]]\nname = \"a\"\nruntime = \"podman\"\ncgroup = \"a\"\n",
                10,
                "`tenant[0].runtime` goes with `container` or `labels`",
            ),
            (
                "[[tenant]]\nname = \"a\"\ncontainer = \"a\"\nruntime = \"docker\"\n",
                10,
                "no [[runtime]] named `docker`",
            ),
            (
                "[[tenant]]\nname = \"a\"\ncontainer = \"a\"\ncgroup = \"a\"\n",
                10,
                "`tenant[0].cgroup` a tenant is found one way",
            ),
            (
                "[[tenant]]\nname = \"a\"\ncontainer = \"[\"\n",
                10,
                "is not a container name or glob",
            ),
            (
                "[[tenant]]\nname = \"a\"\nlabels = {}\n",
                10,
                "must name at least one label",
            ),
            (
                "[[tenant]]\nname = \"podman\"\ncgroup = \"a\"\n",
                5,
                "its labelled containers are named `podman/CONTAINER`",
            ),
            (
                "[[runtime]]\nname = \"podman\"\nsocket = \"/x\"\n",
                10,
                "`runtime[1].name` used twice",
            ),
            (
                "[[runtime]]\nname = \"d\"\nsocket = \"/x\"\ndevice = \"data\"\n",
                10,
                "goes with `trust_labels = true`",
            ),
            (
                "[[runtime]]\nname = \"d\"\nsocket = \"/x\"\ntimeout = \"1h\"\n",
                10,
                "between 10ms and 30s",
            ),
        ] {
            let e = error_of(&with(rest));
            assert!(e.message.contains(expected), "{rest}: {e}");
            assert_eq!(e.line, Some(line), "{rest}: {e}");
        }
        let e = error_of(&format!(
            "{device}[[tenant]]\nname = \"a\"\ncontainer = \"a\"\n"
        ));
        assert!(e.message.contains("add a [[runtime]]"), "{e}");
    }

    #[test]
    fn libvirt_tenants_parse_and_refuse_bad_entries() {
        let device = "[[device]]\nname = \"data\"\nid = \"7:0\"\nmodel = { rbps = 1e9, rseqiops = 1e3, rrandiops = 1e3, wbps = 1e9, wseqiops = 1e3, wrandiops = 1e3 }\n";
        let with = |rest: &str| format!("{device}\n{rest}");
        let c = parse(&with(
            "[libvirt]\nuri = \"qemu+ssh://host/system\"\n\n[[tenant]]\nname = \"web\"\nlibvirt = \"web-*\"\nshare = \"vm\"\nfloor = \"500 IOPS\"\n\n[[tenant]]\nname = \"db\"\nlibvirt = \"45d7044c-161a-47c0-adb9-42576888cba3\"\ndisk = \"vdb\"\n",
        ))
        .unwrap();
        assert_eq!(c.libvirt_uri, "qemu+ssh://host/system");
        assert_eq!(
            c.tenants[0].source,
            TenantSource::Libvirt {
                domain: "web-*".into(),
                disk: "*".into()
            }
        );
        assert_eq!(c.tenants[0].share, Some(Share::Vm));
        assert_eq!(c.tenants[0].class, TenantClass::Vm);
        assert!(c.tenants[0].source.is_glob() && !c.tenants[1].source.is_glob());
        let plain = parse(&with("[[tenant]]\nname = \"a\"\ncgroup = \"a\"\n")).unwrap();
        assert_eq!(plain.libvirt_uri, "qemu:///system");

        let e = error_of(&with(
            "[[tenant]]\nname = \"a\"\ncgroup = \"a\"\nshare = \"vm\"\n",
        ));
        assert!(
            e.message.contains("`tenant[0].share`") && e.message.contains("goes with `libvirt`"),
            "{e}"
        );
        let e = error_of(&with(
            "[[tenant]]\nname = \"a\"\ncgroup = \"a\"\ndisk = \"vda\"\n",
        ));
        assert!(
            e.message.contains("`tenant[0].disk` goes with `libvirt`"),
            "{e}"
        );
        let e = error_of(&with(
            "[[tenant]]\nname = \"a\"\nlibvirt = \"vm\"\ncgroup = \"a\"\n",
        ));
        assert!(e.message.contains("give one of `cgroup`"), "{e}");
        let e = error_of(&with(
            "[[tenant]]\nname = \"a\"\nlibvirt = \"vm\"\ndisk = \"../vda\"\n",
        ));
        assert!(e.message.contains("`tenant[0].disk`"), "{e}");
        let e = error_of(&with(
            "[[tenant]]\nname = \"a\"\nlibvirt = \"vm\"\nshare = \"pod\"\n",
        ));
        assert!(e.message.contains("unknown variant `pod`"), "{e}");
        assert_eq!(e.line, Some(9), "{e}");
        let e = error_of(&with("[[tenant]]\nname = \"a\"\ncgroup = \"x/y\"\n\n[[tenant]]\nname = \"b\"\ncgroup = \"/x/y\"\n"));
        assert!(
            e.message
                .contains("`tenant[1].cgroup` `x/y` on this device is `tenant[0]`'s too"),
            "{e}"
        );
        let e = error_of(&with("[libvirt]\nuri = \"\"\n"));
        assert!(e.message.contains("`libvirt.uri`"), "{e}");
    }

    #[test]
    fn a_cgroup_given_as_a_filesystem_path_is_refused_with_the_path_to_give() {
        let device = "[[device]]\nname = \"data\"\nid = \"7:0\"\nmodel = { rbps = 1e9, rseqiops = 1e3, rrandiops = 1e3, wbps = 1e9, wseqiops = 1e3, wrandiops = 1e3 }\n";
        let tenant = |root: &str, cgroup: &str| {
            format!("{root}{device}\n[[tenant]]\nname = \"a\"\ncgroup = \"{cgroup}\"\n")
        };
        let e = error_of(&tenant("", "/sys/fs/cgroup/blkio/team/db"));
        assert!(e.message.contains("`tenant[0].cgroup`"), "{e}");
        assert!(e.message.contains("e.g. `team/db`"), "{e}");
        assert_eq!(e.line, Some(6), "the tenant's table: {e}");
        let e = error_of(&tenant(
            "cgroup_root = \"/host/cg\"\n",
            "/host/cg/unified/team/db",
        ));
        assert!(e.message.contains("e.g. `team/db`"), "{e}");
        // A path inside the hierarchy, with or without its leading `/`.
        for cgroup in ["/team/db", "team/db", "/kubepods*/pod*"] {
            let c = parse(&tenant("", cgroup)).unwrap();
            assert_eq!(c.tenants.len(), 1, "{cgroup}");
        }
    }

    #[test]
    fn groups_link_tenants_and_refuse_bad_trees_at_their_line() {
        let device = "[[device]]\nname = \"data\"\nid = \"7:0\"\nmodel = { rbps = 1e9, rseqiops = 1e3, rrandiops = 1e3, wbps = 1e9, wseqiops = 1e3, wrandiops = 1e3 }\n";
        let tenants = "[[tenant]]\nname = \"db\"\ncgroup = \"a/db\"\nfloor = \"300 IOPS\"\ngroup = \"team\"\n\n[[tenant]]\nname = \"web\"\ncgroup = \"a/web*\"\ngroup = \"team\"\n";
        let with = |groups: &str| format!("{device}\n{tenants}\n{groups}");
        let good = with(
            "[[group]]\nname = \"customer\"\nfloor = \"1000 IOPS\"\n\n[[group]]\nname = \"team\"\nfloor = \"600 IOPS\"\nceiling = \"900 IOPS\"\nweight = 300\ngroup = \"customer\"\n",
        );
        let c = parse(&good).unwrap();
        assert_eq!(c.groups.len(), 2);
        let team = c.tenants[0].group.as_ref().unwrap();
        assert_eq!(team.name, "team");
        assert_eq!(team.parent.as_ref().unwrap().name, "customer");
        assert_eq!(team.ceiling, Some(Rate::Iops(900.0)));
        assert!(Arc::ptr_eq(team, c.tenants[1].group.as_ref().unwrap()));

        // A cycle, at the line of the group that starts it.
        let e = error_of(&with(
            "[[group]]\nname = \"team\"\ngroup = \"customer\"\n\n[[group]]\nname = \"customer\"\ngroup = \"team\"\n",
        ));
        assert!(
            e.message
                .contains("`group[0].group` makes a cycle: team in customer in team"),
            "{e}"
        );
        assert_eq!(e.line, Some(17), "{e}");
        // A tenant naming no group, at the tenant's line.
        let e = error_of(&with("[[group]]\nname = \"other\"\n"));
        assert_eq!(e.message, "`tenant[0].group` `team` is not a `[[group]]`");
        assert_eq!(e.line, Some(6), "{e}");
        // Members' floors above the group's.
        let e = error_of(&with("[[group]]\nname = \"team\"\nfloor = \"200 IOPS\"\n"));
        assert!(
            e.message.contains(
                "`group[0].floor` 200 IOPS is below what its members' floors add up to (300 IOPS)"
            ),
            "{e}"
        );
        assert_eq!(e.line, Some(17), "{e}");
        // A name used for a group and a tenant.
        let e = error_of(&with(
            "[[group]]\nname = \"team\"\n\n[[group]]\nname = \"db\"\n",
        ));
        assert!(
            e.message
                .contains("`group[1].name` `db` names a tenant too"),
            "{e}"
        );
        // Two groups of one name.
        let e = error_of(&with(
            "[[group]]\nname = \"team\"\n\n[[group]]\nname = \"team\"\n",
        ));
        assert!(
            e.message
                .contains("`group[1].name` `team` names two groups"),
            "{e}"
        );
        assert_eq!(e.line, Some(20), "{e}");
    }

    #[test]
    fn a_group_with_a_cgroup_holds_plain_members_and_refuses_the_rest_at_its_line() {
        let device = "[[device]]\nname = \"data\"\nid = \"7:0\"\nmodel = { rbps = 1e9, rseqiops = 1e3, rrandiops = 1e3, wbps = 1e9, wseqiops = 1e3, wrandiops = 1e3 }\n";
        let tenants =
            "[[tenant]]\nname = \"staff\"\ncgroup = \"customers/acme/*\"\ngroup = \"acme\"\n";
        let with = |group: &str| {
            format!(
                "{device}\n{tenants}\n[[group]]\nname = \"acme\"\nfloor = \"400 IOPS\"\n{group}"
            )
        };
        let c = parse(&with("cgroup = \"/customers/acme\"\n")).unwrap();
        assert_eq!(
            c.tenants[0].group_cgroup.as_deref(),
            Some(Path::new("customers/acme"))
        );
        let c = parse(&with("")).unwrap();
        assert_eq!(c.tenants[0].group_cgroup, None);
        for bad in ["customers/*", "../x", "", "/"] {
            let e = error_of(&with(&format!("cgroup = \"{bad}\"\n")));
            assert!(
                e.message.starts_with("`group[0].cgroup`") && e.message.contains("one cgroup"),
                "{bad}: {e}"
            );
            assert_eq!(e.line, Some(11), "{e}");
        }
        let e = error_of(&with("cgroup = \"/sys/fs/cgroup/customers/acme\"\n"));
        assert!(e.message.contains("e.g. `customers/acme`"), "{e}");
        // One limit for all: no member with a promise of its own.
        let e = error_of(&format!(
            "{device}\n[[tenant]]\nname = \"db\"\ncgroup = \"c/db\"\nfloor = \"100 IOPS\"\ngroup = \"acme\"\n\n[[group]]\nname = \"acme\"\ncgroup = \"c\"\n"
        ));
        assert!(
            e.message.contains("`group[0].cgroup` `acme`'s members share one limit on its cgroup, so member `db` may not have a floor or ceiling of its own"),
            "{e}"
        );
        // Nor a group inside it.
        let e = error_of(&format!(
            "{device}\n{tenants}\n[[group]]\nname = \"acme\"\ncgroup = \"c\"\n\n[[group]]\nname = \"team\"\ngroup = \"acme\"\n"
        ));
        assert!(
            e.message.contains("group `team` may not be inside it"),
            "{e}"
        );
    }

    #[test]
    fn a_cluster_section_parses_with_defaults_and_refuses_bad_values() {
        let device = "[[device]]\nname = \"data\"\nid = \"7:0\"\nmodel = { rbps = 1e9, rseqiops = 1e3, rrandiops = 1e3, wbps = 1e9, wseqiops = 1e3, wrandiops = 1e3 }\n";
        let with = |cluster: &str| format!("interval = \"500ms\"\n{device}\n[cluster]\n{cluster}");
        let parsed = parse(&with(
            "endpoints = [\"http://10.0.0.1:2379\"]\nhost = \"h1\"\n",
        ))
        .unwrap();
        assert_eq!(
            parsed.watch_interval, None,
            "a cluster decides once an interval"
        );
        let e = error_of(&format!(
            "watch_interval = \"100ms\"\n{}",
            with("endpoints = [\"http://10.0.0.1:2379\"]\nhost = \"h1\"\n")
        ));
        assert_eq!(e.line, Some(1), "{e}");
        assert!(e.message.contains("decide together"), "{e}");
        let c = parsed.cluster.unwrap();
        assert_eq!(c.name, "iofloor");
        assert_eq!(c.host, "h1");
        assert_eq!((c.device, c.shared_device.as_str()), (0, "data"));
        assert_eq!(c.lease_ttl, Duration::from_secs(3));
        assert_eq!(c.stale_after, Duration::from_millis(1500), "3 intervals");
        assert_eq!(
            c.orphan_timeout, None,
            "a quiet host is counted until it reports"
        );
        assert_eq!(c.etcd.request_timeout, Duration::from_millis(500));
        for (cluster, needle) in [
            ("endpoints = []", "cluster.endpoints"),
            ("endpoints = [\"10.0.0.1:2379\"]", "cluster.endpoints"),
            (
                "endpoints = [\"http://e:2379\"]\nhost = \"a/b\"",
                "cluster.host",
            ),
            (
                "endpoints = [\"http://e:2379\"]\ndevice = \"nope\"",
                "cluster.device",
            ),
            (
                "endpoints = [\"http://e:2379\"]\nlease_ttl = \"1s\"",
                "cluster.lease_ttl",
            ),
            (
                "endpoints = [\"http://e:2379\"]\nlease_ttl = \"2500ms\"",
                "cluster.lease_ttl",
            ),
            (
                "endpoints = [\"http://e:2379\"]\nstale_after = \"100ms\"",
                "cluster.stale_after",
            ),
            (
                "endpoints = [\"http://e:2379\"]\norphan_timeout = \"1s\"",
                "cluster.orphan_timeout",
            ),
            (
                "endpoints = [\"http://e:2379\"]\nuser = \"u\"",
                "cluster.user",
            ),
            (
                "endpoints = [\"http://e:2379\"]\ncert_file = \"/etc/hostname\"",
                "cluster.cert_file",
            ),
            (
                "endpoints = [\"http://e:2379\"]\nca_file = \"/no/such/ca.pem\"",
                "cluster.ca_file",
            ),
            ("endpoints = [\"http://e:2379\"]\nleader = true", "leader"),
        ] {
            let e = error_of(&with(cluster));
            assert!(e.message.contains(needle), "{cluster}: {e}");
            // The [cluster] table's line, or the offending key's.
            assert!(matches!(e.line, Some(7..=9)), "{cluster}: {e}");
        }
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let e = error_of(&GOOD.replace("floor = \"100 IOPS\"", "floor = \"100 furlongs\""));
        assert_eq!(e.file, "/etc/iofloor/test.toml");
        assert_eq!(e.line, Some(28), "{e}");
        assert!(
            e.message.contains("furlongs") && e.message.contains("`tenant[0].floor`"),
            "{e}"
        );

        let e = error_of(&GOOD.replace("weight = 200", "weight = 200\nwieght = 3"));
        assert!(e.message.contains("wieght"), "unknown keys are errors: {e}");
        assert_eq!(e.line, Some(37), "{e}");

        let e = error_of(&GOOD.replace("ceiling = \"20 MiB/s\"", "ceiling = \"5 MiB/s\""));
        assert!(
            e.message.contains("`tenant[1].ceiling`")
                && e.message.contains("below `floor`")
                && e.message.contains("(tenant `vm1`)"),
            "{e}"
        );
        assert_eq!(e.line, Some(30), "the line of the tenant's table: {e}");

        let e = error_of(&GOOD.replace("kind = \"floor\"", "kind = \"flor\""));
        assert!(
            e.message.contains("policy.kind") && e.message.contains("flor"),
            "{e}"
        );

        let e = error_of(&GOOD.replace("drive = \"drive0\"\n", ""));
        assert!(e.message.contains("needs `drive`"), "{e}");

        let e = error_of(&GOOD.replace("interval = \"500ms\"", "interval = \"5ms\""));
        assert_eq!(e.line, Some(2));

        let watched = |w: &str| {
            GOOD.replace(
                "state_file",
                &format!("watch_interval = \"{w}\"\nstate_file"),
            )
        };
        assert_eq!(
            parse(GOOD).unwrap().watch_interval,
            Some(Duration::from_micros(62_500)),
            "an eighth of the interval unless given"
        );
        assert_eq!(parse(&watched("0s")).unwrap().watch_interval, None);
        assert_eq!(
            parse(&watched("100ms")).unwrap().watch_interval,
            Some(Duration::from_millis(100))
        );
        for bad in ["500ms", "2ms"] {
            let e = error_of(&watched(bad));
            assert_eq!(e.line, Some(3), "{e}");
            assert!(e.message.starts_with("`watch_interval` must be 0s"), "{e}");
        }

        let e = error_of(&GOOD.replace("listen = \"127.0.0.1:0\"", "listen = \"localhost\""));
        assert!(e.message.contains("api.listen"), "{e}");

        let e = error_of(&GOOD.replace("weight = 200", "weight = -1"));
        assert!(e.message.contains("`tenant[1].weight`"), "{e}");

        let e = error_of(&GOOD.replace("rrandiops = 2000", "rrandiops = 0"));
        assert!(e.message.contains("`device[0].model`"), "{e}");

        let e = error_of(&GOOD.replace("cgroup = \"/kubepods*/pod*\"", "cgroup = \"../../etc\""));
        assert!(e.message.contains("`..`"), "{e}");

        // Without a device the file is valid; a tenant then has none to be on.
        assert!(parse("interval = \"1s\"\n").unwrap().devices.is_empty());
        let e = error_of("[[tenant]]\nname = \"db\"\ncgroup = \"db\"\n");
        assert!(
            e.message.contains("tenant[0].device")
                && e.message.contains("no [[device]] is configured"),
            "{e}"
        );
        assert!(e.to_string().starts_with("/etc/iofloor/test.toml:1"), "{e}");
    }
}
