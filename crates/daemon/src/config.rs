//! The daemon's configuration file (TOML, documented in docs/config.md).
//!
//! Every error names the file, the line and the key: syntax and type errors
//! come from the TOML parser with their span; checks that need more than one
//! value (a ceiling below its floor, an unknown device) use the span of the
//! table they are about. Unknown keys are errors, never ignored.

use iofloor_core::policy::{FloorParams, TopThrottleParams};
use iofloor_core::units::quantity::{DurationQ, RateQ};
use iofloor_core::units::Rate;
use iofloor_core::{CostModel, CostParams, PolicyKind, PolicyParams, TenantClass};
use iofloor_host::DevId;
use serde::Deserialize;
use std::path::{Path, PathBuf};
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
    state_file: Option<PathBuf>,
    cgroup_root: Option<PathBuf>,
    policy: Option<Spanned<PolicySection>>,
    api: Option<Spanned<ApiSection>>,
    #[serde(default, rename = "device")]
    devices: Vec<Spanned<DeviceEntry>>,
    #[serde(default, rename = "tenant")]
    tenants: Vec<Spanned<TenantEntry>>,
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
    device: Option<String>,
    class: Option<TenantClass>,
    floor: Option<RateQ>,
    ceiling: Option<RateQ>,
    weight: Option<f64>,
    #[serde(default)]
    latency_sensitive: bool,
}

/// Where the API listens and who may change things.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiConfig {
    /// TCP address; `None` when switched off (`listen = "off"`).
    pub listen: Option<std::net::SocketAddr>,
    pub unix_socket: Option<PathBuf>,
    /// Bearer token for changes over TCP; without one, changes are accepted
    /// only over the unix socket.
    pub token: Option<String>,
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
}

impl TenantSource {
    pub fn pattern(&self) -> &str {
        match self {
            TenantSource::Cgroup(p) => p,
            TenantSource::Qmp { socket, .. } => socket,
        }
    }

    /// Whether the pattern matches many paths (each becomes a tenant).
    pub fn is_glob(&self) -> bool {
        self.pattern().contains(['*', '?', '['])
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub file: PathBuf,
    pub interval: Duration,
    pub state_file: PathBuf,
    /// `None`: detected (v2 with io at /sys/fs/cgroup, else v1 blkio).
    pub cgroup_root: Option<PathBuf>,
    pub policy: PolicyKind,
    pub params: PolicyParams,
    pub api: ApiConfig,
    pub devices: Vec<DeviceConfig>,
    pub tenants: Vec<TenantConfig>,
}

pub const DEFAULT_STATE_FILE: &str = "/run/iofloor/state.json";
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9180";

/// The dotted key set on a line (`tenant.floor`), from the line and the
/// table header above it.
fn key_at(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let here = lines.get(line - 1)?.trim();
    let key = here.split_once('=')?.0.trim().trim_matches('"');
    if key.is_empty() || key.starts_with('[') {
        return None;
    }
    let table = lines[..line - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    Some(match table {
        Some(t) => format!("{t}.{key}"),
        None => key.to_string(),
    })
}

/// Line (1-based) of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|&b| b == b'\n')
        .count()
        + 1
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

    /// Parses config text; `path` names it in errors and anchors relative paths.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let shown = path.display().to_string();
        let err = |line: Option<usize>, message: String| ConfigError {
            file: shown.clone(),
            line,
            message,
        };
        let file: File = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start));
            // The parser's message says what is wrong with a value but not
            // which key held it: name it from the line and its table.
            let message = match line.and_then(|l| key_at(text, l)) {
                Some(key) => format!("`{key}`: {}", e.message().trim()),
                None => e.message().trim().to_string(),
            };
            err(line, message)
        })?;
        let at = |span: std::ops::Range<usize>| Some(line_of(text, span.start));
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |p: &Path| {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            }
        };

        let interval = file.interval.map(|d| d.0).unwrap_or(Duration::from_secs(1));
        if interval < Duration::from_millis(100) || interval > Duration::from_secs(60) {
            let line = text
                .lines()
                .position(|l| l.trim_start().starts_with("interval"))
                .map(|i| i + 1);
            return Err(err(
                line,
                format!("`interval` must be between 100ms and 60s, got {interval:?}"),
            ));
        }

        let (policy_span, policy_section) = match file.policy {
            Some(p) => (p.span(), p.into_inner()),
            None => (0..0, PolicySection::default()),
        };
        let policy: PolicyKind =
            policy_section
                .kind
                .parse()
                .map_err(|e: iofloor_core::policy::UnknownPolicy| {
                    err(at(policy_span.clone()), format!("`policy.kind`: {e}"))
                })?;
        let params = PolicyParams {
            floor: policy_section.floor,
            top_throttle: policy_section.top_throttle,
        };
        params
            .validate()
            .map_err(|m| err(at(policy_span.clone()), m.to_string()))?;

        let (api_span, api_section) = match file.api {
            Some(a) => (a.span(), a.into_inner()),
            None => (0..0, ApiSection::default()),
        };
        let listen = match api_section.listen.as_deref().unwrap_or(DEFAULT_LISTEN) {
            "off" => None,
            addr => Some(addr.parse().map_err(|e| {
                err(
                    at(api_span.clone()),
                    format!(
                        "`api.listen`: `{addr}` is not an address such as {DEFAULT_LISTEN} ({e})"
                    ),
                )
            })?),
        };
        let token = match (api_section.token, api_section.token_file) {
            (Some(_), Some(_)) => {
                return Err(err(
                    at(api_span),
                    "give `api.token` or `api.token_file`, not both".into(),
                ))
            }
            (Some(t), None) => Some(t),
            (None, Some(f)) => {
                let f = resolve(&f);
                let t = std::fs::read_to_string(&f).map_err(|e| {
                    err(
                        at(api_span.clone()),
                        format!("`api.token_file` {}: {e}", f.display()),
                    )
                })?;
                Some(t.trim().to_string())
            }
            (None, None) => None,
        };
        if token.as_deref() == Some("") {
            return Err(err(at(api_span), "`api.token` must not be empty".into()));
        }
        let api = ApiConfig {
            listen,
            unix_socket: api_section.unix_socket.map(|p| resolve(&p)),
            token,
        };

        if file.devices.is_empty() {
            return Err(err(None, "at least one [[device]] is needed".into()));
        }
        let mut devices: Vec<DeviceConfig> = Vec::new();
        for (i, entry) in file.devices.into_iter().enumerate() {
            let line = at(entry.span());
            let d = entry.into_inner();
            let here = format!("device[{i}]");
            let (id, path) = match (&d.path, &d.id) {
                (Some(p), None) => {
                    let id = DevId::of_block_device(p)
                        .map_err(|e| err(line, format!("{here} `path`: {e}")))?;
                    (id, Some(p.clone()))
                }
                (None, Some(text)) => {
                    let id: DevId = text
                        .parse()
                        .map_err(|e| err(line, format!("{here} `id`: {e}")))?;
                    (id, None)
                }
                _ => {
                    return Err(err(
                        line,
                        format!("{here}: give exactly one of `path` and `id` (major:minor)"),
                    ))
                }
            };
            let model = match (d.model, d.model_file, d.calibrate) {
                (Some(p), None, false) => {
                    ModelSource::Inline(CostModel::new(p).map_err(|e| err(line, format!("{here} `model`: {e}")))?)
                }
                (None, Some(f), false) => ModelSource::File(resolve(&f)),
                (None, None, true) => ModelSource::Calibrate,
                _ => {
                    return Err(err(
                        line,
                        format!("{here}: give exactly one of `[device.model]`, `model_file` and `calibrate = true`"),
                    ))
                }
            };
            let name = d.name.unwrap_or_else(|| match &path {
                Some(p) => p.display().to_string(),
                None => id.to_string(),
            });
            if devices.iter().any(|o| o.name == name || o.id == id) {
                return Err(err(
                    line,
                    format!("{here}: device `{name}` ({id}) is listed twice"),
                ));
            }
            devices.push(DeviceConfig {
                name,
                path,
                id,
                model,
            });
        }

        let mut tenants: Vec<TenantConfig> = Vec::new();
        for (i, entry) in file.tenants.into_iter().enumerate() {
            let line = at(entry.span());
            let t = entry.into_inner();
            let here = format!("tenant[{i}] `{}`", t.name);
            if t.name.trim().is_empty()
                || t.name.contains(['/', '"', '\\'])
                || t.name.chars().any(char::is_control)
            {
                return Err(err(line, format!("tenant[{i}] `name`: must be non-empty, without `/`, quotes or control characters")));
            }
            if tenants.iter().any(|o| o.name == t.name) {
                return Err(err(line, format!("{here}: `name` used twice")));
            }
            let source = match (t.cgroup, t.qmp, t.drive) {
                (Some(c), None, None) => {
                    let c = c.trim_start_matches('/').to_string();
                    if c.split('/').any(|part| part == "..") {
                        return Err(err(line, format!("{here} `cgroup`: `..` is not allowed")));
                    }
                    TenantSource::Cgroup(c)
                }
                (None, Some(q), Some(drive)) => TenantSource::Qmp {
                    socket: resolve(Path::new(&q)).display().to_string(),
                    drive,
                },
                (None, Some(_), None) => {
                    return Err(err(
                        line,
                        format!("{here}: `qmp` needs `drive` (the drive's id or qdev path)"),
                    ))
                }
                _ => {
                    return Err(err(
                        line,
                        format!("{here}: give either `cgroup` or `qmp` with `drive`"),
                    ))
                }
            };
            let class = t.class.unwrap_or(match source {
                TenantSource::Cgroup(_) => TenantClass::Container,
                TenantSource::Qmp { .. } => TenantClass::Vm,
            });
            let device = match &t.device {
                Some(name) => devices
                    .iter()
                    .position(|d| &d.name == name)
                    .ok_or_else(|| {
                        err(
                            line,
                            format!("{here} `device`: no [[device]] named `{name}`"),
                        )
                    })?,
                None if devices.len() == 1 => 0,
                None => {
                    return Err(err(
                        line,
                        format!("{here}: `device` is needed when there are several devices"),
                    ))
                }
            };
            let weight = t.weight.unwrap_or(iofloor_core::model::DEFAULT_WEIGHT);
            let (floor, ceiling) = (t.floor.map(|f| f.0), t.ceiling.map(|c| c.0));
            iofloor_core::model::check_promise(floor, ceiling, Some(weight))
                .map_err(|m| err(line, format!("{here}: {m}")))?;
            tenants.push(TenantConfig {
                name: t.name,
                source,
                device,
                class,
                floor,
                ceiling,
                weight,
                latency_sensitive: t.latency_sensitive,
            });
        }

        Ok(Config {
            file: path.to_path_buf(),
            interval,
            state_file: file
                .state_file
                .map(|p| resolve(&p))
                .unwrap_or_else(|| DEFAULT_STATE_FILE.into()),
            cgroup_root: file.cgroup_root.map(|p| resolve(&p)),
            policy,
            params,
            api,
            devices,
            tenants,
        })
    }
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
        assert_eq!(c.tenants.len(), 3);
        assert_eq!(c.tenants[2].floor, Some(Rate::Cost(0.1)));
        assert!(c.tenants[0].source.is_glob());
    }

    fn error_of(text: &str) -> ConfigError {
        parse(text).unwrap_err()
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let e = error_of(&GOOD.replace("floor = \"100 IOPS\"", "floor = \"100 furlongs\""));
        assert_eq!(e.file, "/etc/iofloor/test.toml");
        assert_eq!(e.line, Some(28), "{e}");
        assert!(
            e.message.contains("furlongs") && e.message.contains("`tenant.floor`"),
            "{e}"
        );

        let e = error_of(&GOOD.replace("weight = 200", "weight = 200\nwieght = 3"));
        assert!(e.message.contains("wieght"), "unknown keys are errors: {e}");
        assert_eq!(e.line, Some(37), "{e}");

        let e = error_of(&GOOD.replace("ceiling = \"20 MiB/s\"", "ceiling = \"5 MiB/s\""));
        assert!(
            e.message.contains("tenant[1] `vm1`") && e.message.contains("below `floor`"),
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

        let e = error_of(&GOOD.replace("listen = \"127.0.0.1:0\"", "listen = \"localhost\""));
        assert!(e.message.contains("api.listen"), "{e}");

        let e = error_of(&GOOD.replace("weight = 200", "weight = -1"));
        assert!(e.message.contains("`weight`"), "{e}");

        let e = error_of(&GOOD.replace("rrandiops = 2000", "rrandiops = 0"));
        assert!(e.message.contains("device[0] `model`"), "{e}");

        let e = error_of(&GOOD.replace("cgroup = \"/kubepods*/pod*\"", "cgroup = \"../../etc\""));
        assert!(e.message.contains("`..`"), "{e}");

        let e = error_of("interval = \"1s\"\n");
        assert!(e.line.is_none());
        assert!(e.message.contains("[[device]]"), "{e}");
        assert!(e.to_string().starts_with("/etc/iofloor/test.toml"), "{e}");
    }
}
