//! The agents of one `iofloor bench --cluster` run: `iofloor run` on every
//! host of the cluster bed, in the host's network namespace, with a config
//! written from the scenario (joined as a cluster on the bed's etcd, or each
//! host alone); started once the tenants' cgroups exist, told the
//! scenario's host events and capacity changes, stopped with their limits
//! put back.

use crate::session::Session;
use crate::{BenchError, Result};
use iofloor_core::policy::PolicyKind;
use iofloor_core::units::Rate;
use iofloor_host::cgroup::DevId;
use iofloor_scenario::format::ClusterEventKind;
use iofloor_scenario::Scenario;
use iofloor_testbed::cluster::ClusterBed;
use iofloor_testbed::rig::RigSpec;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The port every agent's API listens on, at its host's address.
const AGENT_PORT: u16 = 9180;
/// How long agents get to start, reach etcd and (as a cluster) receive a
/// first allocation before the run is given up.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How long an agent gets to put its limits back after SIGTERM.
const STOP_WITHIN: Duration = Duration::from_secs(20);

/// The agents one run starts: which policy, as a cluster or each host alone.
pub(crate) struct AgentPlan<'a> {
    pub(crate) bed: &'a ClusterBed,
    pub(crate) agent: &'a Path,
    pub(crate) cgroup_root: &'a Path,
    pub(crate) kind: PolicyKind,
    pub(crate) as_cluster: bool,
    pub(crate) hosts: &'a [String],
    pub(crate) devices: &'a [(PathBuf, DevId)],
    pub(crate) tenant_host: Vec<usize>,
    /// The cluster's name in etcd: one per run, so nothing of an earlier
    /// run (allocations are not leased) is read as this one's.
    pub(crate) cluster_name: String,
}

impl AgentPlan<'_> {
    /// Writes each host's config and starts its agent (the tenants'
    /// cgroups exist by now); returns once every agent has adopted its
    /// tenants and, as a cluster, applies an allocation.
    pub(crate) fn start(
        self,
        scenario: &Scenario,
        session: &Session,
        work: &Path,
    ) -> Result<Agents> {
        let dir = work.join("agents");
        std::fs::create_dir_all(&dir).map_err(|source| BenchError::Io {
            path: dir.clone(),
            source,
        })?;
        let mut agents = Agents {
            agents: Vec::new(),
            bed: self.bed.clone(),
            events: scenario
                .cluster
                .as_ref()
                .map(|c| c.events.clone())
                .unwrap_or_default(),
            next_event: 0,
            original_spec: None,
        };
        for (h, name) in self.hosts.iter().enumerate() {
            let bed_host = &self.bed.hosts[h];
            let config = self.config(scenario, session, h, &dir)?;
            let config_path = dir.join(format!("{name}.toml"));
            let log_path = dir.join(format!("{name}.log"));
            write(&config_path, &config)?;
            let log = std::fs::File::create(&log_path).map_err(|source| BenchError::Io {
                path: log_path.clone(),
                source,
            })?;
            let err_log = log.try_clone().map_err(|source| BenchError::Io {
                path: log_path.clone(),
                source,
            })?;
            // nsenter execs the agent: the child's PID is the agent's, so it
            // is signalled by its own PID. The machine's mount namespace is
            // kept (cgroups and the loop device are where the bench sees them).
            let child = Command::new("nsenter")
                .arg(format!("--net=/run/netns/{}", bed_host.netns))
                .arg(self.agent)
                .arg("run")
                .arg("--config")
                .arg(&config_path)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(err_log)
                .spawn()
                .map_err(|e| BenchError::Failed(format!("starting the agent of {name}: {e}")))?;
            agents.agents.push(Agent {
                host: name.clone(),
                bed_host: bed_host.name.clone(),
                child,
                killed: false,
                log: log_path,
                url: format!("http://{}:{AGENT_PORT}", bed_host.ip),
                tenants: self.tenant_host.iter().filter(|&&t| t == h).count(),
            });
        }
        agents.wait_ready(self.as_cluster)?;
        Ok(agents)
    }

    /// Host `h`'s config: the scenario's interval, policy and model, the
    /// host's device and tenants, and as a cluster the bed's etcd.
    fn config(
        &self,
        scenario: &Scenario,
        session: &Session,
        h: usize,
        dir: &Path,
    ) -> Result<String> {
        use toml::Value;
        let text = |s: String| Value::String(s);
        let duration = |d: Duration| text(format!("{}ms", d.as_millis().max(1)));
        let mut policy = table_of("policy", &scenario.policy)?;
        policy.insert("kind".into(), text(self.kind.as_str().into()));
        let mut device = toml::Table::new();
        device.insert("name".into(), text("shared".into()));
        device.insert("path".into(), text(self.devices[h].0.display().to_string()));
        device.insert(
            "model".into(),
            Value::Table(table_of("the cost model", scenario.policy_model.params())?),
        );
        let bed_host = &self.bed.hosts[h];
        let mut api = toml::Table::new();
        api.insert(
            "listen".into(),
            text(format!("{}:{AGENT_PORT}", bed_host.ip)),
        );
        let tenants: Vec<Value> = scenario
            .tenants
            .iter()
            .enumerate()
            .filter(|(i, _)| self.tenant_host[*i] == h)
            .map(|(i, t)| tenant_entry(&t.spec, session.tenant_cgroup(i)))
            .collect();
        let mut file = toml::Table::new();
        file.insert("interval".into(), duration(scenario.interval));
        file.insert(
            "state_file".into(),
            text(
                dir.join(format!("{}.state.json", self.hosts[h]))
                    .display()
                    .to_string(),
            ),
        );
        file.insert(
            "cgroup_root".into(),
            text(self.cgroup_root.display().to_string()),
        );
        file.insert("api".into(), Value::Table(api));
        file.insert("policy".into(), Value::Table(policy));
        file.insert("device".into(), Value::Array(vec![Value::Table(device)]));
        file.insert("tenant".into(), Value::Array(tenants));
        if let (true, Some(c)) = (self.as_cluster, &scenario.cluster) {
            let mut cluster = toml::Table::new();
            cluster.insert(
                "endpoints".into(),
                Value::Array(self.bed.endpoints().into_iter().map(text).collect()),
            );
            cluster.insert("name".into(), text(self.cluster_name.clone()));
            cluster.insert("host".into(), text(self.hosts[h].clone()));
            cluster.insert("shared_device".into(), text("shared".into()));
            cluster.insert("lease_ttl".into(), duration(c.lease_ttl));
            cluster.insert("stale_after".into(), duration(c.stale_after));
            file.insert("cluster".into(), Value::Table(cluster));
        }
        toml::to_string(&file)
            .map_err(|e| BenchError::Failed(format!("writing the agents' config: {e}")))
    }
}

/// A tenant's `[[tenant]]` entry in an agent's config: the scenario's spec,
/// found by its cgroup.
fn tenant_entry(s: &iofloor_core::TenantSpec, cgroup: &Path) -> toml::Value {
    use toml::Value;
    let text = |s: String| Value::String(s);
    let mut e = toml::Table::new();
    e.insert("name".into(), text(s.name.clone()));
    e.insert("cgroup".into(), text(cgroup.display().to_string()));
    e.insert("class".into(), text(s.class.as_str().into()));
    if let Some(f) = s.floor {
        e.insert("floor".into(), text(rate_text(f)));
    }
    if let Some(c) = s.ceiling {
        e.insert("ceiling".into(), text(rate_text(c)));
    }
    e.insert("weight".into(), Value::Float(s.weight));
    e.insert(
        "latency_sensitive".into(),
        Value::Boolean(s.latency_sensitive),
    );
    Value::Table(e)
}

/// A value as a TOML table (the scenario's policy parameters and model are
/// written into the agents' configs as the config file takes them).
fn table_of<T: serde::Serialize>(what: &str, value: &T) -> Result<toml::Table> {
    match toml::Value::try_from(value) {
        Ok(toml::Value::Table(t)) => Ok(t),
        Ok(_) => Err(BenchError::Failed(format!("{what}: not a table"))),
        Err(e) => Err(BenchError::Failed(format!("{what} as TOML: {e}"))),
    }
}

/// A rate as the config reads it back exactly (Rust prints the shortest
/// text that parses to the same f64).
fn rate_text(rate: Rate) -> String {
    match rate {
        Rate::Iops(v) => format!("{v}iops"),
        Rate::BytesPerSec(v) => format!("{v}B/s"),
        Rate::Cost(v) => format!("{v}cost"),
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| BenchError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// One host's agent.
struct Agent {
    /// The scenario's name of the host (the agent's `[cluster] host`).
    host: String,
    /// The bed's name of the host (`h0`, ...), for partition and heal.
    bed_host: String,
    child: Child,
    /// Killed by a `kill` event: its end is expected.
    killed: bool,
    log: PathBuf,
    url: String,
    tenants: usize,
}

impl Agent {
    /// The end of its log, for an error message.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(8)..].join("\n")
    }

    fn signal(&self, sig: rustix::process::Signal) {
        crate::session::signal(self.child.id(), sig);
    }

    /// Whether it still runs (reaps it if not).
    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, then SIGKILL if it has not ended within `within`; its exit
    /// status, `None` if it had to be killed.
    fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        self.signal(rustix::process::Signal::TERM);
        let until = Instant::now() + within;
        while Instant::now() < until {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }
}

/// The agents of one run, and what they changed on the bed. Dropping them
/// (an error, Ctrl-C) stops every agent, reconnects a cut-off host and puts
/// the device's capacity back.
pub(crate) struct Agents {
    agents: Vec<Agent>,
    bed: ClusterBed,
    /// (time, scenario host, what), in time order.
    events: Vec<(Duration, usize, ClusterEventKind)>,
    next_event: usize,
    /// The capacity to put back once a `device.change` has been played.
    original_spec: Option<RigSpec>,
}

impl Agents {
    /// Waits until every agent answers with all its tenants adopted and,
    /// as a cluster, applies an allocation.
    fn wait_ready(&mut self, as_cluster: bool) -> Result<()> {
        let http: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(2)))
            .build()
            .into();
        let get = |url: &str| -> Option<serde_json::Value> {
            http.get(url).call().ok()?.body_mut().read_json().ok()
        };
        let until = Instant::now() + READY_WITHIN;
        for a in &mut self.agents {
            loop {
                if !a.running() {
                    return Err(BenchError::Failed(format!(
                        "the agent of {} ended at start:\n{}",
                        a.host,
                        a.log_tail()
                    )));
                }
                let adopted = get(&format!("{}/api/v1/tenants", a.url)).is_some_and(|v| {
                    v["tenants"]
                        .as_array()
                        .is_some_and(|t| t.len() >= a.tenants)
                });
                let allocated = !as_cluster
                    || get(&format!("{}/api/v1/status", a.url))
                        .is_some_and(|v| v["cluster"]["mode"] == "allocated");
                if adopted && allocated {
                    break;
                }
                if Instant::now() > until {
                    return Err(BenchError::Failed(format!(
                        "the agent of {} was not ready within {} s (tenants adopted: {adopted}, allocation applied: {allocated}):\n{}",
                        a.host,
                        READY_WITHIN.as_secs(),
                        a.log_tail()
                    )));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(())
    }

    /// When the next host event is due.
    pub(crate) fn next_event(&self) -> Option<Duration> {
        self.events.get(self.next_event).map(|e| e.0)
    }

    /// Plays the host events due by `now`.
    pub(crate) fn play_events(&mut self, now: Duration) -> Result<()> {
        while let Some(&(at, host, kind)) = self.events.get(self.next_event) {
            if at > now {
                break;
            }
            let agent = &mut self.agents[host];
            match kind {
                ClusterEventKind::Kill => {
                    agent.killed = true;
                    agent.signal(rustix::process::Signal::KILL);
                }
                ClusterEventKind::Partition => self.bed.partition(&agent.bed_host)?,
                ClusterEventKind::Heal => self.bed.heal(&agent.bed_host)?,
            }
            self.next_event += 1;
        }
        Ok(())
    }

    /// A message if an agent ended that no event killed.
    pub(crate) fn check(&mut self) -> Result<Option<String>> {
        for a in &mut self.agents {
            if !a.killed && !a.running() {
                return Ok(Some(format!(
                    "the agent of {} ended during the run:\n{}",
                    a.host,
                    a.log_tail()
                )));
            }
        }
        Ok(None)
    }

    /// Scales the shared device's capacity (the storage node's throttle
    /// group), as a scenario's `device.change` says; put back at the end.
    pub(crate) fn change_capacity(&mut self, factor: f64) -> Result<()> {
        let original = *self.original_spec.get_or_insert(self.bed.spec);
        Ok(self.bed.change_capacity(original.scaled(factor))?)
    }

    /// Stops every agent with SIGTERM (each puts back the limits it set);
    /// an agent that fails to is an error.
    pub(crate) fn stop(mut self) -> Result<()> {
        let mut failed = Vec::new();
        for a in &mut self.agents {
            if a.killed {
                let _ = a.child.wait();
                continue;
            }
            match a.terminate(STOP_WITHIN) {
                Some(status) if status.success() => {}
                Some(status) => failed.push(format!("{} ({status}):\n{}", a.host, a.log_tail())),
                None => failed.push(format!(
                    "{} (still running {} s after SIGTERM, killed):\n{}",
                    a.host,
                    STOP_WITHIN.as_secs(),
                    a.log_tail()
                )),
            }
        }
        self.restore_bed()?;
        match failed.is_empty() {
            true => Ok(()),
            false => Err(BenchError::Failed(format!(
                "agents that did not stop cleanly: {}",
                failed.join("\n")
            ))),
        }
    }

    /// Reconnects cut-off hosts and puts the device's capacity back.
    fn restore_bed(&mut self) -> Result<()> {
        for a in &self.agents {
            if self
                .bed
                .hosts
                .iter()
                .any(|h| h.name == a.bed_host && h.partitioned)
            {
                self.bed.heal(&a.bed_host)?;
            }
        }
        if let Some(spec) = self.original_spec.take() {
            self.bed.change_capacity(spec)?;
        }
        Ok(())
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        for a in &mut self.agents {
            a.terminate(STOP_WITHIN);
        }
        if let Err(e) = self.restore_bed() {
            eprintln!("warning: putting the cluster bed back: {e}");
        }
    }
}
