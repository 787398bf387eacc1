//! Errors of the host backends, always naming the file or object involved.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("{what} failed: {message}")]
    Command { what: String, message: String },
    /// The tenant exists but cannot be measured now (a paused VM); retried
    /// each interval.
    #[error("{0}")]
    Unavailable(String),
}

impl HostError {
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
