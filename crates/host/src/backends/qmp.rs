//! VM tenants through QEMU's monitor: counters from `query-blockstats`
//! (operations, bytes and total completion time, so VMs report latency) and
//! limits with QEMU's own throttling, applied at the VMM where its I/O can be
//! batched (seed 000): `block_set_io_throttle` for a guest drive, or `qom-set`
//! of a throttle group's `limits` for a node without a guest device (as with
//! qemu-storage-daemon).
//!
//! A socket that closes, answers garbage or hangs gives an error for that
//! tenant only; the connection is dropped and made again on the next call, so
//! a restarted QEMU is picked up. A socket that hangs (a read or write timed
//! out) is not asked again for a while, 1 s doubling to 32 s: each try costs
//! the caller a whole timeout, and the caller is the control loop.

use crate::backoff::Hung;
use crate::error::{HostError, Result};
use crate::qmp::Qmp;
use iofloor_core::{Backend, Caps, Counters, DeviceCounters, TenantSpec};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Which block device of a QEMU a tenant is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum QmpTarget {
    /// A guest drive: stats by its qdev path or device name, limits by
    /// `block_set_io_throttle` (`id` is the qdev path, e.g.
    /// `/machine/peripheral/disk0/virtio-backend`).
    Drive { id: String },
    /// A throttle group (qemu-storage-daemon): limits on the group, counters
    /// from the host block device its export is seen as.
    Group {
        group: String,
        stats_device: crate::DevId,
    },
}

#[derive(Debug, Clone)]
struct VmTenant {
    socket: PathBuf,
    target: QmpTarget,
}

pub struct QmpBackend {
    tenants: HashMap<String, VmTenant>,
    connections: HashMap<PathBuf, Qmp>,
    hung: HashMap<PathBuf, Hung>,
    timeout: Duration,
}

fn u(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// Counters from one `query-blockstats` entry's `stats` (sums saturate: a
/// garbled answer must not overflow).
pub fn counters_from_stats(stats: &Value) -> Counters {
    let (rd, wr) = (u(stats, "rd_operations"), u(stats, "wr_operations"));
    Counters {
        read_ios: rd,
        write_ios: wr,
        read_bytes: u(stats, "rd_bytes"),
        write_bytes: u(stats, "wr_bytes"),
        read_seq_ios: 0,
        write_seq_ios: 0,
        latency_ns_total: Some(
            u(stats, "rd_total_time_ns").saturating_add(u(stats, "wr_total_time_ns")),
        ),
        completions: Some(rd.saturating_add(wr)),
    }
}

/// Finds a target's entry in a `query-blockstats` answer.
pub fn find_stats<'a>(answer: &'a Value, target: &QmpTarget) -> Option<&'a Value> {
    let entries = answer.as_array()?;
    entries
        .iter()
        .find(|e| match target {
            QmpTarget::Drive { id } => {
                e.get("qdev").and_then(Value::as_str) == Some(id)
                    || e.get("device").and_then(Value::as_str) == Some(id)
            }
            QmpTarget::Group { .. } => false,
        })
        .and_then(|e| e.get("stats"))
}

/// Whether an error is a read or write that timed out.
fn is_timeout(e: &HostError) -> bool {
    matches!(e, HostError::Io { source, .. }
        if matches!(source.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

/// Whether a `query-status` answer says the guest runs. A paused guest
/// issues no I/O; reading that as "idle" would hand its share away and report
/// a floor met, so it is unavailable instead.
pub fn vm_running(status: &Value) -> std::result::Result<(), VmNotRunning> {
    if status.get("running").and_then(Value::as_bool) == Some(true) {
        return Ok(());
    }
    let state = status
        .get("status")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    Err(VmNotRunning {
        status: state.to_string(),
    })
}

/// A guest that cannot be measured now, with the run state QEMU gave.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("VM is not running (status `{status}`)")]
pub struct VmNotRunning {
    pub status: String,
}

/// The rate fields `block_set_io_throttle` requires (bursts stay at 0).
const THROTTLE_FIELDS: [&str; 6] = ["bps", "bps_rd", "bps_wr", "iops", "iops_rd", "iops_wr"];

/// QEMU's largest throttle value (`THROTTLE_VALUE_MAX`); it refuses more.
const QEMU_MAX_LIMIT: f64 = 1e15;

fn limit(v: Option<f64>) -> u64 {
    // QEMU takes whole numbers and 0 for "no limit".
    v.map(|x| x.ceil().clamp(1.0, QEMU_MAX_LIMIT) as u64)
        .unwrap_or(0)
}

/// The QMP command that sets `caps` on a target.
pub fn throttle_command(target: &QmpTarget, caps: &Caps) -> (&'static str, Value) {
    match target {
        QmpTarget::Drive { id } => (
            "block_set_io_throttle",
            json!({
                "id": id,
                "bps": 0, "bps_rd": limit(caps.read_bps), "bps_wr": limit(caps.write_bps),
                "iops": 0, "iops_rd": limit(caps.read_iops), "iops_wr": limit(caps.write_iops),
            }),
        ),
        QmpTarget::Group { group, .. } => (
            "qom-set",
            json!({
                "path": group,
                "property": "limits",
                // QEMU merges these into the group's limits, and totals
                // cannot stand beside per-direction limits: zero them.
                "value": {
                    "bps-total": 0, "iops-total": 0,
                    "bps-read": limit(caps.read_bps), "bps-write": limit(caps.write_bps),
                    "iops-read": limit(caps.read_iops), "iops-write": limit(caps.write_iops),
                },
            }),
        ),
    }
}

impl QmpBackend {
    pub fn new(timeout: Duration) -> QmpBackend {
        QmpBackend {
            tenants: HashMap::new(),
            connections: HashMap::new(),
            hung: HashMap::new(),
            timeout,
        }
    }

    pub fn add_tenant(&mut self, name: &str, socket: &Path, target: QmpTarget) {
        self.tenants.insert(
            name.to_string(),
            VmTenant {
                socket: socket.to_path_buf(),
                target,
            },
        );
    }

    pub fn remove_tenant(&mut self, name: &str) -> bool {
        self.tenants.remove(name).is_some()
    }

    /// The throttle settings a guest drive has now (the six rate fields of
    /// `query-block`), to be restored later with [`QmpBackend::set_drive_throttle`].
    pub fn drive_throttle(&mut self, name: &str) -> Result<Value> {
        let t = self.tenant(name)?;
        let QmpTarget::Drive { id } = &t.target else {
            return Err(HostError::Qmp {
                socket: t.socket.clone(),
                message: format!("tenant `{name}` is a throttle group, not a guest drive"),
            });
        };
        let answer = self.execute(&t.socket, "query-block", None)?;
        let entry = answer
            .as_array()
            .and_then(|a| {
                a.iter().find(|e| {
                    e.get("qdev").and_then(Value::as_str) == Some(id)
                        || e.get("device").and_then(Value::as_str) == Some(id)
                })
            })
            .ok_or_else(|| HostError::Qmp {
                socket: t.socket.clone(),
                message: format!("no block device `{id}` in query-block"),
            })?;
        let inserted = entry.get("inserted").ok_or_else(|| HostError::Qmp {
            socket: t.socket.clone(),
            message: format!("block device `{id}` has no medium inserted"),
        })?;
        let mut limits = serde_json::Map::new();
        for key in THROTTLE_FIELDS {
            limits.insert(key.to_string(), json!(u(inserted, key)));
        }
        Ok(Value::Object(limits))
    }

    /// Sets a guest drive's six rate fields as read by [`QmpBackend::drive_throttle`].
    pub fn set_drive_throttle(&mut self, name: &str, limits: &Value) -> Result<()> {
        let t = self.tenant(name)?;
        let QmpTarget::Drive { id } = &t.target else {
            return Err(HostError::Qmp {
                socket: t.socket.clone(),
                message: format!("tenant `{name}` is a throttle group, not a guest drive"),
            });
        };
        let mut args = json!({ "id": id });
        for key in THROTTLE_FIELDS {
            args[key] = json!(limits.get(key).and_then(Value::as_u64).unwrap_or(0));
        }
        // Putting limits back is never skipped for a pause after a timeout:
        // it is what a stopping daemon must do.
        self.execute_connected(&t.socket, "block_set_io_throttle", Some(args))
            .map(|_| ())
    }

    pub fn has_tenant(&self, name: &str) -> bool {
        self.tenants.contains_key(name)
    }

    fn tenant(&self, name: &str) -> Result<VmTenant> {
        self.tenants
            .get(name)
            .cloned()
            .ok_or_else(|| HostError::UnknownTenant(name.to_string()))
    }

    /// Runs a command on the tenant's QEMU, connecting if needed; on any
    /// error the connection is dropped, to be made again next time.
    fn execute(&mut self, socket: &Path, command: &str, args: Option<Value>) -> Result<Value> {
        if let Some(h) = self.hung.get(socket) {
            if h.paused() {
                return Err(HostError::Unavailable(format!(
                    "{}: timed out {} times in a row; not asked again until the pause ends",
                    socket.display(),
                    h.times
                )));
            }
        }
        let result = self.execute_connected(socket, command, args);
        match &result {
            Err(e) if is_timeout(e) => {
                let hung = Hung::again(self.hung.get(socket).copied());
                self.hung.insert(socket.to_path_buf(), hung);
            }
            Ok(_) => {
                self.hung.remove(socket);
            }
            Err(_) => {}
        }
        result
    }

    fn execute_connected(
        &mut self,
        socket: &Path,
        command: &str,
        args: Option<Value>,
    ) -> Result<Value> {
        if !self.connections.contains_key(socket) {
            let q = Qmp::connect(socket, self.timeout)?;
            self.connections.insert(socket.to_path_buf(), q);
        }
        let q = self.connections.get_mut(socket).expect("connected above");
        let result = q.execute(command, args);
        if result.is_err() {
            self.connections.remove(socket);
        }
        result
    }
}

impl Backend for QmpBackend {
    type Error = HostError;

    fn read_counters(&mut self, tenant: &TenantSpec) -> Result<Counters> {
        let t = self.tenant(&tenant.name)?;
        if let QmpTarget::Group { stats_device, .. } = &t.target {
            return Ok(crate::diskstats::DiskStats::proc(*stats_device)
                .read()?
                .as_tenant_counters());
        }
        let status = self.execute(&t.socket, "query-status", None)?;
        vm_running(&status)
            .map_err(|e| HostError::Unavailable(format!("{}: {e}", t.socket.display())))?;
        let answer = self.execute(&t.socket, "query-blockstats", None)?;
        let stats = find_stats(&answer, &t.target).ok_or_else(|| HostError::Qmp {
            socket: t.socket.clone(),
            message: format!("no block device {:?} in query-blockstats", t.target),
        })?;
        Ok(counters_from_stats(stats))
    }

    fn read_device(&mut self) -> Option<DeviceCounters> {
        None
    }

    fn apply_caps(&mut self, tenant: &TenantSpec, caps: &Caps) -> Result<()> {
        let t = self.tenant(&tenant.name)?;
        let (command, args) = throttle_command(&t.target, caps);
        self.execute(&t.socket, command, Some(args)).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer of a QEMU 7.2 guest (Debian 12) to query-blockstats,
    /// shortened; fields newer QEMUs add are not needed.
    const ANSWER: &str = r#"[
      {"device": "drive0", "qdev": "/machine/peripheral/disk0/virtio-backend", "stats": {"rd_operations": 120,
        "wr_operations": 30, "rd_bytes": 491520, "wr_bytes": 1966080, "rd_total_time_ns": 60000000,
        "wr_total_time_ns": 90000000, "flush_operations": 0, "idle_time_ns": 5}},
      {"device": "drive1", "qdev": "/machine/peripheral/disk1/virtio-backend", "stats": {"rd_operations": 7}}
    ]"#;

    #[test]
    fn reads_counters_and_latency_from_blockstats() {
        let answer: Value = serde_json::from_str(ANSWER).unwrap();
        let drive = QmpTarget::Drive {
            id: "/machine/peripheral/disk0/virtio-backend".into(),
        };
        let c = counters_from_stats(find_stats(&answer, &drive).unwrap());
        assert_eq!(
            (c.read_ios, c.write_ios, c.read_bytes, c.write_bytes),
            (120, 30, 491520, 1966080)
        );
        assert_eq!(
            (c.latency_ns_total, c.completions),
            (Some(150_000_000), Some(150))
        );
        let by_name = QmpTarget::Drive {
            id: "drive1".into(),
        };
        assert_eq!(
            counters_from_stats(find_stats(&answer, &by_name).unwrap()).read_ios,
            7
        );
        assert!(find_stats(&answer, &QmpTarget::Drive { id: "nope".into() }).is_none());
    }

    #[test]
    fn throttle_commands_give_all_seven_fields_and_zero_for_no_limit() {
        let caps = Caps {
            read_iops: Some(199.2),
            write_iops: None,
            read_bps: None,
            write_bps: Some(1e6),
        };
        let (cmd, args) = throttle_command(&QmpTarget::Drive { id: "d".into() }, &caps);
        assert_eq!(cmd, "block_set_io_throttle");
        assert_eq!(
            args,
            json!({"id": "d", "bps": 0, "bps_rd": 0, "bps_wr": 1000000, "iops": 0, "iops_rd": 200, "iops_wr": 0})
        );
        let group = QmpTarget::Group {
            group: "vm1".into(),
            stats_device: crate::DevId { major: 7, minor: 0 },
        };
        let (cmd, args) = throttle_command(&group, &caps);
        assert_eq!(cmd, "qom-set");
        assert_eq!(args["value"]["iops-read"], 200);
        assert_eq!(args["value"]["bps-write"], 1000000);
    }

    /// A monitor that accepts and never answers costs one timeout, then is
    /// left alone for a pause instead of costing a timeout every call.
    #[test]
    fn a_monitor_that_never_answers_is_paused_after_a_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("silent.qmp");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let mut q = QmpBackend::new(Duration::from_millis(50));
        q.add_tenant(
            "vm",
            &socket,
            QmpTarget::Drive {
                id: "drive0".into(),
            },
        );
        let first = q.drive_throttle("vm").unwrap_err();
        assert!(is_timeout(&first), "{first}");
        let second = q.drive_throttle("vm").unwrap_err();
        assert!(
            matches!(&second, HostError::Unavailable(m) if m.contains("timed out 1 times")),
            "{second}"
        );
        drop(listener);
    }
}
