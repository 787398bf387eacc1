//! The cluster test bed: several hosts that share one block device over the
//! network, and a 3-member etcd, all on this one machine.
//!
//! Every node is a network namespace: a storage node whose bridge is the
//! network (nothing is added to the machine's own namespace), N hosts and
//! three etcd members, each joined to the bridge by a veth pair. The storage
//! node serves one device of known capacity over NBD (qemu-storage-daemon:
//! a file filled with data, a throttle group, an NBD export). Each host
//! attaches it with its own qemu-storage-daemon (NBD client → throttle group
//! → FUSE export, started with `nsenter --net` so the FUSE mount is visible
//! to the whole machine; `ip netns exec` would hide it in a private mount
//! namespace) and a loop device with direct I/O: a real block device for the
//! host's cgroups, whose I/O crosses the network to the shared capacity.
//! One more veth pair joins the machine's own namespace to the bridge at
//! 10.77.0.254, as an operator's workstation on the management network: from
//! there the agents' APIs and etcd are reachable, and nothing else changes.
//! Kernel NBD/NVMe-oF/iSCSI initiators need modules this kernel lacks.
//!
//! As with `rig`, the state is recorded before each resource is made, so
//! `down` removes everything, also after a crash half-way.

use crate::rig::{
    detach_loops_over, down_each, is_mounted, is_ours, qemu_value, read_pidfile, read_states, run,
    set_group_limits, stop_process, wait_mounted, which, RigSpec,
};
use iofloor_host::error::{HostError, Result};
use serde::{Deserialize, Serialize};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const DEFAULT_STATE_ROOT: &str = "/run/iofloor/clusters";
/// The most hosts one bed takes (their addresses are 10.77.0.10 and up).
pub const MAX_HOSTS: usize = 64;
const SUBNET_PREFIX: &str = "10.77.0";
const STORAGE_IP: &str = "10.77.0.1";
const MACHINE_IP: &str = "10.77.0.254";
const NBD_PORT: u16 = 10809;
const ETCD_MEMBERS: usize = 3;
const ETCD_CLIENT_PORT: u16 = 2379;
const ETCD_PEER_PORT: u16 = 2380;

/// One host of the bed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BedHost {
    /// `h0`, `h1`, ...
    pub name: String,
    pub netns: String,
    pub ip: String,
    /// The host's qemu-storage-daemon: QMP socket and PID.
    pub socket: PathBuf,
    pub qsd_pid: Option<u32>,
    /// The FUSE export of the shared device and the loop device over it.
    pub mountpoint: PathBuf,
    pub device: Option<PathBuf>,
    /// Cut off from etcd and the other hosts (its storage path stays).
    #[serde(default)]
    pub partitioned: bool,
}

/// One etcd member of the bed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BedEtcd {
    /// `e0`, `e1`, `e2`.
    pub name: String,
    pub netns: String,
    pub ip: String,
    pub pid: Option<u32>,
    pub data_dir: PathBuf,
    pub client_url: String,
}

/// What a bed made, recorded as it is made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterBed {
    pub dir: PathBuf,
    /// The capacity of the shared device (the storage node's throttle group).
    pub spec: RigSpec,
    /// Every network namespace made, the storage node's first.
    pub namespaces: Vec<String>,
    pub storage_netns: String,
    /// The machine's end of its link to the bridge.
    #[serde(default)]
    pub machine_link: Option<String>,
    pub storage_socket: PathBuf,
    pub storage_pid: Option<u32>,
    pub backing: PathBuf,
    pub hosts: Vec<BedHost>,
    pub etcd: Vec<BedEtcd>,
}

fn netns_path(netns: &str) -> String {
    format!("--net=/run/netns/{netns}")
}

/// A command run in network namespace `netns` but the machine's mount
/// namespace (FUSE mounts and loop devices stay visible to everyone).
fn in_netns(netns: &str, program: &str) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(netns_path(netns)).arg(program);
    cmd
}

fn ip(args: &[&str]) -> Result<()> {
    run(Command::new("ip").args(args)).map(|_| ())
}

/// The tools a bed needs, FUSE, and its subnet free on this machine.
fn machine_can_hold_a_bed() -> Result<()> {
    for tool in [
        "ip",
        "nsenter",
        "qemu-storage-daemon",
        "losetup",
        "etcd",
        "etcdctl",
    ] {
        which(tool)?;
    }
    if !Path::new("/dev/fuse").exists() {
        return Err(HostError::not_usable(
            "/dev/fuse",
            "is missing: FUSE is needed for the hosts' devices",
        ));
    }
    let routes = run(Command::new("ip").args(["route", "show", "to", "match", MACHINE_IP]))?;
    if let Some(route) = routes.lines().find(|r| !r.starts_with("default")) {
        return Err(HostError::not_usable(
            format!("{SUBNET_PREFIX}.0/24"),
            format!("is already routed on this machine (`{route}`): another test bed is up, or a network uses it"),
        ));
    }
    Ok(())
}

impl ClusterBed {
    fn save(&self) -> Result<()> {
        let path = self.dir.join("state.json");
        let text = serde_json::to_string_pretty(self).expect("bed state serialises");
        std::fs::write(&path, text).map_err(|e| HostError::io(&path, e))
    }

    /// The etcd endpoints, as a host's `[cluster] endpoints` lists them.
    pub fn endpoints(&self) -> Vec<String> {
        self.etcd.iter().map(|e| e.client_url.clone()).collect()
    }

    pub fn host(&self, name: &str) -> Result<&BedHost> {
        Ok(&self.hosts[self.host_index(name)?])
    }

    /// Creates a bed of `hosts` hosts sharing a device of capacity `spec`
    /// under `state_root`. On any failure, what was made is removed again.
    pub fn up(hosts: usize, spec: RigSpec, state_root: &Path) -> Result<ClusterBed> {
        spec.validate()?;
        if hosts == 0 || hosts > MAX_HOSTS {
            return Err(iofloor_core::ValidationError::new(
                "--hosts",
                format!("must be 1..{MAX_HOSTS}, got {hosts}"),
            )
            .into());
        }
        machine_can_hold_a_bed()?;
        let state_root =
            &std::path::absolute(state_root).map_err(|e| HostError::io(state_root, e))?;
        std::fs::create_dir_all(state_root).map_err(|e| HostError::io(state_root, e))?;
        let (dir, id) = new_bed_dir(state_root)?;
        let ns = |node: &str| format!("iofloor-{id}-{node}");
        let mut bed = ClusterBed {
            spec,
            namespaces: Vec::new(),
            storage_netns: ns("storage"),
            // At most 15 bytes, the kernel's limit: "iofl" + pid + "-" + n.
            machine_link: Some(format!("iofl{id}")),
            storage_socket: dir.join("storage.sock"),
            storage_pid: None,
            backing: dir.join("shared.img"),
            hosts: (0..hosts)
                .map(|i| BedHost {
                    name: format!("h{i}"),
                    netns: ns(&format!("h{i}")),
                    ip: format!("{SUBNET_PREFIX}.{}", 10 + i),
                    socket: dir.join(format!("h{i}.sock")),
                    qsd_pid: None,
                    mountpoint: dir.join(format!("h{i}.img")),
                    device: None,
                    partitioned: false,
                })
                .collect(),
            etcd: (0..ETCD_MEMBERS)
                .map(|i| {
                    let ip = format!("{SUBNET_PREFIX}.{}", 200 + i);
                    BedEtcd {
                        name: format!("e{i}"),
                        netns: ns(&format!("e{i}")),
                        client_url: format!("http://{ip}:{ETCD_CLIENT_PORT}"),
                        ip,
                        pid: None,
                        data_dir: dir.join(format!("e{i}")),
                    }
                })
                .collect(),
            dir,
        };
        bed.save()?;
        match bed.start() {
            Ok(()) => Ok(bed),
            Err(e) => {
                let _ = bed.down();
                Err(e)
            }
        }
    }

    fn start(&mut self) -> Result<()> {
        self.network()?;
        self.storage()?;
        for i in 0..self.hosts.len() {
            self.attach_host(i)?;
        }
        self.start_etcd()
    }

    /// The storage node's bridge, and a veth pair from it to every other node.
    fn network(&mut self) -> Result<()> {
        let storage = self.storage_netns.clone();
        self.add_netns(&storage)?;
        ip(&["-n", &storage, "link", "set", "lo", "up"])?;
        ip(&["-n", &storage, "link", "add", "br0", "type", "bridge"])?;
        ip(&[
            "-n",
            &storage,
            "addr",
            "add",
            &format!("{STORAGE_IP}/24"),
            "dev",
            "br0",
        ])?;
        ip(&["-n", &storage, "link", "set", "br0", "up"])?;
        let nodes: Vec<(String, String, String)> = self
            .hosts
            .iter()
            .map(|h| (h.name.clone(), h.netns.clone(), h.ip.clone()))
            .chain(
                self.etcd
                    .iter()
                    .map(|e| (e.name.clone(), e.netns.clone(), e.ip.clone())),
            )
            .collect();
        let link = self.machine_link.clone().expect("named at up");
        self.link_machine(&link)?;
        for (name, netns, addr) in nodes {
            self.add_netns(&netns)?;
            // Both ends are made inside their namespaces, so no interface
            // name is ever taken in the machine's own namespace.
            ip(&[
                "link", "add", "eth0", "netns", &netns, "type", "veth", "peer", "name", &name,
                "netns", &storage,
            ])?;
            ip(&["-n", &storage, "link", "set", &name, "master", "br0", "up"])?;
            ip(&[
                "-n",
                &netns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &netns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &netns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// The machine's veth `link` (a name ≤ 15 bytes) into the bridge.
    fn link_machine(&mut self, link: &str) -> Result<()> {
        ip(&[
            "link",
            "add",
            link,
            "type",
            "veth",
            "peer",
            "name",
            "machine",
            "netns",
            &self.storage_netns,
        ])?;
        ip(&[
            "-n",
            &self.storage_netns,
            "link",
            "set",
            "machine",
            "master",
            "br0",
            "up",
        ])?;
        ip(&["addr", "add", &format!("{MACHINE_IP}/24"), "dev", link])?;
        ip(&["link", "set", link, "up"])
    }

    fn add_netns(&mut self, netns: &str) -> Result<()> {
        self.namespaces.push(netns.to_string());
        self.save()?;
        ip(&["netns", "add", netns])
    }

    /// The shared device: a file filled with data (NBD reads of holes skip
    /// the throttle group, measured at 8–10k IOPS against a 400 cap), behind
    /// the capacity's throttle group, exported over NBD.
    fn storage(&mut self) -> Result<()> {
        fill_with_data(&self.backing, self.spec.size)?;
        let pidfile = self.dir.join("storage.pid");
        let mut group = "throttle-group,id=dev".to_string();
        for (key, value) in [
            ("x-iops-total", Some(self.spec.iops)),
            ("x-bps-total", self.spec.bps),
            ("x-iops-size", self.spec.size_unit),
        ] {
            if let Some(v) = value {
                group.push_str(&format!(",{key}={v}"));
            }
        }
        run(in_netns(&self.storage_netns, "qemu-storage-daemon")
            .arg("--blockdev")
            .arg(format!(
                "driver=file,node-name=f0,filename={},aio=threads",
                qemu_value(&self.backing)
            ))
            .arg("--object")
            .arg(group)
            .arg("--blockdev")
            .arg("driver=throttle,node-name=t0,throttle-group=dev,file=f0")
            .arg("--nbd-server")
            .arg(format!(
                "addr.type=inet,addr.host={STORAGE_IP},addr.port={NBD_PORT}"
            ))
            .arg("--export")
            .arg("type=nbd,id=e0,node-name=t0,name=shared,writable=on")
            .arg("--chardev")
            .arg(format!(
                "socket,path={},server=on,wait=off,id=c0",
                qemu_value(&self.storage_socket)
            ))
            .arg("--monitor")
            .arg("chardev=c0")
            .arg("--pidfile")
            .arg(&pidfile)
            .arg("--daemonize"))?;
        self.storage_pid = Some(read_pidfile(&pidfile)?);
        self.save()
    }

    /// Host `i`: NBD client → its own throttle group (what a VM's QEMU
    /// would throttle; no limit until one is set over QMP) → FUSE export →
    /// loop device.
    fn attach_host(&mut self, i: usize) -> Result<()> {
        let host = self.hosts[i].clone();
        std::fs::File::create(&host.mountpoint).map_err(|e| HostError::io(&host.mountpoint, e))?;
        let pidfile = self.dir.join(format!("{}.pid", host.name));
        run(in_netns(&host.netns, "qemu-storage-daemon")
            .arg("--blockdev")
            .arg(format!(
                "driver=nbd,node-name=n0,server.type=inet,server.host={STORAGE_IP},server.port={NBD_PORT},export=shared"
            ))
            .arg("--object")
            .arg("throttle-group,id=vm")
            .arg("--blockdev")
            .arg("driver=throttle,node-name=t0,throttle-group=vm,file=n0")
            .arg("--export")
            .arg(format!(
                "type=fuse,id=e0,node-name=t0,mountpoint={},writable=on",
                qemu_value(&host.mountpoint)
            ))
            .arg("--chardev")
            .arg(format!(
                "socket,path={},server=on,wait=off,id=c0",
                qemu_value(&host.socket)
            ))
            .arg("--monitor")
            .arg("chardev=c0")
            .arg("--pidfile")
            .arg(&pidfile)
            .arg("--daemonize"))?;
        self.hosts[i].qsd_pid = Some(read_pidfile(&pidfile)?);
        self.save()?;
        wait_mounted(&host.mountpoint)?;
        let device = run(Command::new("losetup")
            .args(["-f", "--show", "--direct-io=on"])
            .arg(&host.mountpoint))?;
        self.hosts[i].device = Some(PathBuf::from(device));
        self.save()
    }

    /// Three etcd members, each in its own namespace, as separate machines
    /// would run them; each PID is recorded before waiting for health.
    fn start_etcd(&mut self) -> Result<()> {
        let initial: Vec<String> = self
            .etcd
            .iter()
            .map(|e| format!("{}=http://{}:{ETCD_PEER_PORT}", e.name, e.ip))
            .collect();
        for i in 0..self.etcd.len() {
            let member = self.etcd[i].clone();
            let log_path = self.dir.join(format!("{}.log", member.name));
            let log = std::fs::File::create(&log_path).map_err(|e| HostError::io(&log_path, e))?;
            let peer = format!("http://{}:{ETCD_PEER_PORT}", member.ip);
            let child = in_netns(&member.netns, "etcd")
                .args(["--name", &member.name])
                .arg("--data-dir")
                .arg(&member.data_dir)
                .args(["--listen-peer-urls", &peer])
                .args(["--initial-advertise-peer-urls", &peer])
                .args(["--listen-client-urls", &member.client_url])
                .args(["--advertise-client-urls", &member.client_url])
                .args(["--initial-cluster", &initial.join(",")])
                .args(["--initial-cluster-token", "iofloor-bed"])
                .args(["--initial-cluster-state", "new"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                // Its own process group: a Ctrl-C meant for `cluster up`
                // must not take the bed's etcd with it.
                .process_group(0)
                .spawn()
                .map_err(|e| HostError::Command {
                    what: "nsenter etcd".into(),
                    message: e.to_string(),
                })?;
            // nsenter execs etcd, so this is etcd's PID.
            self.etcd[i].pid = Some(child.id());
            self.save()?;
        }
        self.wait_etcd_healthy(Duration::from_secs(30))
    }

    fn wait_etcd_healthy(&self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        let endpoints = self.endpoints().join(",");
        loop {
            let healthy = in_netns(&self.etcd[0].netns, "etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["--endpoints", &endpoints, "endpoint", "health"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if healthy {
                return Ok(());
            }
            if let Some(dead) = self.etcd.iter().find(|e| {
                e.pid
                    .is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists())
            }) {
                return Err(HostError::not_usable(
                    format!("etcd member {}", dead.name),
                    format!(
                        "exited at start; see {}",
                        self.dir.join(format!("{}.log", dead.name)).display()
                    ),
                ));
            }
            if Instant::now() >= deadline {
                return Err(HostError::Timeout {
                    what: format!("etcd health ({endpoints})"),
                    secs: limit.as_secs(),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Cuts host `name` off from etcd and the other hosts (blackhole routes
    /// in its namespace) while its path to the storage node stays: a host
    /// that loses the control network keeps its tenants' I/O, which is the
    /// case the agent's fallback rule is for.
    pub fn partition(&mut self, name: &str) -> Result<()> {
        let i = self.host_index(name)?;
        if self.hosts[i].partitioned {
            return Ok(());
        }
        for peer in self.peers_of(i) {
            ip(&[
                "-n",
                &self.hosts[i].netns,
                "route",
                "add",
                "blackhole",
                &format!("{peer}/32"),
            ])?;
        }
        self.hosts[i].partitioned = true;
        self.save()
    }

    /// Undoes `partition`.
    pub fn heal(&mut self, name: &str) -> Result<()> {
        let i = self.host_index(name)?;
        for peer in self.peers_of(i) {
            // A route already gone is what heal wants.
            let _ = ip(&[
                "-n",
                &self.hosts[i].netns,
                "route",
                "del",
                "blackhole",
                &format!("{peer}/32"),
            ]);
        }
        self.hosts[i].partitioned = false;
        self.save()
    }

    fn host_index(&self, name: &str) -> Result<usize> {
        self.hosts
            .iter()
            .position(|h| h.name == name)
            .ok_or_else(|| {
                HostError::not_usable(
                    name,
                    format!(
                        "is not a host of the bed in {} (hosts: {})",
                        self.dir.display(),
                        self.hosts
                            .iter()
                            .map(|h| h.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })
    }

    /// Every address host `i` talks to except the storage node.
    fn peers_of(&self, i: usize) -> Vec<String> {
        self.etcd
            .iter()
            .map(|e| e.ip.clone())
            .chain(
                self.hosts
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| *k != i)
                    .map(|(_, h)| h.ip.clone()),
            )
            .collect()
    }

    /// Kills etcd member `name` (SIGKILL), as a crashed machine would lose it.
    pub fn kill_etcd(&mut self, name: &str) -> Result<()> {
        let Some(i) = self.etcd.iter().position(|e| e.name == name) else {
            return Err(HostError::not_usable(
                name,
                "is not an etcd member of the bed (e0, e1, e2)",
            ));
        };
        if let Some(pid) = self.etcd[i].pid.take() {
            if let Some(target) = rustix::process::Pid::from_raw(pid as i32) {
                if is_ours(pid, "etcd", &self.dir) {
                    let _ = rustix::process::kill_process(target, rustix::process::Signal::KILL);
                }
            }
        }
        self.save()
    }

    /// Changes the shared device's capacity live, for every host at once.
    pub fn change_capacity(&mut self, spec: RigSpec) -> Result<()> {
        set_group_limits(&self.storage_socket, "dev", &spec)?;
        self.spec = spec;
        self.save()
    }

    /// Removes everything this bed made, in reverse order; tolerates parts
    /// already gone.
    pub fn down(&self) -> Result<()> {
        let mut first_error = None;
        let mut keep = |r: Result<()>| {
            if let Err(e) = r {
                first_error.get_or_insert(e);
            }
        };
        for e in &self.etcd {
            stop_process(e.pid, "etcd", &self.dir);
        }
        for h in &self.hosts {
            keep(detach_loops_over(&h.mountpoint, h.device.as_deref()));
            stop_process(h.qsd_pid, "qemu-storage-daemon", &self.dir);
            if is_mounted(&h.mountpoint) {
                keep(run(Command::new("umount").arg("-l").arg(&h.mountpoint)).map(|_| ()));
            }
        }
        stop_process(self.storage_pid, "qemu-storage-daemon", &self.dir);
        if let Some(link) = &self.machine_link {
            if Path::new("/sys/class/net").join(link).exists() {
                keep(ip(&["link", "del", link]));
            }
        }
        // Deleting a namespace removes its end of each veth pair, and with
        // it the pair.
        for ns in self.namespaces.iter().rev() {
            if Path::new("/run/netns").join(ns).exists() {
                keep(ip(&["netns", "del", ns]));
            }
        }
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => keep(Err(HostError::io(&self.dir, e))),
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Every bed recorded under `state_root`.
    pub fn list(state_root: &Path) -> Result<Vec<ClusterBed>> {
        read_states(state_root)
    }

    /// The one bed under `state_root`.
    pub fn only(state_root: &Path) -> Result<ClusterBed> {
        let mut beds = ClusterBed::list(state_root)?;
        match beds.len() {
            1 => Ok(beds.remove(0)),
            0 => Err(HostError::not_usable(
                state_root.display(),
                "holds no cluster test bed (start one with `iofloor cluster up`)",
            )),
            n => Err(HostError::not_usable(
                state_root.display(),
                format!("holds {n} test beds; give each its own --state-dir"),
            )),
        }
    }

    /// Removes every bed under `state_root`; returns how many.
    pub fn down_all(state_root: &Path) -> Result<usize> {
        down_each(&ClusterBed::list(state_root)?, ClusterBed::down)
    }
}

/// Writes `size` bytes of a non-zero pattern (allocated, not sparse).
fn fill_with_data(path: &Path, size: u64) -> Result<()> {
    use std::io::Write;
    let file = std::fs::File::create(path).map_err(|e| HostError::io(path, e))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    // Bytes that vary, so no layer below can take the file for zeroes.
    let chunk: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8 | 1)
        .collect();
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        out.write_all(&chunk[..n])
            .map_err(|e| HostError::io(path, e))?;
        left -= n as u64;
    }
    out.flush().map_err(|e| HostError::io(path, e))
}

/// A new directory `bed-<id>` under `root`, with `id` = `<pid>-<n>` also
/// naming its namespaces (unique on the machine while the directory exists).
fn new_bed_dir(root: &Path) -> Result<(PathBuf, String)> {
    for n in 0..1000 {
        let id = format!("{}-{n}", std::process::id());
        let dir = root.join(format!("bed-{id}"));
        if Path::new("/run/netns")
            .join(format!("iofloor-{id}-storage"))
            .exists()
        {
            continue;
        }
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok((dir, id)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(HostError::io(&dir, e)),
        }
    }
    Err(HostError::not_usable(
        root.display(),
        "no free test bed directory name",
    ))
}
