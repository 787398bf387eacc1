//! Reloading the config (SIGHUP, the API): an invalid file, or one that
//! changes what needs a restart, is refused and the running config stays.

use super::adoption::spec_of;
use super::Service;
use crate::config::Config;
use crate::view::Reload;
use std::sync::Arc;
use tracing::{info, warn};

impl Service {
    /// Reloads the config file. An invalid file, or one that changes what
    /// needs a restart, is refused and the running config stays.
    pub(super) fn reload(&mut self) -> Result<String, String> {
        let at = self.started.elapsed().as_secs_f64();
        let result = Config::load(&self.config.file)
            .map_err(|e| e.to_string())
            .and_then(|new| {
                let old = &self.config;
                let mut needs_restart = Vec::new();
                if new.devices != old.devices {
                    needs_restart.push("[[device]]");
                }
                if new.cgroup_root != old.cgroup_root {
                    needs_restart.push("cgroup_root");
                }
                if new.state_file != old.state_file {
                    needs_restart.push("state_file");
                }
                if new.api.listen != old.api.listen || new.api.unix_socket != old.api.unix_socket {
                    needs_restart.push("api.listen / api.unix_socket");
                }
                if new.policy != old.policy || new.params != old.params {
                    needs_restart.push("[policy]");
                }
                if !needs_restart.is_empty() {
                    return Err(format!(
                        "changing {} needs a restart",
                        needs_restart.join(", ")
                    ));
                }
                Ok(new)
            });
        let outcome = match result {
            Ok(new) => {
                *self.shared.token.lock().unwrap() = new.api.token.clone();
                let old_entries = std::mem::replace(&mut self.config, new);
                // Tenants whose entry changed get their new promise now;
                // those no longer configured are released by discovery.
                let names: Vec<String> = self.tenants.keys().cloned().collect();
                for name in names {
                    let t = &self.tenants[&name];
                    let old_entry = &old_entries.tenants[t.found.entry];
                    match self.config.tenants.iter().position(|e| {
                        e.name == old_entry.name
                            && e.source == old_entry.source
                            && e.device == old_entry.device
                    }) {
                        Some(i) => {
                            let spec = Arc::new(spec_of(
                                &self.config.tenants[i],
                                &name,
                                self.overrides.get(&name),
                            ));
                            let t = self.tenants.get_mut(&name).expect("listed above");
                            t.found.entry = i;
                            self.devices[t.device].controller.update_spec(spec.clone());
                            t.spec = spec;
                        }
                        None => {
                            info!(tenant = %name, "no longer configured; released");
                            self.release(&name);
                        }
                    }
                }
                let message = format!("reloaded {}", self.config.file.display());
                info!("{message}");
                Ok(message)
            }
            Err(e) => {
                let message = format!("config not reloaded, the running one stays: {e}");
                warn!("{message}");
                Err(message)
            }
        };
        self.shared.metrics.reload(outcome.is_ok());
        self.last_reload = Some(Reload {
            ok: outcome.is_ok(),
            message: match &outcome {
                Ok(m) | Err(m) => m.clone(),
            },
            at,
        });
        self.shared.view.lock().unwrap().status.last_reload = self.last_reload.clone();
        outcome
    }
}
