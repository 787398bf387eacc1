//! Reloading the config (SIGHUP, the API): an invalid file, or one that
//! changes what needs a restart, is refused and the running config stays.

use super::Service;
use crate::config::TenantSource;
use crate::config::{Config, ConfigError};
use crate::view::Reload;
use tracing::{info, warn};

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

impl Service {
    /// Reloads the config file. An invalid file, or one that changes what
    /// needs a restart, is refused and the running config stays.
    pub(super) fn reload(&mut self) -> Result<String, ReloadError> {
        let at = self.clock.now().as_secs_f64();
        let outcome = Config::load(&self.config.file)
            .map_err(ReloadError::from)
            .and_then(|new| match needing_restart(&self.config, &new) {
                changed if changed.is_empty() => Ok(new),
                changed => Err(ReloadError::NeedsRestart(changed)),
            })
            .map(|new| {
                self.take_config(new);
                // A fixed entry is tried at once, not after its backoff.
                self.finder.retry_all();
                let message = format!("reloaded {}", self.config.file.display());
                info!("{message}");
                message
            });
        if let Err(e) = &outcome {
            warn!("{e}");
        }
        self.shared.metrics.reload(outcome.is_ok());
        self.last_reload = Some(Reload {
            ok: outcome.is_ok(),
            message: match &outcome {
                Ok(m) => m.clone(),
                Err(e) => e.to_string(),
            },
            at,
        });
        self.shared.view.lock().unwrap().status.last_reload = self.last_reload.clone();
        outcome
    }

    /// Puts `new` in force: tenants whose entry is still there get its
    /// promise now; those no longer configured are released.
    fn take_config(&mut self, new: Config) {
        *self.shared.token.lock().unwrap() = new.api.token.clone();
        let old = std::mem::replace(&mut self.config, new);
        for name in self.roster.names() {
            let Some(t) = self.roster.get(&name) else {
                continue;
            };
            let old_entry = &old.tenants[t.found.entry];
            // A new libvirt URI or `share` is a new way to reach or cap the
            // tenant: released here, adopted again as the new config says.
            let same_libvirt = !matches!(old_entry.source, TenantSource::Libvirt { .. })
                || old.libvirt_uri == self.config.libvirt_uri;
            let kept = self.config.tenants.iter().position(|e| {
                e.name == old_entry.name
                    && e.source == old_entry.source
                    && e.device == old_entry.device
                    && e.share == old_entry.share
                    && same_libvirt
            });
            match kept {
                Some(i) => {
                    let spec = self.spec_for(i, &t.found);
                    if let Some(t) = self.roster.get_mut(&name) {
                        t.found.entry = i;
                    }
                    self.put_spec(&name, spec);
                }
                None => {
                    info!(tenant = %name, "no longer configured as it was; released");
                    self.release(&name);
                }
            }
        }
        if old.libvirt_uri != self.config.libvirt_uri {
            for d in &mut self.devices {
                d.forget_libvirt();
            }
        }
    }
}
