//! Safe ownership of throttles. Before iofloor first writes a tenant's limits
//! it records the limits that were in place, in memory and in a small state
//! file (written atomically, before the write it protects). On shutdown the
//! recorded limits are put back; after a crash the next start finds the state
//! file and puts them back before taking over again, so nothing iofloor set
//! outlives it by accident.

use iofloor_core::Caps;
use iofloor_host::DevId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What a tenant's limits were before iofloor touched them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Original {
    /// A cgroup's blk-throttle (v1) or io.max (v2) limits on one device.
    Cgroup {
        root: PathBuf,
        cgroup: PathBuf,
        device: DevId,
        caps: Caps,
    },
    /// A guest drive's QEMU throttle fields (as `query-block` shows them).
    Qmp {
        socket: PathBuf,
        drive: String,
        limits: serde_json::Value,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub tenant: String,
    pub original: Original,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct StateFile {
    pid: u32,
    entries: Vec<Entry>,
}

/// The record of everything iofloor owns, mirrored to the state file.
///
/// Changes are staged in memory and written with [`Ownership::flush`], one
/// write for a whole interval's adoptions: the service flushes before the
/// controller's next write, which keeps the rule (recorded on disk before
/// written to) while 10,000 tenants adopted at start cost one write, not
/// 10,000 writes of a growing file.
#[derive(Debug)]
pub struct Ownership {
    path: PathBuf,
    entries: BTreeMap<String, Entry>,
    dirty: bool,
}

impl Ownership {
    /// Reads what a previous run left (`None` when it ended cleanly), without
    /// taking over the file yet.
    pub fn leftovers(path: &Path) -> anyhow::Result<Option<(u32, Vec<Entry>)>> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => anyhow::bail!("{}: {e}", path.display()),
        };
        let state: StateFile = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: not an iofloor state file ({e})", path.display()))?;
        Ok(Some((state.pid, state.entries)))
    }

    /// Starts a fresh record at `path` (its directory is created).
    pub fn create(path: &Path) -> anyhow::Result<Ownership> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
        }
        let mut o = Ownership {
            path: path.to_path_buf(),
            entries: BTreeMap::new(),
            dirty: true,
        };
        o.flush()?;
        Ok(o)
    }

    /// Writes the staged changes (temp file, then rename), if any.
    pub fn flush(&mut self) -> anyhow::Result<()> {
        if !self.dirty {
            return Ok(());
        }
        let state = StateFile {
            pid: std::process::id(),
            entries: self.entries.values().cloned().collect(),
        };
        let tmp = self.path.with_extension("tmp");
        let text = serde_json::to_string_pretty(&state)?;
        std::fs::write(&tmp, text).map_err(|e| anyhow::anyhow!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &self.path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display()))?;
        self.dirty = false;
        Ok(())
    }

    /// Stages a tenant's original limits; on disk after the next [`flush`](Ownership::flush).
    pub fn stage(&mut self, entry: Entry) {
        self.entries.insert(entry.tenant.clone(), entry);
        self.dirty = true;
    }

    /// Stages and writes at once.
    pub fn record(&mut self, entry: Entry) -> anyhow::Result<()> {
        self.stage(entry);
        self.flush()
    }

    pub fn get(&self, tenant: &str) -> Option<&Entry> {
        self.entries.get(tenant)
    }

    /// Forgets a tenant (its limits were restored, or it is gone); written
    /// with the next flush (a crash before it restores the original again,
    /// which is harmless).
    pub fn forget(&mut self, tenant: &str) {
        if self.entries.remove(tenant).is_some() {
            self.dirty = true;
        }
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// Removes the state file: every limit was put back.
    pub fn finish(self) -> anyhow::Result<()> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => anyhow::bail!("{}: {e}", self.path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_file_follows_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.json");
        assert!(Ownership::leftovers(&path).unwrap().is_none());
        let mut o = Ownership::create(&path).unwrap();
        let entry = Entry {
            tenant: "a".into(),
            original: Original::Cgroup {
                root: "/sys/fs/cgroup/blkio".into(),
                cgroup: "a".into(),
                device: DevId { major: 7, minor: 0 },
                caps: Caps {
                    read_iops: Some(50.0),
                    ..Caps::NONE
                },
            },
        };
        o.record(entry.clone()).unwrap();
        let (pid, left) = Ownership::leftovers(&path).unwrap().unwrap();
        assert_eq!((pid, left), (std::process::id(), vec![entry]));
        o.forget("a");
        assert_eq!(
            Ownership::leftovers(&path).unwrap().unwrap().1.len(),
            1,
            "until flushed"
        );
        o.flush().unwrap();
        assert!(Ownership::leftovers(&path).unwrap().unwrap().1.is_empty());
        o.finish().unwrap();
        assert!(!path.exists());
        std::fs::write(&path, "{garbage").unwrap();
        assert!(Ownership::leftovers(&path)
            .unwrap_err()
            .to_string()
            .contains("not an iofloor state file"));
    }
}
