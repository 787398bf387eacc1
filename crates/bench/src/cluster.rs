//! `iofloor bench --cluster`: a cluster scenario with real fio on the test
//! bed `iofloor cluster up` made. The scenario's hosts are the bed's hosts in
//! order (its first host on `h0`): a host's tenants run fio in cgroups on
//! that host's own loop device, its view of the storage node's device, so
//! its disk counters hold only its own I/O, as on real shared storage. Each
//! run that throttles starts `iofloor run` on every host, in the host's
//! network namespace, with a config written from the scenario: joined as a
//! cluster on the bed's etcd for `POLICY`, and alone (no `[cluster]`) for
//! `POLICY-hosts-alone`, today's single-host daemon on every host. The
//! scenario's host events are played on the agents and the bed: `kill`
//! SIGKILLs the host's agent, `partition` and `heal` cut and restore its
//! control network (its storage path stays). Measures come from the
//! tenants' cgroup counters and fio's own logs, as on one host.

use crate::agents::AgentPlan;
use crate::play::{self, Driver, Placement, Setup};
use crate::{BenchError, BenchOptions, Result};
use iofloor_core::policy::PolicyKind;
use iofloor_host::cgroup::{self, DevId};
use iofloor_scenario::{Control, Platform, RawRun, RunEnvironment, Scenario};
use iofloor_testbed::cluster::ClusterBed;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// The cluster bed as the harness's platform: one run at a time, each host's
/// tenants on its own device, the agents driving the throttles.
pub struct ClusterPlatform<'a> {
    pub opts: &'a BenchOptions,
    bed: ClusterBed,
    /// The iofloor binary the agents run.
    agent: PathBuf,
    /// Per scenario host: its bed host's device.
    devices: Vec<(PathBuf, DevId)>,
    /// The scenario's host names, in order.
    hosts: Vec<String>,
    /// A tenant's host by its name (the alone runs name no host).
    host_of: HashMap<String, usize>,
    stop: &'a AtomicBool,
}

impl<'a> ClusterPlatform<'a> {
    /// Checks what the run needs (root, the bed, enough hosts, fio, floors
    /// that fit) and says clearly what is missing.
    pub fn new(
        scenario: &Scenario,
        opts: &'a BenchOptions,
        bed_state_dir: &Path,
        agent: &Path,
        stop: &'a AtomicBool,
    ) -> Result<ClusterPlatform<'a>> {
        let invalid = |m: String| Err(BenchError::Invalid(m));
        let Some(cluster) = &scenario.cluster else {
            return invalid(format!(
                "{}: not a cluster scenario (no tenant names its `host`): run it with --device",
                scenario.name
            ));
        };
        if let Some(u) = scenario.unmanaged.first() {
            return invalid(format!(
                "{}: unmanaged load (`{}`) is not played on the cluster bed yet: give it a host as a tenant without a floor",
                scenario.name, u.name
            ));
        }
        if !scenario.groups.is_empty() {
            return invalid(format!(
                "{}: groups are not played on the cluster bed yet (the cluster's allocator takes flat tenants)",
                scenario.name
            ));
        }
        if opts.vm_paths {
            return invalid("--vm-path qemu is for one host's bench; the bed's hosts are their VMs' paths already".into());
        }
        crate::require_root()?;
        let bed =
            ClusterBed::only(bed_state_dir).map_err(|e| BenchError::Invalid(e.to_string()))?;
        if bed.hosts.len() < cluster.hosts.len() {
            return invalid(format!(
                "{}: {} hosts, the bed in {} has {}: `iofloor cluster down` then `iofloor cluster up --hosts {}`",
                scenario.name,
                cluster.hosts.len(),
                bed.dir.display(),
                bed.hosts.len(),
                cluster.hosts.len()
            ));
        }
        let mut devices = Vec::with_capacity(cluster.hosts.len());
        for host in &bed.hosts[..cluster.hosts.len()] {
            let path = host.device.clone().ok_or_else(|| {
                BenchError::Invalid(format!(
                    "bed host {} has no device (the bed is broken: `iofloor cluster down`, then up)",
                    host.name
                ))
            })?;
            let dev =
                DevId::of_block_device(&path).map_err(|e| BenchError::Invalid(e.to_string()))?;
            devices.push((path, dev));
        }
        if !agent.is_file() {
            return invalid(format!(
                "{}: no iofloor binary to run the agents",
                agent.display()
            ));
        }
        cgroup::detect(&opts.cgroup_root).map_err(|e| BenchError::Invalid(e.to_string()))?;
        crate::check_fio_and_floors(scenario, opts)?;
        let host_of = scenario
            .tenants
            .iter()
            .filter_map(|t| Some((t.spec.name.clone(), t.host?)))
            .collect();
        Ok(ClusterPlatform {
            opts,
            bed,
            agent: agent.to_path_buf(),
            devices,
            hosts: cluster.hosts.clone(),
            host_of,
            stop,
        })
    }

    /// Each scenario host's device, as `bench` prints it.
    pub fn devices(&self) -> impl Iterator<Item = (&str, &Path)> {
        self.hosts
            .iter()
            .map(String::as_str)
            .zip(self.devices.iter().map(|(p, _)| p.as_path()))
    }
}

impl Platform for ClusterPlatform<'_> {
    type Error = BenchError;

    fn kind(&self) -> &'static str {
        "cluster-bed"
    }

    fn source(&self) -> String {
        format!("cluster-bed:{}", self.bed.dir.display())
    }

    fn alone_scenario(&self, scenario: &Scenario, index: usize) -> Scenario {
        crate::alone_run(scenario, index, self.opts)
    }

    fn planned_effort(&self, scenario: &Scenario) -> f64 {
        (scenario.duration + self.opts.settle).as_secs_f64()
    }

    fn run(
        &self,
        scenario: &Scenario,
        control: Option<Control>,
        label: &str,
        progress: &(dyn Fn(f64) + Sync),
    ) -> Result<RawRun> {
        let tenant_host = scenario
            .tenants
            .iter()
            .map(|t| {
                self.host_of.get(&t.spec.name).copied().ok_or_else(|| {
                    BenchError::Failed(format!("tenant {} has no host", t.spec.name))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let tag = crate::tag(label);
        let plan = |kind: PolicyKind, as_cluster: bool| AgentPlan {
            bed: &self.bed,
            agent: &self.agent,
            cgroup_root: &self.opts.cgroup_root,
            kind,
            as_cluster,
            hosts: &self.hosts,
            devices: &self.devices,
            tenant_host: tenant_host.clone(),
            cluster_name: format!("bench-{}-{tag}", std::process::id()),
        };
        let driver = match control {
            None | Some(Control::Policy(PolicyKind::None)) => Driver::Nothing,
            Some(Control::Policy(kind)) => Driver::Agents(plan(kind, true)),
            Some(Control::HostsAlone(kind)) => Driver::Agents(plan(kind, false)),
            Some(Control::Kernel(run)) => {
                return Err(BenchError::Invalid(format!(
                    "{}: the cluster bed's hosts run cgroup v1; the kernel's controllers are measured on one v2 host",
                    run.label()
                )))
            }
        };
        let setup = Setup {
            opts: self.opts,
            placement: Placement {
                devices: self.devices.clone(),
                tenant_host,
            },
            driver,
            kernel: None,
            stop: self.stop,
        };
        play::play(scenario, setup, &tag, progress)
    }

    fn settle(&self) -> Result<()> {
        crate::settle(self.opts, self.stop)
    }

    fn environment(&self, _scenario: &Scenario) -> RunEnvironment {
        crate::environment(false)
    }
}
