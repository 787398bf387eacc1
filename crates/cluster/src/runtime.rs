//! The agent's coordination task: it claims the host name under a lease,
//! keeps the lease alive, publishes the control thread's reports, reads this
//! host's allocation back into the [`Mailbox`], campaigns for the allocator
//! role and, while it holds it, allocates every interval under a fence.
//!
//! Failures, by design (docs/cluster.md): a lost lease (partition, pause)
//! drops the host's claim, candidacy and reports; the task grants a new one
//! and rejoins when etcd answers again. An allocator whose fenced write fails
//! has been replaced and steps down. Requests have a deadline, so a host cut
//! off from etcd notices within an interval and its control thread falls back
//! on its own (see [`crate::agent`]).

use crate::agent::Mailbox;
use crate::allocate::Allocator;
use crate::coord::{CoordError, Coordinator, Leadership, Lease};
use crate::view::ClusterView;
use crate::wire::{Allocation, FloorSetting, HostReport, WireError, SCHEMA};
use iofloor_core::admission::{self, AdmissionVerdict};
use iofloor_core::{CostModel, PolicyContext, PolicyKind, PolicyParams, Rate, TenantSpec, Usage};
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// Where a cluster's values live in etcd.
#[derive(Debug, Clone, PartialEq)]
pub struct Keys {
    root: String,
}

impl Keys {
    pub fn new(cluster: &str) -> Keys {
        Keys {
            root: format!("/iofloor/{cluster}/v1"),
        }
    }
    pub fn hosts(&self) -> String {
        format!("{}/hosts/", self.root)
    }
    pub fn host(&self, host: &str) -> String {
        format!("{}{host}", self.hosts())
    }
    pub fn reports(&self, device: &str) -> String {
        format!("{}/reports/{device}/", self.root)
    }
    pub fn report(&self, device: &str, host: &str) -> String {
        format!("{}{host}", self.reports(device))
    }
    pub fn allocations(&self, device: &str) -> String {
        format!("{}/allocations/{device}/", self.root)
    }
    pub fn allocation(&self, device: &str, host: &str) -> String {
        format!("{}{host}", self.allocations(device))
    }
    pub fn floors(&self, device: &str) -> String {
        format!("{}/floors/{device}/", self.root)
    }
    pub fn floor(&self, device: &str, tenant: &str) -> String {
        format!("{}{tenant}", self.floors(device))
    }
    pub fn election(&self, device: &str) -> String {
        format!("{}/allocator/{device}", self.root)
    }
}

/// What the agent needs to know about its cluster.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    pub cluster: String,
    pub host: String,
    /// The shared device's cluster-wide name.
    pub device: String,
    pub interval: Duration,
    pub lease_ttl: Duration,
    /// How long the allocator counts a host that stopped reporting with its
    /// caps in force at its last load (`None`: until it reports again or
    /// its allocation is removed).
    pub orphan_timeout: Option<Duration>,
    /// The allocator's policy, the same as a single host's.
    pub policy: PolicyKind,
    pub params: PolicyParams,
    pub ctx: PolicyContext,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Allocator,
    Agent,
}

/// The agent as the view, the metrics and `iofloor top --cluster` show it.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    pub cluster: String,
    pub host: String,
    pub device: String,
    pub role: Role,
    /// The allocator's host name, as the election says.
    pub allocator: Option<String>,
    /// Whether etcd answered this interval.
    pub connected: bool,
    pub hosts: Vec<String>,
    pub epoch: Option<i64>,
    /// Tenant names two hosts report with different promises.
    pub conflicts: Vec<String>,
    /// On the allocator: hosts that stopped reporting with their caps in
    /// force, whose last load it counts as load it cannot cap.
    pub ghosts: Vec<String>,
    /// Times this agent has become allocator, and lost its lease.
    pub terms: u64,
    pub leases_lost: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("etcd: {0}")]
    Etcd(#[from] CoordError),
    #[error("host name `{host}` is held by another running agent ({holder}); give each host its own `cluster.host`")]
    HostTaken { host: String, holder: String },
}

/// The running task; [`AgentHandle::stop`] leaves the cluster cleanly
/// (revokes the lease: claim, candidacy and reports go at once).
pub struct AgentHandle {
    stop: tokio::sync::watch::Sender<bool>,
    task: JoinHandle<()>,
    pub status: Arc<Mutex<ClusterStatus>>,
}

impl AgentHandle {
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }

    /// Ends the task without a word to etcd, as a killed process would:
    /// the lease runs out on its own.
    pub fn abort(self) {
        self.task.abort();
    }
}

fn claim_value(host: &str) -> Vec<u8> {
    serde_json::json!({ "host": host, "pid": std::process::id() })
        .to_string()
        .into_bytes()
}

/// Grants a lease and claims the host name under it. A name held by a
/// previous run of this host (killed, its lease not yet expired) is waited
/// for up to one lease TTL; one still held after that belongs to another
/// running agent, and is refused.
async fn join<C: Coordinator>(
    coord: &mut C,
    keys: &Keys,
    settings: &AgentSettings,
) -> Result<Lease, ClusterError> {
    let lease = coord.grant_lease(settings.lease_ttl).await?;
    let deadline = Instant::now() + settings.lease_ttl + Duration::from_secs(1);
    loop {
        match coord
            .create(
                &keys.host(&settings.host),
                claim_value(&settings.host),
                lease,
            )
            .await?
        {
            None => return Ok(lease),
            Some(holder) if Instant::now() >= deadline => {
                let _ = coord.revoke(lease).await;
                return Err(ClusterError::HostTaken {
                    host: settings.host.clone(),
                    holder: String::from_utf8_lossy(&holder).into_owned(),
                });
            }
            Some(_) => {
                coord.keep_alive(lease).await?;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

/// Reads the whole cluster from etcd on demand (the API's
/// `/api/v1/cluster`), apart from the agent's task: a view asked for now and
/// then costs the agent's interval nothing.
#[derive(Clone)]
pub struct ClusterReader<C: Coordinator> {
    coord: C,
    keys: Keys,
    cluster: String,
    device: String,
    cost: CostModel,
    target_utilisation: f64,
}

/// Floors set for the whole cluster, by tenant (`None`: no floor).
pub type ClusterFloors = BTreeMap<String, Option<Rate>>;

/// The cluster's floors under `prefix`, by tenant, and the keys that were
/// left out with why (garbage, a future schema, a value naming another
/// tenant than its key).
pub fn decode_floors(
    prefix: &str,
    kvs: Vec<(String, Vec<u8>)>,
) -> (ClusterFloors, Vec<(String, String)>) {
    let mut floors = BTreeMap::new();
    let mut refused = Vec::new();
    for (key, bytes) in kvs {
        match FloorSetting::decode(&bytes) {
            Ok(f) if key.strip_prefix(prefix) == Some(f.tenant.as_str()) => {
                floors.insert(f.tenant, f.floor);
            }
            Ok(f) => refused.push((key, format!("names tenant `{}`", f.tenant))),
            Err(e) => refused.push((key, e.to_string())),
        }
    }
    (floors, refused)
}

/// The admission verdict over every host's reported tenants, with the
/// cluster's `floors` in force and `change`, if any, applied. Tenants are
/// named `host/name`, as the allocator names them.
pub fn cluster_admission(
    cost: &CostModel,
    usable_capacity: f64,
    reports: &[HostReport],
    floors: &ClusterFloors,
    change: Option<(&str, Option<Rate>)>,
) -> AdmissionVerdict {
    let specs: Vec<(TenantSpec, Option<Usage>)> = reports
        .iter()
        .flat_map(|r| {
            r.tenants.iter().map(|t| {
                let mut spec = t.spec.clone();
                if let Some(floor) = floors.get(&spec.name) {
                    spec.floor = *floor;
                }
                if let Some((_, floor)) = change.filter(|(name, _)| *name == spec.name) {
                    spec.floor = floor;
                }
                spec.name = format!("{}/{}", r.host, spec.name);
                let mix = t.usage.filter(|u| !u.is_idle());
                (spec, Some(mix.unwrap_or_else(admission::assumed_mix)))
            })
        })
        .collect();
    let rows: Vec<(&TenantSpec, Option<Usage>)> = specs.iter().map(|(s, u)| (s, *u)).collect();
    admission::check(cost, usable_capacity, &rows)
}

impl<C: Coordinator> ClusterReader<C> {
    pub fn new(coord: C, settings: &AgentSettings) -> ClusterReader<C> {
        ClusterReader {
            coord,
            keys: Keys::new(&settings.cluster),
            cluster: settings.cluster.clone(),
            device: settings.device.clone(),
            cost: settings.ctx.cost,
            target_utilisation: settings.params.floor.target_utilisation,
        }
    }

    /// The shared device's cluster-wide name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Every live host's report of this device (undecodable ones left out).
    async fn reports(&self) -> Result<Vec<HostReport>, CoordError> {
        let mut coord = self.coord.clone();
        let kvs = coord.get_prefix(&self.keys.reports(&self.device)).await?;
        Ok(kvs
            .iter()
            .filter_map(|(_, v)| HostReport::decode(v).ok())
            .collect())
    }

    /// The allocations of this device (undecodable ones left out).
    async fn allocations(&self) -> Result<Vec<Allocation>, CoordError> {
        let mut coord = self.coord.clone();
        let kvs = coord
            .get_prefix(&self.keys.allocations(&self.device))
            .await?;
        Ok(kvs
            .iter()
            .filter_map(|(_, v)| Allocation::decode(v).ok())
            .collect())
    }

    /// The floors set for the whole cluster, by tenant (values the agents
    /// refuse and log are left out here too).
    pub async fn floors(&self) -> Result<ClusterFloors, CoordError> {
        let mut coord = self.coord.clone();
        let prefix = self.keys.floors(&self.device);
        let kvs = coord.get_prefix(&prefix).await?;
        Ok(decode_floors(&prefix, kvs).0)
    }

    /// Admission control across hosts for setting `tenant`'s cluster floor
    /// to `floor`: the verdicts as things are and with the change, from one
    /// read of etcd. Every reported tenant's floor (the cluster's where set)
    /// is priced with the model and its last mix, against the target share
    /// of the learned capacity (the newest allocation's; a learned capacity
    /// above the model's does not raise what can be promised, as on one
    /// host). A tenant on several hosts counts once per host: each is
    /// promised its floor.
    pub async fn floor_admission(
        &self,
        tenant: &str,
        floor: Option<Rate>,
    ) -> Result<(AdmissionVerdict, AdmissionVerdict), CoordError> {
        let reports = self.reports().await?;
        let floors = self.floors().await?;
        let capacity = self
            .allocations()
            .await?
            .into_iter()
            .max_by_key(|a| (a.epoch, a.seq))
            .map(|a| a.capacity)
            .unwrap_or(1.0);
        let usable = self.target_utilisation * capacity.min(1.0);
        let verdict = |change| cluster_admission(&self.cost, usable, &reports, &floors, change);
        Ok((verdict(None), verdict(Some((tenant, floor)))))
    }

    /// Sets (`Some`) or removes (`None`: the host files' floors again) the
    /// cluster's floor of `tenant`.
    pub async fn set_floor(
        &self,
        tenant: &str,
        setting: Option<Option<Rate>>,
    ) -> Result<(), CoordError> {
        let mut coord = self.coord.clone();
        let key = self.keys.floor(&self.device, tenant);
        match setting {
            Some(floor) => {
                let value = FloorSetting {
                    schema: SCHEMA,
                    tenant: tenant.to_string(),
                    floor,
                };
                coord.put(&key, value.encode(), None).await
            }
            None => coord.delete(&key).await,
        }
    }

    /// Every live host's report and the allocations of this device; values
    /// that do not decode are left out (the agents log them).
    pub async fn read(&self) -> Result<ClusterView, CoordError> {
        let reports = self.reports().await?;
        let allocations = self.allocations().await?;
        let allocator = self
            .coord
            .clone()
            .leader(&self.keys.election(&self.device))
            .await?
            .map(|v| String::from_utf8_lossy(&v).into_owned());
        Ok(ClusterView::build(
            &self.cluster,
            &self.device,
            allocator,
            &reports,
            &allocations,
        ))
    }
}

/// Joins the cluster and starts the coordination task. Errors (etcd
/// unreachable, host name taken) come back before anything runs.
pub async fn start<C: Coordinator>(
    mut coord: C,
    settings: AgentSettings,
    mailbox: Arc<Mutex<Mailbox>>,
) -> Result<AgentHandle, ClusterError> {
    let keys = Keys::new(&settings.cluster);
    let lease = join(&mut coord, &keys, &settings).await?;
    info!(host = %settings.host, cluster = %settings.cluster, lease, "joined the cluster");
    let status = Arc::new(Mutex::new(ClusterStatus {
        cluster: settings.cluster.clone(),
        host: settings.host.clone(),
        device: settings.device.clone(),
        role: Role::Agent,
        allocator: None,
        connected: true,
        hosts: Vec::new(),
        epoch: None,
        conflicts: Vec::new(),
        ghosts: Vec::new(),
        terms: 0,
        leases_lost: 0,
    }));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let agent = Agent {
        coord,
        keys,
        settings,
        mailbox,
        status: status.clone(),
        lease: Some(lease),
        campaign: None,
        leading: None,
        last_allocation: None,
        warned: HashSet::new(),
        started: Instant::now(),
    };
    let task = tokio::spawn(agent.run(stopped));
    Ok(AgentHandle { stop, task, status })
}

struct Agent<C: Coordinator> {
    coord: C,
    keys: Keys,
    settings: AgentSettings,
    mailbox: Arc<Mutex<Mailbox>>,
    status: Arc<Mutex<ClusterStatus>>,
    lease: Option<Lease>,
    campaign: Option<(JoinHandle<()>, tokio::sync::oneshot::Receiver<Leadership>)>,
    leading: Option<(Leadership, Allocator)>,
    /// The last allocation this host read, whose learned capacity a new
    /// allocator starts from.
    last_allocation: Option<Allocation>,
    /// Keys whose garbage was already logged (once each).
    warned: HashSet<String>,
    started: Instant,
}

impl<C: Coordinator> Agent<C> {
    async fn run(mut self, mut stopped: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut renew = tokio::time::interval(self.settings.lease_ttl / 3);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.start_campaign();
        loop {
            tokio::select! {
                _ = stopped.changed() => break,
                _ = renew.tick() => self.renew().await,
                _ = tick.tick() => self.interval().await,
            }
        }
        if let Some((task, _)) = self.campaign.take() {
            task.abort();
        }
        if let Some(lease) = self.lease {
            match self.coord.revoke(lease).await {
                Ok(()) => info!(host = %self.settings.host, "left the cluster"),
                Err(e) => warn!("leaving the cluster: {e}; the lease expires on its own"),
            }
        }
        // The daemon lifts its caps as it stops: its allocation (after the
        // report, so no round answers it again) would make the allocator
        // count this host's last load as a ghost's.
        let key = self
            .keys
            .allocation(&self.settings.device, &self.settings.host);
        if let Err(e) = self.coord.delete(&key).await {
            warn!(
                "leaving the cluster: {e}; the allocator counts this host's last load {}",
                counted_for(self.settings.orphan_timeout)
            );
        }
    }

    fn start_campaign(&mut self) {
        let Some(lease) = self.lease else { return };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut coord = self.coord.clone();
        let election = self.keys.election(&self.settings.device);
        let host = self.settings.host.clone().into_bytes();
        let task = tokio::spawn(async move {
            loop {
                match coord.campaign(&election, host.clone(), lease).await {
                    Ok(l) => {
                        let _ = tx.send(l);
                        return;
                    }
                    // etcd away: try again; the lease decides whether we may.
                    Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                }
            }
        });
        self.campaign = Some((task, rx));
    }

    fn lost_lease(&mut self, why: &str) {
        warn!(host = %self.settings.host, "lost the cluster lease ({why}): claim, candidacy and reports are gone; rejoining when etcd answers");
        self.lease = None;
        self.leading = None;
        if let Some((task, _)) = self.campaign.take() {
            task.abort();
        }
        let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
        s.leases_lost += 1;
        s.role = Role::Agent;
        s.epoch = None;
        s.ghosts.clear();
    }

    async fn renew(&mut self) {
        let Some(lease) = self.lease else { return };
        match self.coord.keep_alive(lease).await {
            Ok(()) => {}
            Err(CoordError::LeaseExpired) => self.lost_lease("expired"),
            Err(e) => {
                self.set_connected(false);
                tracing::debug!("renewing the lease: {e}");
            }
        }
    }

    fn set_connected(&self, connected: bool) {
        let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
        if s.connected != connected {
            if connected {
                info!("etcd answers again");
            } else {
                warn!("etcd does not answer; this host keeps its last allocation while it is fresh, then its fallback rule");
            }
        }
        s.connected = connected;
    }

    async fn interval(&mut self) {
        let result = self.exchange().await;
        if result == Err(CoordError::LeaseExpired) {
            self.lost_lease("a write under it was refused");
        }
        self.set_connected(!matches!(result, Err(CoordError::Unavailable(_))));
        if let Err(e) = result {
            tracing::debug!("cluster interval: {e}");
        }
    }

    async fn exchange(&mut self) -> Result<(), CoordError> {
        if self.lease.is_none() {
            match join(&mut self.coord, &self.keys, &self.settings).await {
                Ok(lease) => {
                    info!(host = %self.settings.host, "rejoined the cluster");
                    self.lease = Some(lease);
                    self.start_campaign();
                }
                Err(ClusterError::Etcd(e)) => return Err(e),
                Err(e) => {
                    warn!("{e}");
                    return Ok(());
                }
            }
        }
        let lease = self.lease;
        let outgoing = self
            .mailbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .outgoing
            .take();
        if let Some(report) = outgoing {
            let key = self.keys.report(&self.settings.device, &self.settings.host);
            self.coord.put(&key, report.encode(), lease).await?;
        }
        let hosts: Vec<String> = self
            .coord
            .get_prefix(&self.keys.hosts())
            .await?
            .into_iter()
            .filter_map(|(k, _)| k.strip_prefix(&self.keys.hosts()).map(str::to_string))
            .collect();
        let key = self
            .keys
            .allocation(&self.settings.device, &self.settings.host);
        let incoming = match self.coord.get(&key).await? {
            Some(bytes) => match Allocation::decode(&bytes) {
                Ok(a) => Some(a),
                Err(e) => {
                    self.warn_once(&key, &e.to_string());
                    None
                }
            },
            None => None,
        };
        if let Some(a) = &incoming {
            self.last_allocation = Some(a.clone());
        }
        let floors_prefix = self.keys.floors(&self.settings.device);
        let kvs = self.coord.get_prefix(&floors_prefix).await?;
        let (floors, refused) = decode_floors(&floors_prefix, kvs);
        for (key, why) in refused {
            self.warn_once(&key, &why);
        }
        {
            let mut m = self.mailbox.lock().unwrap_or_else(|e| e.into_inner());
            m.hosts_seen = hosts.len();
            if incoming.is_some() {
                m.incoming = incoming;
            }
            if m.floors != floors {
                info!(host = %self.settings.host, floors = ?floors, "cluster floors changed in etcd");
                m.floors = floors;
                m.floors_version += 1;
            }
        }
        self.take_leadership();
        self.allocate().await?;
        let allocator = self
            .coord
            .leader(&self.keys.election(&self.settings.device))
            .await?
            .map(|v| String::from_utf8_lossy(&v).into_owned());
        let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
        s.hosts = hosts;
        s.allocator = allocator;
        Ok(())
    }

    /// A campaign that was won makes this agent the allocator, starting from
    /// the capacity the last allocation carried.
    fn take_leadership(&mut self) {
        let Some((_, rx)) = &mut self.campaign else {
            return;
        };
        let Ok(leadership) = rx.try_recv() else {
            return;
        };
        self.campaign = None;
        info!(host = %self.settings.host, epoch = leadership.epoch, "this host is the allocator");
        let allocator = Allocator::new(
            self.settings.device.clone(),
            self.settings.policy,
            &self.settings.params,
            self.settings.ctx,
            self.last_allocation.as_ref().map(|a| a.capacity),
            leadership.epoch,
        )
        .with_orphan_timeout(self.settings.orphan_timeout);
        let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
        s.role = Role::Allocator;
        s.epoch = Some(leadership.epoch);
        s.terms += 1;
        drop(s);
        self.leading = Some((leadership, allocator));
    }

    async fn allocate(&mut self) -> Result<(), CoordError> {
        if self.leading.is_none() {
            return Ok(());
        }
        let reports = self
            .read_by_host(
                &self.keys.reports(&self.settings.device),
                HostReport::decode,
                |r| &r.host,
            )
            .await?;
        let standing = self
            .read_by_host(
                &self.keys.allocations(&self.settings.device),
                Allocation::decode,
                |a| &a.host,
            )
            .await?;
        let now = self.started.elapsed();
        let Some((leadership, allocator)) = &mut self.leading else {
            return Ok(());
        };
        let round = allocator.allocate(now, &reports, &standing);
        let ghosts: Vec<String> = round.ghosts.iter().map(|g| g.host.clone()).collect();
        let counted = self
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ghosts
            .clone();
        for g in round.ghosts.iter().filter(|g| !counted.contains(&g.host)) {
            warn!(host = %g.host, load = g.load, "host stopped reporting with its caps in force: its tenants' last load is reserved as load the cluster cannot cap, {}", counted_for(self.settings.orphan_timeout));
        }
        for host in counted.iter().filter(|h| !ghosts.contains(h)) {
            info!(%host, "no longer counting a quiet host's last load (it reports again, it left, or its time is up)");
        }
        let conflicts: Vec<String> = round.conflicts.iter().map(|c| c.tenant.clone()).collect();
        for c in &round.conflicts {
            let key = format!("conflict/{}", c.tenant);
            let message = format!(
                "tenant `{}` has different promises on hosts {:?}: each host's tenant keeps its own floor, so the floor is granted more than once",
                c.tenant, c.hosts
            );
            if self.warned.insert(key) {
                warn!("{message}");
            }
        }
        let kvs = round
            .allocations
            .iter()
            .map(|a| (self.keys.allocation(&a.device, &a.host), a.encode()))
            .collect();
        let leadership = leadership.clone();
        let held = self.coord.put_fenced(&leadership, kvs).await?;
        {
            let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
            s.conflicts = conflicts;
            s.ghosts = ghosts;
        }
        if !held {
            warn!(host = %self.settings.host, epoch = leadership.epoch, "another agent is the allocator now; stepping down");
            self.leading = None;
            {
                let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
                s.role = Role::Agent;
                s.ghosts.clear();
            }
            self.start_campaign();
        }
        Ok(())
    }

    /// The values under `prefix` that decode and sit under the name of the
    /// host they are about; any other is ignored with one warning.
    async fn read_by_host<T>(
        &mut self,
        prefix: &str,
        decode: fn(&[u8]) -> Result<T, WireError>,
        host_of: fn(&T) -> &str,
    ) -> Result<Vec<T>, CoordError> {
        let mut values = Vec::new();
        for (key, bytes) in self.coord.get_prefix(prefix).await? {
            match decode(&bytes) {
                Ok(v) if key.strip_prefix(prefix) == Some(host_of(&v)) => values.push(v),
                Ok(v) => self.warn_once(&key, &format!("claims host `{}`", host_of(&v))),
                Err(e) => self.warn_once(&key, &e.to_string()),
            }
        }
        Ok(values)
    }

    fn warn_once(&mut self, key: &str, message: &str) {
        if self.warned.insert(key.to_string()) {
            warn!(key, "ignoring a value in etcd: {message}");
        }
    }
}

/// For how long a quiet host's last load is counted, for the logs.
fn counted_for(orphan_timeout: Option<Duration>) -> String {
    match orphan_timeout {
        Some(timeout) => format!("for up to {} s (orphan_timeout)", timeout.as_secs()),
        None => "until it reports again or its allocation is removed".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::TenantReport;
    use iofloor_core::{Caps, TenantClass};

    fn report(host: &str, tenants: &[(&str, Option<f64>)]) -> HostReport {
        HostReport {
            schema: SCHEMA,
            host: host.into(),
            device: "shared".into(),
            seq: 1,
            interval_s: 1.0,
            local_device: None,
            tenants: tenants
                .iter()
                .map(|(name, floor)| {
                    let mut spec = TenantSpec::new(*name, TenantClass::Container);
                    spec.floor = floor.map(Rate::Iops);
                    TenantReport {
                        spec,
                        usage: Some(iofloor_core::synthetic::random_reads_4k(100.0)),
                        caps: Caps::NONE,
                    }
                })
                .collect(),
        }
    }

    #[test]
    fn admission_across_hosts_counts_every_hosts_floors_with_the_clusters() {
        let cost = iofloor_core::synthetic::iops_only_model(4000.0);
        let reports = [
            report("h1", &[("db", Some(1000.0))]),
            report("h2", &[("web", None), ("db", Some(1000.0))]),
        ];
        let none = BTreeMap::new();
        // 2 × 1,000 + 1,500 of 4,000 × 0.9 usable.
        let v = cluster_admission(
            &cost,
            0.9,
            &reports,
            &none,
            Some(("web", Some(Rate::Iops(1500.0)))),
        );
        assert!(v.admitted, "{}", v.summary());
        assert!((v.total_floor_cost - 0.875).abs() < 1e-9);
        let names: Vec<&str> = v.tenants.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["h1/db", "h2/web", "h2/db"]);
        // The cluster's floor of `db` (2,000 on each host) leaves no room.
        let floors = BTreeMap::from([("db".to_string(), Some(Rate::Iops(2000.0)))]);
        let v = cluster_admission(
            &cost,
            0.9,
            &reports,
            &floors,
            Some(("web", Some(Rate::Iops(1500.0)))),
        );
        assert!(!v.admitted);
        assert_eq!(v.refused(), ["h2/db"], "{}", v.summary());
        // A cluster floor of `none` frees what the files promised.
        let floors = BTreeMap::from([("db".to_string(), None)]);
        let v = cluster_admission(
            &cost,
            0.9,
            &reports,
            &floors,
            Some(("web", Some(Rate::Iops(3500.0)))),
        );
        assert!(v.admitted, "{}", v.summary());
    }
}
