//! Errors of the host backends, always naming the file or object involved.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file that does not say what it should (a stat file, fio's output,
    /// a state file), with the line where known.
    #[error("{path}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Malformed {
        path: PathBuf,
        line: Option<usize>,
        message: String,
    },
    /// An object that exists but cannot serve (not a block device, a
    /// hierarchy without an I/O controller), named with the reason.
    #[error("{object}: {problem}")]
    NotUsable { object: String, problem: String },
    /// A program iofloor runs is not installed.
    #[error("`{program}` not found; install it (Debian: apt-get install {package})")]
    ToolMissing {
        program: &'static str,
        package: &'static str,
    },
    #[error("{program} {found} is too old: iofloor needs {needed} or newer")]
    ToolTooOld {
        program: &'static str,
        found: String,
        needed: String,
    },
    /// A tenant the backend was never given.
    #[error("tenant `{0}` is not known to this backend")]
    UnknownTenant(String),
    /// A QEMU monitor's answer lacks what was asked for.
    #[error("{socket}: {message}")]
    Qmp { socket: PathBuf, message: String },
    /// A value out of range (a rig's spec, a cgroup weight).
    #[error(transparent)]
    Invalid(#[from] iofloor_core::ValidationError),
    #[error("{what} did not happen within {secs} s")]
    Timeout { what: String, secs: u64 },
    #[error("{what} failed: {message}")]
    Command { what: String, message: String },
    /// The tenant exists but cannot be measured now (a paused VM); retried
    /// each interval.
    #[error("{0}")]
    Unavailable(String),
    /// libvirt refused or failed a call (the message names the URI and what).
    #[error("{0}")]
    Libvirt(String),
}

impl HostError {
    pub fn malformed(path: &Path, line: Option<usize>, message: impl Into<String>) -> HostError {
        HostError::Malformed {
            path: path.to_path_buf(),
            line,
            message: message.into(),
        }
    }

    pub fn not_usable(object: impl std::fmt::Display, problem: impl Into<String>) -> HostError {
        HostError::NotUsable {
            object: object.to_string(),
            problem: problem.into(),
        }
    }

    pub fn io(path: &Path, source: std::io::Error) -> HostError {
        HostError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// True when the object is gone (a cgroup removed between two reads).
    pub fn is_not_found(&self) -> bool {
        matches!(self, HostError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

pub type Result<T> = std::result::Result<T, HostError>;
