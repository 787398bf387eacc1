//! The checks between the file's form ([`super::raw`]) and the checked
//! configuration ([`super::checked`]): the service's own settings here
//! (interval, policy, API, cluster), devices, runtimes, tenants and groups
//! in [`super::check_tenants`]. Each error names the file, the line of the
//! table it is about and the key.

use super::checked::*;
use super::raw::*;
use super::{line_of, machine_hostname, ConfigError, DEFAULT_LISTEN, IO_HIERARCHIES};
use iofloor_core::units::quantity::DurationQ;
use iofloor_core::{PolicyKind, PolicyParams, ValidationError};
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;

/// A token or password file: a regular file of at most 64 KiB. A config
/// naming `/dev/zero`, a pipe or a huge file is refused instead of read
/// without end.
pub(super) fn read_secret(path: &Path) -> std::io::Result<String> {
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

/// Checks of a file already parsed: each knows the file's text (for lines)
/// and where relative paths are anchored.
pub(super) struct Checker<'t> {
    pub(super) text: &'t str,
    pub(super) shown: String,
    pub(super) base: PathBuf,
    /// Where cgroup hierarchies are mounted: the usual place and the
    /// configured `cgroup_root`. A tenant's `cgroup` that starts there is a
    /// filesystem path, not a cgroup path.
    pub(super) mounts: Vec<PathBuf>,
}

impl Checker<'_> {
    /// An error about `key` in the table whose span is `span`.
    pub(super) fn error(
        &self,
        span: Option<&std::ops::Range<usize>>,
        e: ValidationError,
    ) -> ConfigError {
        ConfigError {
            file: self.shown.clone(),
            line: span.map(|s| line_of(self.text, s.start)),
            message: e.to_string(),
        }
    }

    pub(super) fn resolve(&self, p: &Path) -> PathBuf {
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
    pub(super) fn not_a_mount_path(&self, cgroup: &str) -> Result<(), ValidationError> {
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
    pub(super) fn top_level_error(&self, key: &str, message: String) -> ConfigError {
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

    pub(super) fn interval(&self, interval: Option<DurationQ>) -> Result<Duration, ConfigError> {
        let interval = interval.map(|d| d.0).unwrap_or(Duration::from_secs(1));
        if interval < Duration::from_millis(100) || interval > Duration::from_secs(60) {
            return Err(self.top_level_error(
                "interval",
                format!("must be between 100ms and 60s, got {interval:?}"),
            ));
        }
        Ok(interval)
    }

    pub(super) fn watch_interval(
        &self,
        given: Option<DurationQ>,
        interval: Duration,
        cluster: bool,
    ) -> Result<Option<Duration>, ConfigError> {
        iofloor_core::control::watch_interval(interval, given.map(|d| d.0), cluster)
            .map_err(|e| self.top_level_error("watch_interval", e.to_string()))
    }

    pub(super) fn policy(
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

    pub(super) fn api(
        &self,
        section: Option<Spanned<ApiSection>>,
    ) -> Result<ApiConfig, ConfigError> {
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

    pub(super) fn cluster(
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
        check_endpoints(&c.endpoints, &bad)?;
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
        let device = shared_device_index(c.device.as_deref(), devices, &bad)?;
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
    pub(super) fn etcd_options(
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

/// The cluster's etcd endpoints: at least one, each a URL.
fn check_endpoints(
    endpoints: &[String],
    bad: &dyn Fn(&str, String) -> ConfigError,
) -> Result<(), ConfigError> {
    if endpoints.is_empty() {
        return Err(bad(
            "endpoints",
            "give at least one etcd endpoint, such as \"http://10.0.0.1:2379\"".into(),
        ));
    }
    match endpoints
        .iter()
        .find(|e| !(e.starts_with("http://") || e.starts_with("https://")))
    {
        Some(e) => Err(bad(
            "endpoints",
            format!("`{e}` is not a URL such as http://10.0.0.1:2379"),
        )),
        None => Ok(()),
    }
}

/// The index of the `[[device]]` the cluster shares: the one named, or the
/// only one.
fn shared_device_index(
    name: Option<&str>,
    devices: &[DeviceConfig],
    bad: &dyn Fn(&str, String) -> ConfigError,
) -> Result<usize, ConfigError> {
    match name {
        Some(n) => devices
            .iter()
            .position(|d| d.name == n)
            .ok_or_else(|| bad("device", format!("no [[device]] named `{n}`"))),
        None if devices.len() == 1 => Ok(0),
        None if devices.is_empty() => {
            Err(bad("device", "no [[device]] is configured to share".into()))
        }
        None => Err(bad(
            "device",
            "name the shared [[device]] (there is more than one)".into(),
        )),
    }
}
