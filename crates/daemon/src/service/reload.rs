//! Reloading the config (SIGHUP, the API): an invalid file, or one that
//! changes what needs a restart, is refused and the running config stays.

use crate::config::TenantSource;
use crate::config::{Config, ConfigError};

/// Why a reload was refused; the running config stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("config not reloaded, the running one stays: {0}")]
    Invalid(#[from] ConfigError),
    #[error("config not reloaded, the running one stays: changing {} needs a restart", .0.join(", "))]
    NeedsRestart(Vec<&'static str>),
}

/// What differs between `old` and `new` that only a restart can change.
fn needing_restart(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if new.devices != old.devices {
        changed.push("[[device]]");
    }
    if new.cgroup_root != old.cgroup_root {
        changed.push("cgroup_root");
    }
    if new.state_file != old.state_file {
        changed.push("state_file");
    }
    if new.api.listen != old.api.listen || new.api.unix_socket != old.api.unix_socket {
        changed.push("api.listen / api.unix_socket");
    }
    if new.cluster != old.cluster {
        changed.push("[cluster]");
    }
    if new.policy != old.policy || new.params != old.params {
        changed.push("[policy]");
    }
    // Which cgroup holds a group's limit is settled when its members are
    // adopted, with that cgroup's own limits recorded to put back.
    let group_cgroups = |c: &Config| {
        c.tenants
            .iter()
            .filter_map(|t| Some((t.group.as_ref()?.name.clone(), t.group_cgroup.clone()?)))
            .collect::<std::collections::BTreeSet<_>>()
    };
    if group_cgroups(new) != group_cgroups(old) {
        changed.push("[[group]] cgroup");
    }
    changed
}

/// The config file read again for a reload of `old`: refused when it is
/// invalid or changes what needs a restart.
pub(super) fn reread(old: &Config) -> Result<Config, ReloadError> {
    let new = Config::load(&old.file)?;
    match needing_restart(old, &new) {
        changed if changed.is_empty() => Ok(new),
        changed => Err(ReloadError::NeedsRestart(changed)),
    }
}

/// Where a tenant adopted under `old`'s entry `entry` is in `new`, if it is
/// still controlled the same way. A new libvirt URI or `share` is a new way
/// to reach or cap the tenant: released, then adopted again as `new` says.
pub(super) fn entry_kept(old: &Config, new: &Config, entry: usize) -> Option<usize> {
    let old_entry = &old.tenants[entry];
    let same_libvirt = !matches!(old_entry.source, TenantSource::Libvirt { .. })
        || old.libvirt_uri == new.libvirt_uri;
    new.tenants.iter().position(|e| {
        e.name == old_entry.name
            && e.source == old_entry.source
            && e.device == old_entry.device
            && e.share == old_entry.share
            && same_libvirt
    })
}
