//! The daemon's configuration file (TOML, documented in docs/config.md).
//!
//! Every error names the file, the line and the key: syntax and type errors
//! come from the TOML parser with their span; checks that need more than one
//! value (a ceiling below its floor, an unknown device) use the span of the
//! table they are about. Unknown keys are errors, never ignored.
//!
//! In three layers: the file's form as serde reads it ([`raw`]), the checked
//! configuration the service runs on ([`checked`]), and the checks between
//! them ([`check`], [`check_tenants`]).

mod check;
mod check_tenants;
mod checked;
mod raw;
#[cfg(test)]
mod tests;

pub use checked::*;

use check::Checker;
use check_tenants::labelled_tenants;
use iofloor_core::ValidationError;
use raw::*;
use std::path::{Path, PathBuf};

/// A configuration that could not be read or makes no sense, with where.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{file}{}: {message}", .line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ConfigError {
    pub file: String,
    pub line: Option<usize>,
    pub message: String,
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

/// The machine's hostname, as the kernel has it.
pub fn machine_hostname() -> std::io::Result<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string())
}
