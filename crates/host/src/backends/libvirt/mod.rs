//! VM tenants through libvirt, where operators keep their VMs: libvirt owns
//! a domain's QEMU monitor (a second QMP client would taint the domain and
//! leave libvirt's view of the throttles wrong), so everything goes through
//! its API. Counters come from `virDomainBlockStatsFlags` (operations, bytes
//! and total completion times, so VMs report latency), limits go on with
//! `virDomainSetBlockIoTune` on the live domain, and the limits a disk had
//! are read with `virDomainGetBlockIoTune` to be put back.
//!
//! Every call runs on a worker thread that owns the connection, and the
//! control loop waits for it only so long: a libvirtd that restarts or
//! hangs makes its tenants unavailable for an interval (never idle), the
//! connection is made again on the next call, and a daemon that keeps
//! timing out is left alone for a pause that doubles from 1 s to 32 s, as a
//! QEMU monitor that hangs is.

mod ffi;

use crate::backoff::Hung;
use crate::error::{HostError, Result};
use ffi::{Connection, Domain, LvError, ParamValue, TypedParam};
use iofloor_core::{Backend, Caps, Counters, DeviceCounters, TenantSpec};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Duration;

/// The default URI: the system's QEMU driver.
pub const DEFAULT_URI: &str = "qemu:///system";

/// A running (or paused) domain and its disks.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DomainInfo {
    pub name: String,
    pub uuid: String,
    /// Disk targets (`vda`, `sdb`) of its `<disk device='disk'>`s, in order.
    pub disks: Vec<String>,
}

/// A disk's I/O limits as libvirt keeps them: the six rates (0 is none)
/// and the throttle group it is in, if one was set by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoTune {
    pub total_bytes_sec: u64,
    pub read_bytes_sec: u64,
    pub write_bytes_sec: u64,
    pub total_iops_sec: u64,
    pub read_iops_sec: u64,
    pub write_iops_sec: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_name: Option<String>,
    /// Burst limits an operator set (`*_max`, `*_max_length`,
    /// `size_iops_sec`), non-zero ones only: cleared while iofloor caps the
    /// disk (QEMU refuses a cap below a burst, or a burst without its rate)
    /// and put back with the rest.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub bursts: std::collections::BTreeMap<String, u64>,
}

/// libvirt's burst fields beside the six rates.
const BURST_FIELDS: [&str; 13] = [
    "total_bytes_sec_max",
    "read_bytes_sec_max",
    "write_bytes_sec_max",
    "total_iops_sec_max",
    "read_iops_sec_max",
    "write_iops_sec_max",
    "size_iops_sec",
    "total_bytes_sec_max_length",
    "read_bytes_sec_max_length",
    "write_bytes_sec_max_length",
    "total_iops_sec_max_length",
    "read_iops_sec_max_length",
    "write_iops_sec_max_length",
];

const RATE_FIELDS: [&str; 6] = [
    "total_bytes_sec",
    "read_bytes_sec",
    "write_bytes_sec",
    "total_iops_sec",
    "read_iops_sec",
    "write_iops_sec",
];

impl IoTune {
    /// From `virDomainGetBlockIoTune`'s parameters. A group name QEMU gave
    /// the disk itself (its qdev path, when limits were set without a
    /// group) or an empty one is no group: passing it back could put an
    /// unrelated disk in it.
    pub fn from_params(params: &[(String, ParamValue)]) -> IoTune {
        let get = |field: &str| int_param(params, field);
        let group_name =
            params
                .iter()
                .find(|(n, _)| n == "group_name")
                .and_then(|(_, v)| match v {
                    ParamValue::Text(t) if !t.is_empty() && !t.starts_with("/machine/") => {
                        Some(t.clone())
                    }
                    _ => None,
                });
        IoTune {
            total_bytes_sec: get("total_bytes_sec"),
            read_bytes_sec: get("read_bytes_sec"),
            write_bytes_sec: get("write_bytes_sec"),
            total_iops_sec: get("total_iops_sec"),
            read_iops_sec: get("read_iops_sec"),
            write_iops_sec: get("write_iops_sec"),
            group_name,
            bursts: BURST_FIELDS
                .iter()
                .map(|f| (f.to_string(), get(f)))
                .filter(|(_, v)| *v > 0)
                .collect(),
        }
    }

    /// The limits iofloor writes for `caps`: per direction, totals 0 (libvirt
    /// refuses a total beside a per-direction limit of the same kind).
    pub fn of_caps(caps: &Caps) -> IoTune {
        // QEMU's largest throttle value; it refuses more.
        let limit = |v: Option<f64>| v.map(|x| x.ceil().clamp(1.0, 1e15) as u64).unwrap_or(0);
        IoTune {
            read_bytes_sec: limit(caps.read_bps),
            write_bytes_sec: limit(caps.write_bps),
            read_iops_sec: limit(caps.read_iops),
            write_iops_sec: limit(caps.write_iops),
            ..IoTune::default()
        }
    }

    fn rates(&self) -> [u64; 6] {
        [
            self.total_bytes_sec,
            self.read_bytes_sec,
            self.write_bytes_sec,
            self.total_iops_sec,
            self.read_iops_sec,
            self.write_iops_sec,
        ]
    }
}

/// A numeric typed parameter by name; 0 where libvirt did not give it.
fn int_param(params: &[(String, ParamValue)], field: &str) -> u64 {
    params
        .iter()
        .find(|(n, _)| n == field)
        .and_then(|(_, v)| match v {
            ParamValue::Int(x) => Some(*x),
            _ => None,
        })
        .unwrap_or(0)
}

/// Counters of one disk from `virDomainBlockStatsFlags` (QEMU's totals:
/// operations, bytes, and completion times in ns).
pub fn counters_from_stats(params: &[(String, ParamValue)]) -> Counters {
    let get = |field: &str| int_param(params, field);
    let (rd, wr) = (get("rd_operations"), get("wr_operations"));
    Counters {
        read_ios: rd,
        write_ios: wr,
        read_bytes: get("rd_bytes"),
        write_bytes: get("wr_bytes"),
        read_seq_ios: 0,
        write_seq_ios: 0,
        latency_ns_total: Some(get("rd_total_times").saturating_add(get("wr_total_times"))),
        completions: Some(rd.saturating_add(wr)),
    }
}

/// The disk targets of a domain's XML: `<disk device='disk'>` only (not
/// CD-ROMs or floppies), by `<target dev=…>`.
pub fn disk_targets(xml: &str) -> std::result::Result<Vec<String>, DomainXmlError> {
    let doc = roxmltree::Document::parse(xml).map_err(DomainXmlError)?;
    Ok(doc
        .descendants()
        .filter(|n| n.has_tag_name("disk") && n.attribute("device").unwrap_or("disk") == "disk")
        .filter(|n| n.parent().is_some_and(|p| p.has_tag_name("devices")))
        .filter_map(|n| {
            n.children()
                .find(|c| c.has_tag_name("target"))
                .and_then(|t| t.attribute("dev"))
                .map(str::to_string)
        })
        .collect())
}

/// A domain's XML that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("domain XML: {0}")]
pub struct DomainXmlError(#[source] roxmltree::Error);

/// What the worker is asked to do; its answer comes back on the job's own
/// channel, which the caller stops listening to when it gives up waiting.
type Job = Box<dyn FnOnce(&mut Session) + Send>;

/// The worker's side: the connection, made on demand and dropped on a
/// connection error so the next job makes it again; and what it learned on
/// it: domain handles by UUID (a lookup is a round trip each interval
/// otherwise) and each domain's disks (its XML read once).
struct Session {
    uri: String,
    conn: Option<Connection>,
    handles: HashMap<String, Domain>,
    disks: HashMap<String, Vec<String>>,
}

impl Session {
    fn connection(&mut self) -> std::result::Result<&Connection, LvError> {
        if self.conn.as_ref().is_some_and(|c| !c.is_alive()) {
            self.drop_connection();
        }
        if self.conn.is_none() {
            self.conn = Some(Connection::open(&self.uri)?);
        }
        Ok(self.conn.as_ref().expect("opened above"))
    }

    fn drop_connection(&mut self) {
        self.handles.clear();
        self.conn = None;
    }

    /// Whether an error means the connection itself failed (libvirtd gone,
    /// restarted, keepalive timed out).
    fn failed(&self, e: &LvError) -> bool {
        e.domain == ffi::FROM_RPC || self.conn.as_ref().is_some_and(|c| !c.is_alive())
    }

    /// Runs `f` on the connection, dropped on a connection error.
    fn with<T>(
        &mut self,
        f: impl FnOnce(&Connection) -> std::result::Result<T, LvError>,
    ) -> std::result::Result<T, LvError> {
        let result = f(self.connection()?);
        if let Err(e) = &result {
            if self.failed(e) {
                self.drop_connection();
            }
        }
        result
    }

    /// Runs `f` on the domain `uuid`, its handle kept for next time (and
    /// forgotten when it fails: the domain went, or the connection did).
    fn with_domain<T>(
        &mut self,
        uuid: &str,
        f: impl FnOnce(&Domain) -> std::result::Result<T, LvError>,
    ) -> std::result::Result<T, LvError> {
        if !self.handles.contains_key(uuid) {
            let dom = self.with(|c| c.domain_by_uuid(uuid))?;
            self.handles.insert(uuid.to_string(), dom);
        }
        let result = f(&self.handles[uuid]);
        if let Err(e) = &result {
            self.handles.remove(uuid);
            if self.failed(e) {
                self.drop_connection();
            }
        }
        result
    }
}

#[derive(Debug, Clone)]
struct Disk {
    uuid: String,
    domain: String,
    target: String,
    /// The QEMU throttle group (libvirt's `group_name`) the disk's caps go
    /// to, summed with its group's other disks', where its VM's disks share
    /// one limit.
    shared: Option<String>,
}

/// The libvirt backend: a worker thread with the connection, and the
/// tenants (a domain's disk each) it serves.
pub struct LibvirtBackend {
    uri: String,
    jobs: mpsc::Sender<Job>,
    tenants: HashMap<String, Disk>,
    /// The caps last given each disk of a shared throttle group, and the
    /// disks put in their group (libvirt holds the group's values once for
    /// all of them: a write on one updates the group).
    shared_caps: HashMap<String, Caps>,
    joined: std::collections::HashSet<String>,
    /// Disks not written to yet: they may sit in an operator's throttle
    /// group, which caps written without a group name would set whole.
    fresh: std::collections::HashSet<String>,
    /// Each shared throttle group's disks, by domain UUID and group name.
    members: HashMap<(String, String), Vec<String>>,
    hung: Option<Hung>,
    timeout: Duration,
}

impl LibvirtBackend {
    /// A backend for `uri`, each call waited for at most `timeout`. Nothing
    /// is connected until the first call.
    pub fn new(uri: &str, timeout: Duration) -> Result<LibvirtBackend> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let worker_uri = uri.to_string();
        std::thread::Builder::new()
            .name("iofloor-libvirt".into())
            .spawn(move || {
                // The connection lives and dies on this thread (libvirt's
                // errors are per thread, its handles are not shared).
                let mut session = Session {
                    uri: worker_uri,
                    conn: None,
                    handles: HashMap::new(),
                    disks: HashMap::new(),
                };
                for job in queue {
                    job(&mut session);
                }
            })
            .map_err(|e| HostError::Unavailable(format!("libvirt worker thread: {e}")))?;
        Ok(LibvirtBackend {
            uri: uri.to_string(),
            jobs,
            tenants: HashMap::new(),
            shared_caps: HashMap::new(),
            joined: Default::default(),
            fresh: Default::default(),
            members: HashMap::new(),
            hung: None,
            timeout,
        })
    }

    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Runs `f` on the worker and waits for its answer at most the timeout.
    fn call<T: Send + 'static>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut Session) -> std::result::Result<T, LvError> + Send + 'static,
    ) -> Result<T> {
        if let Some(h) = self.hung {
            if h.paused() {
                return Err(HostError::Unavailable(format!(
                    "libvirt {}: did not answer {} times in a row; not asked again until the pause ends",
                    self.uri, h.times
                )));
            }
        }
        let (tx, rx) = mpsc::channel();
        self.jobs
            .send(Box::new(move |s: &mut Session| {
                let _ = tx.send(f(s));
            }))
            .map_err(|_| HostError::Unavailable("libvirt worker stopped".into()))?;
        match rx.recv_timeout(self.timeout) {
            Ok(answer) => {
                self.hung = None;
                answer.map_err(|e| self.error(what, e))
            }
            Err(_) => {
                self.hung = Some(Hung::again(self.hung));
                Err(HostError::Unavailable(format!(
                    "libvirt {}: {what} did not answer within {:?}",
                    self.uri, self.timeout
                )))
            }
        }
    }

    fn error(&self, what: &str, e: LvError) -> HostError {
        let message = format!("libvirt {}: {what}: {}", self.uri, e.message);
        // A domain gone or not running, or the daemon away: the tenant is
        // unavailable (not idle), and found again when it is back.
        if e.code == ffi::ERR_NO_DOMAIN
            || e.code == ffi::ERR_OPERATION_INVALID
            || e.domain == ffi::FROM_RPC
        {
            HostError::Unavailable(message)
        } else {
            HostError::Libvirt(message)
        }
    }

    /// The active domains and their disks.
    /// A domain that goes while it is listed is left out; a domain's disks
    /// are read from its XML once (a disk hot-plugged later is not seen
    /// until the daemon restarts or the domain does).
    pub fn domains(&mut self) -> Result<Vec<DomainInfo>> {
        self.call("listing domains", |s| {
            let listed = s.with(|c| c.active_domains())?;
            let mut out = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for d in listed {
                let (Ok(name), Ok(uuid)) = (d.name(), d.uuid()) else {
                    continue;
                };
                seen.insert(uuid.clone());
                let disks = match s.disks.get(&uuid) {
                    Some(disks) => disks.clone(),
                    None => {
                        let Ok(xml) = d.xml() else { continue };
                        let Ok(disks) = disk_targets(&xml) else {
                            continue;
                        };
                        s.disks.insert(uuid.clone(), disks.clone());
                        disks
                    }
                };
                out.push(DomainInfo { name, uuid, disks });
            }
            // A domain that stopped may come back with other disks.
            s.disks.retain(|u, _| seen.contains(u));
            out.sort();
            Ok(out)
        })
    }

    /// A domain's disk as tenant `name`. With `shared`, its caps go to
    /// that QEMU throttle group (libvirt's `group_name`), which holds the sum
    /// of the caps of every disk added with the same group: the VM's disks
    /// share one limit and one disk may use what another leaves, at once.
    pub fn add_tenant(
        &mut self,
        name: &str,
        domain: &DomainInfo,
        disk: &str,
        shared: Option<&str>,
    ) {
        self.remove_tenant(name);
        if let Some(g) = shared {
            self.members
                .entry((domain.uuid.clone(), g.to_string()))
                .or_default()
                .push(name.to_string());
        }
        self.tenants.insert(
            name.to_string(),
            Disk {
                uuid: domain.uuid.clone(),
                domain: domain.name.clone(),
                target: disk.to_string(),
                shared: shared.map(str::to_string),
            },
        );
        self.fresh.insert(name.to_string());
    }

    pub fn remove_tenant(&mut self, name: &str) -> bool {
        self.shared_caps.remove(name);
        self.joined.remove(name);
        self.fresh.remove(name);
        let Some(d) = self.tenants.remove(name) else {
            return false;
        };
        if let Some(g) = d.shared {
            let key = (d.uuid, g);
            if let Some(members) = self.members.get_mut(&key) {
                members.retain(|m| m != name);
                if members.is_empty() {
                    self.members.remove(&key);
                }
            }
        }
        true
    }

    pub fn has_tenant(&self, name: &str) -> bool {
        self.tenants.contains_key(name)
    }

    fn disk(&self, name: &str) -> Result<Disk> {
        self.tenants
            .get(name)
            .cloned()
            .ok_or_else(|| HostError::UnknownTenant(name.to_string()))
    }

    /// A disk's limits now, to be put back later with [`LibvirtBackend::set_io_tune`].
    pub fn io_tune(&mut self, name: &str) -> Result<IoTune> {
        let d = self.disk(name)?;
        let what = format!("reading the limits of {}/{}", d.domain, d.target);
        self.call(&what, move |s| {
            s.with_domain(&d.uuid, |dom| {
                Ok(IoTune::from_params(&dom.block_io_tune(&d.target)?))
            })
        })
    }

    /// Sets a disk's limits as [`IoTune`] says (the six rates, and the
    /// throttle group where it names one).
    pub fn set_io_tune(&mut self, name: &str, tune: &IoTune) -> Result<()> {
        // A disk in a throttle group stays in it when given limits without
        // a group name, and takes the whole group to them: all zeros first
        // take it out (restoring an operator's limit must not set its
        // siblings' too).
        if tune.rates() != [0; 6] {
            self.write_io_tune(name, &IoTune::default())?;
        }
        self.joined.remove(name);
        self.write_io_tune(name, tune)
    }

    fn write_io_tune(&mut self, name: &str, tune: &IoTune) -> Result<()> {
        let d = self.disk(name)?;
        let tune = tune.clone();
        let what = format!("setting the limits of {}/{}", d.domain, d.target);
        self.call(&what, move |s| {
            s.with_domain(&d.uuid, |dom| {
                let group = match &tune.group_name {
                    Some(g) => Some(std::ffi::CString::new(g.as_str()).map_err(|_| LvError {
                        code: 0,
                        domain: 0,
                        message: "a group name with a NUL byte".into(),
                    })?),
                    None => None,
                };
                let mut params: Vec<TypedParam> = RATE_FIELDS
                    .iter()
                    .zip(tune.rates())
                    .map(|(f, v)| TypedParam::ullong(f, v))
                    .collect();
                // Bursts only where they are to be set or were there: a
                // zero burst length without its burst is refused.
                for f in BURST_FIELDS
                    .iter()
                    .filter(|f| f.ends_with("_max") || **f == "size_iops_sec")
                {
                    params.push(TypedParam::ullong(
                        f,
                        tune.bursts.get(*f).copied().unwrap_or(0),
                    ));
                }
                for (f, v) in tune.bursts.iter().filter(|(f, _)| f.ends_with("_length")) {
                    params.push(TypedParam::ullong(f, *v));
                }
                if let Some(g) = &group {
                    params.push(TypedParam::string("group_name", g));
                }
                dom.set_block_io_tune(&d.target, &mut params)
            })
        })
    }
}

/// Domain states libvirt reports; only a running domain issues I/O.
fn state_name(state: i32) -> &'static str {
    match state {
        1 => "running",
        2 => "blocked",
        3 => "paused",
        4 => "shutting down",
        5 => "shut off",
        6 => "crashed",
        7 => "suspended by the guest",
        _ => "unknown",
    }
}

impl Backend for LibvirtBackend {
    type Error = HostError;

    fn read_counters(&mut self, tenant: &TenantSpec) -> Result<Counters> {
        let d = self.disk(&tenant.name)?;
        let what = format!("statistics of {}/{}", d.domain, d.target);
        let (state, stats) = self.call(&what, move |s| {
            s.with_domain(&d.uuid, |dom| {
                let state = dom.state()?;
                Ok((state, dom.block_stats(&d.target)?))
            })
        })?;
        // A paused domain's counters stand still: read as idle, its share
        // would be handed away and its floor reported met.
        if state != 1 && state != 2 {
            return Err(HostError::Unavailable(format!(
                "domain `{}` is {}",
                self.disk(&tenant.name)?.domain,
                state_name(state)
            )));
        }
        Ok(counters_from_stats(&stats))
    }

    fn read_device(&mut self) -> Option<DeviceCounters> {
        None
    }

    fn apply_caps(&mut self, tenant: &TenantSpec, caps: &Caps) -> Result<()> {
        let d = self.disk(&tenant.name)?;
        // Out of any throttle group it was in (all zeros) before its own
        // caps: in an operator's group they would set the whole group.
        if self.fresh.remove(&tenant.name) {
            self.write_io_tune(&tenant.name, &IoTune::default())?;
        }
        let Some(group) = d.shared else {
            return self.write_io_tune(&tenant.name, &IoTune::of_caps(caps));
        };
        // The group's limit is its disks' caps added up.
        self.shared_caps.insert(tenant.name.clone(), *caps);
        let members: Vec<String> = self
            .members
            .get(&(d.uuid.clone(), group.clone()))
            .cloned()
            .unwrap_or_default();
        let member_caps: Vec<Caps> = members
            .iter()
            .map(|m| self.shared_caps.get(m).copied().unwrap_or(Caps::NONE))
            .collect();
        let capped = member_caps.iter().filter(|c| !c.is_unlimited()).count();
        if capped == 0 {
            // None held back: no limit, every disk out of the group.
            for m in &members {
                if self.joined.remove(m) || m == &tenant.name {
                    self.write_io_tune(m, &IoTune::default())?;
                }
            }
            return Ok(());
        }
        if capped < members.len() {
            // Some disks held back, others free: a sum would free them all,
            // so each disk gets its own caps, out of the group, until all
            // are held back or none is.
            for (m, c) in members.iter().zip(&member_caps) {
                if self.joined.remove(m) {
                    self.write_io_tune(m, &IoTune::default())?;
                }
                self.write_io_tune(m, &IoTune::of_caps(c))?;
            }
            return Ok(());
        }
        let sum =
            |pick: fn(&Caps) -> Option<f64>| -> Option<f64> { member_caps.iter().map(pick).sum() };
        let total = Caps {
            read_iops: sum(|c| c.read_iops),
            write_iops: sum(|c| c.write_iops),
            read_bps: sum(|c| c.read_bps),
            write_bps: sum(|c| c.write_bps),
        };
        let mut tune = IoTune::of_caps(&total);
        tune.group_name = Some(group);
        // A disk joins the group when its limits are set with its name;
        // once all have, one write on any of them sets the group's values.
        let mut written = false;
        for m in &members {
            if !self.joined.contains(m) {
                self.write_io_tune(m, &tune)?;
                self.joined.insert(m.clone());
                written |= m == &tenant.name;
            }
        }
        if !written {
            self.write_io_tune(&tenant.name, &tune)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live XML of libvirt 9.0 (Debian 12), shortened.
    const XML: &str = r#"<domain type='qemu' id='3'>
  <name>web-1</name>
  <uuid>45d7044c-161a-47c0-adb9-42576888cba3</uuid>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='none' io='native'/>
      <source file='/var/lib/libvirt/images/a.img'/>
      <target dev='vda' bus='virtio'/>
      <iotune><total_iops_sec>200</total_iops_sec></iotune>
    </disk>
    <disk type='file' device='cdrom'>
      <target dev='sda' bus='sata'/>
    </disk>
    <disk type='file' device='disk'>
      <source file='/var/lib/libvirt/images/b.img'/>
      <target dev='vdb' bus='virtio'/>
    </disk>
  </devices>
</domain>"#;

    #[test]
    fn disks_come_from_the_domain_xml_without_cdroms() {
        assert_eq!(disk_targets(XML).unwrap(), ["vda", "vdb"]);
        assert!(disk_targets("<domain><devices>").is_err());
    }

    #[test]
    fn limits_read_back_and_written_as_libvirt_takes_them() {
        let params = vec![
            ("total_iops_sec".to_string(), ParamValue::Int(200)),
            ("read_bytes_sec".to_string(), ParamValue::Int(1_000_000)),
            (
                "group_name".to_string(),
                ParamValue::Text("/machine/peripheral/virtio-disk0/virtio-backend".into()),
            ),
        ];
        let t = IoTune::from_params(&params);
        assert_eq!(
            (t.total_iops_sec, t.read_bytes_sec, t.group_name),
            (200, 1_000_000, None)
        );
        let named = vec![("group_name".to_string(), ParamValue::Text("vm1".into()))];
        assert_eq!(
            IoTune::from_params(&named).group_name.as_deref(),
            Some("vm1")
        );

        let caps = Caps {
            read_iops: Some(199.2),
            write_iops: None,
            read_bps: None,
            write_bps: Some(2e6),
        };
        let t = IoTune::of_caps(&caps);
        assert_eq!(t.rates(), [0, 0, 2_000_000, 0, 200, 0]);
        assert_eq!(
            IoTune::of_caps(&Caps::NONE).rates(),
            [0; 6],
            "all zero: no limit"
        );
    }

    #[test]
    fn counters_and_latency_come_from_block_stats() {
        let stats: Vec<(String, ParamValue)> = [
            ("rd_operations", 120),
            ("wr_operations", 30),
            ("rd_bytes", 491520),
            ("wr_bytes", 1966080),
            ("rd_total_times", 60_000_000),
            ("wr_total_times", 90_000_000),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), ParamValue::Int(*v)))
        .collect();
        let c = counters_from_stats(&stats);
        assert_eq!(
            (c.read_ios, c.write_ios, c.read_bytes, c.write_bytes),
            (120, 30, 491520, 1966080)
        );
        assert_eq!(
            (c.latency_ns_total, c.completions),
            (Some(150_000_000), Some(150))
        );
    }

    /// Without a libvirtd at the URI, a call fails with a message naming
    /// it, and the tenant is unavailable, not idle.
    #[test]
    fn a_missing_daemon_is_an_unavailable_tenant() {
        let mut b = LibvirtBackend::new(
            "qemu+unix:///system?socket=/nonexistent/libvirt-sock",
            Duration::from_secs(5),
        )
        .unwrap();
        match b.domains() {
            Err(HostError::Unavailable(m)) | Err(HostError::Libvirt(m)) => {
                assert!(m.contains("/nonexistent") || m.contains("libvirt"), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }
}
