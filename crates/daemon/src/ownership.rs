//! Safe ownership of throttles. Before iofloor first writes a tenant's limits
//! it records the limits that were in place, in memory and in a small state
//! file (written atomically, before the write it protects). On shutdown the
//! recorded limits are put back; after a crash the next start finds the state
//! file and puts them back before taking over again, so nothing iofloor set
//! outlives it by accident.
//!
//! The file is the only record of those limits, so it is kept as a database
//! keeps its log: each version is written to a temporary file, synced, renamed
//! over the old one and the directory synced (a crash leaves the old version
//! or the new one, never a mix, and a power cut after the rename does not
//! bring the old one back); it carries a format version; and one that cannot
//! be read is an error naming it and what to do, never dropped or
//! overwritten.

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
    /// A libvirt domain's disk limits (`virDomainGetBlockIoTune`).
    Libvirt {
        uri: String,
        uuid: String,
        domain: String,
        disk: String,
        tune: iofloor_host::backends::libvirt::IoTune,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub tenant: String,
    pub original: Original,
}

/// The state file's format. 1: the first (no `version` key); 2: the same
/// fields with `version`. A newer one is refused, not guessed at.
pub const STATE_VERSION: u32 = 2;

fn first_version() -> u32 {
    1
}

#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
struct StateFile {
    #[serde(default = "first_version")]
    version: u32,
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

/// A state file's text: the pid of the iofloor that wrote it and the
/// entries it owned. Corrupt, truncated or newer files are errors that name
/// the file and what to do: the file is the only record of what to restore.
pub fn parse_state(text: &str, path: &Path) -> anyhow::Result<(u32, Vec<Entry>)> {
    let state: StateFile = serde_json::from_str(text).map_err(|e| {
        anyhow::anyhow!(
            "{}: not a readable iofloor state file ({e}); it may be corrupt or truncated. It is \
             the only record of the limits a previous iofloor changed: put those limits back \
             by hand (its `entries` list each tenant's original `caps` or `limits`), then move \
             the file away and start again",
            path.display()
        )
    })?;
    if state.version > STATE_VERSION {
        anyhow::bail!(
            "{}: state file of version {}, newer than this iofloor's {STATE_VERSION}: start the \
             iofloor that wrote it (it restores its limits on start), or put them back by hand \
             and move the file away",
            path.display(),
            state.version
        );
    }
    Ok((state.pid, state.entries))
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
        parse_state(&text, path).map(Some)
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

    /// Writes the staged changes, if any: temporary file, synced, renamed
    /// over the state file, directory synced.
    pub fn flush(&mut self) -> anyhow::Result<()> {
        if !self.dirty {
            return Ok(());
        }
        let state = StateFile {
            version: STATE_VERSION,
            pid: std::process::id(),
            entries: self.entries.values().cloned().collect(),
        };
        let text = serde_json::to_string_pretty(&state)?;
        write_durably(&self.path, text.as_bytes())?;
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

/// Replaces `path` with `bytes` so that a crash or power cut at any moment
/// leaves either the old content or the new, complete.
fn write_durably(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let at = |p: &Path| {
        let p = p.display().to_string();
        move |e: std::io::Error| anyhow::anyhow!("{p}: {e}")
    };
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp).map_err(at(&tmp))?;
    file.write_all(bytes).map_err(at(&tmp))?;
    file.sync_all().map_err(at(&tmp))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(at(path))?;
    // The rename is in the directory: sync it too, or a power cut may undo it.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(at(dir))?;
    Ok(())
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
            .contains("not a readable iofloor state file"));
    }

    fn cgroup_entry(tenant: &str, iops: Option<f64>) -> Entry {
        Entry {
            tenant: tenant.into(),
            original: Original::Cgroup {
                root: "/sys/fs/cgroup/blkio".into(),
                cgroup: tenant.into(),
                device: DevId { major: 7, minor: 0 },
                caps: Caps {
                    read_iops: iops,
                    ..Caps::NONE
                },
            },
        }
    }

    #[test]
    fn a_truncated_state_file_is_an_error_that_names_it_and_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let mut o = Ownership::create(&path).unwrap();
        o.record(cgroup_entry("a", Some(50.0))).unwrap();
        let whole = std::fs::read(&path).unwrap();
        assert!(!dir.path().join("state.tmp").exists(), "no temporary left");
        // Every prefix a crash of a non-atomic writer could leave.
        for cut in [1, whole.len() / 2, whole.len() - 2] {
            std::fs::write(&path, &whole[..cut]).unwrap();
            let e = Ownership::leftovers(&path).unwrap_err().to_string();
            assert!(
                e.starts_with(&path.display().to_string())
                    && e.contains("corrupt or truncated")
                    && e.contains("put those limits back by hand"),
                "{e}"
            );
            assert_eq!(std::fs::read(&path).unwrap(), &whole[..cut], "not touched");
        }
    }

    #[test]
    fn the_state_file_carries_its_version_and_a_newer_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let mut o = Ownership::create(&path).unwrap();
        o.record(cgroup_entry("a", None)).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["version"], STATE_VERSION);
        // Version 1 had no `version` key: still read.
        let old = r#"{"pid": 7, "entries": []}"#;
        std::fs::write(&path, old).unwrap();
        assert_eq!(Ownership::leftovers(&path).unwrap(), Some((7, vec![])));
        std::fs::write(&path, r#"{"version": 99, "pid": 7, "entries": []}"#).unwrap();
        let e = Ownership::leftovers(&path).unwrap_err().to_string();
        assert!(e.contains("version 99, newer than this iofloor's 2"), "{e}");
    }

    proptest::proptest! {
        /// Whatever is recorded is read back equal, in tenant order.
        #[test]
        fn the_state_file_round_trips(
            caps in proptest::collection::btree_map("[a-z/]{1,12}", proptest::option::of(1.0f64..1e7), 0..20)
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("state.json");
            let mut o = Ownership::create(&path).unwrap();
            let entries: Vec<Entry> = caps.iter().map(|(t, c)| cgroup_entry(t, *c)).collect();
            for e in &entries {
                o.stage(e.clone());
            }
            o.flush().unwrap();
            let (_, read) = Ownership::leftovers(&path).unwrap().unwrap();
            proptest::prop_assert_eq!(read, entries);
        }
    }
}
