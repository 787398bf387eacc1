//! Real podman containers under `iofloor run`: fio in containers made from
//! an image built here from the host's own fio (no registry), found through
//! podman's API by name, by their `io.iofloor.*` labels, and by the
//! annotations of a Kubernetes pod played with `podman kube play`, on a rig
//! of known capacity.

use super::common::{real_environment, TestRig};
use super::harness::{config, Daemon};
use super::SERIAL;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The image tag of the host's fio: rebuilt when fio changes.
fn fio_image() -> String {
    let version = Command::new("fio").arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout)
        .trim()
        .replace(['/', ' '], "-");
    let tag = format!("localhost/iofloor-fio:{version}");
    let exists = Command::new("podman")
        .args(["image", "exists", &tag])
        .status()
        .unwrap();
    if exists.success() {
        return tag;
    }
    // fio and every library it loads, at their own paths, and nothing else.
    let root = tempfile::tempdir().unwrap();
    let fio = PathBuf::from("/usr/bin/fio");
    let ldd = Command::new("ldd").arg(&fio).output().unwrap();
    let mut files = vec![fio];
    files.extend(
        String::from_utf8_lossy(&ldd.stdout)
            .split_whitespace()
            .filter(|w| w.starts_with('/'))
            .map(PathBuf::from),
    );
    for f in &files {
        let to = root.path().join(f.strip_prefix("/").unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(f, &to).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
    std::fs::create_dir_all(root.path().join("tmp")).unwrap();
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(root.path())
        .args(["-cf", "-", "."])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let import = Command::new("podman")
        .args(["import", "-", &tag])
        .stdin(tar.stdout.take().unwrap())
        .output()
        .unwrap();
    assert!(tar.wait().unwrap().success(), "tar of the image's files");
    assert!(
        import.status.success(),
        "podman import: {}",
        String::from_utf8_lossy(&import.stderr)
    );
    tag
}

/// `podman system service` on a socket of its own, stopped (by PID) when
/// dropped, with every container this test started.
struct Podman {
    /// Dropped after the containers are removed (fields drop after `drop`).
    _libpod: LibpodCgroups,
    dir: tempfile::TempDir,
    service: Child,
    prefix: String,
    image: String,
    /// The block device every container's fio reads.
    device: String,
}

impl Podman {
    fn start(image: String, device: &str) -> Podman {
        let libpod = LibpodCgroups::record();
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("podman.sock");
        let service = Command::new("podman")
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", socket.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The guard first: a failed wait below still stops the service.
        let podman = Podman {
            _libpod: libpod,
            dir,
            service,
            prefix: format!("iofloor-e2e-{}", std::process::id()),
            image,
            device: device.to_string(),
        };
        let started = Instant::now();
        while !socket.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no podman socket"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        podman
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("podman.sock")
    }

    fn name(&self, short: &str) -> String {
        format!("{}-{short}", self.prefix)
    }

    /// Starts fio in a new container `short` with `labels`, reading the
    /// rig's device directly for `secs`. runc, not crun: crun refuses this
    /// machine's hybrid cgroup layout; the ulimits: its defaults exceed
    /// the sandbox's hard limits.
    fn fio(&self, short: &str, labels: &[&str], qd: u32, rate: Option<u32>, secs: u32) {
        let mut cmd = Command::new("podman");
        cmd.args([
            "--runtime",
            "runc",
            "run",
            "-d",
            "--name",
            &self.name(short),
        ])
        .args([
            "--network",
            "none",
            "--ulimit",
            "nofile=10000:10000",
            "--ulimit",
            "nproc=1000:1000",
        ])
        .args(["--device", &self.device]);
        for l in labels {
            cmd.args(["--label", l]);
        }
        cmd.args([
            &self.image,
            "/usr/bin/fio",
            "--name=load",
            "--direct=1",
            "--ioengine=libaio",
        ])
        .arg(format!("--filename={}", self.device))
        .args(["--rw=randread", "--bs=4k", "--time_based"])
        .arg(format!("--iodepth={qd}"))
        .arg(format!("--runtime={secs}"));
        if let Some(r) = rate {
            cmd.arg(format!("--rate_iops={r}"));
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "podman run {short}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops the API service (the containers run on).
    fn service_stop(&mut self) -> std::io::Result<()> {
        self.service.kill()?;
        self.service.wait().map(drop)
    }

    /// Plays a Kubernetes pod `short` whose `annotations` are the pod's,
    /// with one fio container per `(name, rate)` at QD 1 reading the rig's
    /// device (a `BlockDevice` hostPath) for `secs`. The runtime and ulimits
    /// as in [`Podman::fio`], given to `kube play` in a containers.conf of
    /// its own.
    fn kube_play(
        &self,
        short: &str,
        annotations: &[(&str, &str)],
        jobs: &[(&str, u32)],
        secs: u32,
    ) {
        let conf = self.dir.path().join("containers.conf");
        std::fs::write(
            &conf,
            "[containers]\ndefault_ulimits = [\"nofile=10000:10000\", \"nproc=1000:1000\"]\n\
             [engine]\nruntime = \"runc\"\n",
        )
        .unwrap();
        let containers: Vec<Value> = jobs
            .iter()
            .map(|(name, rate)| {
                serde_json::json!({
                    "name": name,
                    "image": self.image,
                    "command": ["/usr/bin/fio", "--name=load", "--direct=1", "--ioengine=libaio",
                        format!("--filename={}", self.device), "--rw=randread", "--bs=4k",
                        "--time_based", "--iodepth=1", format!("--runtime={secs}"),
                        format!("--rate_iops={rate}")],
                    "volumeMounts": [{"name": "disk", "mountPath": self.device}],
                })
            })
            .collect();
        let annotations: serde_json::Map<String, Value> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), Value::from(*v)))
            .collect();
        // JSON is YAML: kube play reads it as a manifest.
        let pod = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name(short), "annotations": annotations},
            "spec": {
                "restartPolicy": "Never",
                "containers": containers,
                "volumes": [{"name": "disk", "hostPath": {"path": self.device, "type": "BlockDevice"}}],
            },
        });
        let manifest = self.dir.path().join(format!("{short}.yaml"));
        std::fs::write(&manifest, pod.to_string()).unwrap();
        let out = Command::new("podman")
            .env("CONTAINERS_CONF", &conf)
            .args(["kube", "play", "--network", "none"])
            .arg(&manifest)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "podman kube play {short}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn remove_pod(&self, short: &str) {
        let _ = Command::new("podman")
            .args(["pod", "rm", "-f", "-t", "0", &self.name(short)])
            .output();
    }

    fn remove(&self, short: &str) {
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", &self.name(short)])
            .output();
    }

    /// The blkio cgroup of a running container.
    fn cgroup(&self, short: &str) -> PathBuf {
        let out = Command::new("podman")
            .args(["inspect", "--format", "{{.State.Pid}}", &self.name(short)])
            .output()
            .unwrap();
        let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let rel = iofloor_host::containers::io_cgroup(&text, iofloor_host::Version::V1).unwrap();
        Path::new("/sys/fs/cgroup/blkio").join(rel)
    }
}

impl Podman {
    /// Removes every pod (`object = "pod"`) or container (`"container"`)
    /// this test made, by its name's prefix.
    fn remove_ours(&self, object: &str) {
        // `pod ps` lists stopped pods too, and has no `-a`; a pod's name is
        // `.Name`, a container's `.Names`.
        let (all, format): (&[&str], _) = if object == "pod" {
            (&[], "{{.Name}}")
        } else {
            (&["-a"], "{{.Names}}")
        };
        let listed = Command::new("podman")
            .args([object, "ps"])
            .args(all)
            .args(["--format", format, "--filter"])
            .arg(format!("name=^{}-", self.prefix))
            .output();
        if let Ok(out) = listed {
            for name in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("podman")
                    .args([object, "rm", "-f", "-t", "0", name])
                    .output();
            }
        }
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Pods first: their containers go with them.
        self.remove_ours("pod");
        self.remove_ours("container");
        let _ = self.service.kill();
        let _ = self.service.wait();
    }
}

/// IOPS of a tenant per interval from `from` (daemon time).
fn iops_since(d: &Daemon, tenant: &str, from: f64) -> Vec<f64> {
    let (_, t) = d.get(&format!("/api/v1/tenants/{tenant}"));
    crate::common::history_iops_since(&t, from)
}

/// A block device's `MAJ:MIN`, as blk-throttle files give it.
fn dev_numbers(device: &str) -> String {
    let name = Path::new(device)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    std::fs::read_to_string(format!("/sys/class/block/{name}/dev"))
        .unwrap()
        .trim()
        .to_string()
}

fn floor_of(v: &Value, tenant: &str) -> Value {
    super::tenant(v, tenant)["floor"].clone()
}

/// Two containers that carry their floors in labels, a pod played from a
/// Kubernetes manifest (`podman kube play`) whose annotations declare a
/// floor for its two containers, and a noisy container named in the
/// config, on a 1,000-IOPS rig: each labelled container keeps its floor,
/// one recreated mid-run (a new ID and cgroup) keeps it too, the pod is one
/// group over its containers holding its floor (found through podman's own
/// API, which shows a container's pod and annotations) and its tenants go
/// with it, a container whose label is bad is left alone with a warning
/// naming it, and the noisy one's limits are put back when the daemon stops.
#[test]
fn labelled_podman_containers_get_their_floors_and_keep_them_when_recreated() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment()
        || !iofloor_testbed::needs::require(
            "labelled_podman_containers",
            &[
                iofloor_testbed::needs::Need::Program("podman"),
                iofloor_testbed::needs::Need::Program("runc"),
                iofloor_testbed::needs::Need::Program("catatonit"),
                iofloor_testbed::needs::Need::Program("fio"),
            ],
        )
    {
        return;
    }
    let image = fio_image();
    let rig = TestRig::up(1000);
    let mut podman = Podman::start(image, &rig.device);
    let tenants = format!(
        r#"
[[runtime]]
name = "podman"
socket = "{}"
trust_labels = true

[[tenant]]
name = "noisy"
container = "{}"
"#,
        podman.socket().display(),
        podman.name("noisy")
    );
    let daemon = Daemon::start(&config(&rig.device, 1000, "unused", &tenants));
    // Longer than the test: every container still runs at its last check
    // (they are removed when it ends).
    const SECS: u32 = 120;
    podman.fio(
        "db",
        &["io.iofloor.floor=300iops", "app=pg"],
        1,
        Some(330),
        SECS,
    );
    podman.fio("web", &["io.iofloor.floor=250iops"], 1, Some(275), SECS);
    podman.fio("bad", &["io.iofloor.floor=0iops"], 1, Some(20), SECS);
    podman.fio("noisy", &[], 16, None, SECS);
    podman.kube_play(
        "pod",
        &[("io.iofloor.floor", "200iops")],
        &[("a", 110), ("b", 110)],
        SECS,
    );
    let (db, web) = (
        format!("podman/{}", podman.name("db")),
        format!("podman/{}", podman.name("web")),
    );
    let pod = podman.name("pod");
    let group = format!("podman/{pod}");
    let members = [format!("{group}/{pod}-a"), format!("{group}/{pod}-b")];
    let v = daemon.wait_for("the containers adopted", Duration::from_secs(30), |v| {
        [db.as_str(), web.as_str(), "noisy"]
            .iter()
            .chain(
                members
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .iter(),
            )
            .all(|n| !super::tenant(v, n).is_null())
    });
    assert_eq!(floor_of(&v, &db)["value"], 300.0, "{v}");
    assert_eq!(floor_of(&v, &web)["value"], 250.0, "{v}");
    for m in &members {
        assert_eq!(super::tenant(&v, m)["groups"][0], group.as_str(), "{v}");
    }
    let (_, admission) = daemon.get("/api/v1/admission");
    assert!(
        admission["devices"][0]["tenants"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["name"] == group.as_str()
                && r["group"] == true
                && r["floor_cost"].as_f64().unwrap_or(0.0) > 0.0),
        "the pod's group holds a floor: {admission}"
    );
    assert!(
        super::tenant(&v, &format!("podman/{}", podman.name("bad"))).is_null(),
        "a container with a bad label is not a labelled tenant: {v}"
    );
    let log = daemon.log_text();
    assert!(
        log.contains(&podman.name("bad")) && log.contains("label `io.iofloor.floor=0iops`"),
        "{log}"
    );
    let (_, status) = daemon.get("/api/v1/status");
    let start = status["uptime_s"].as_f64().unwrap();
    std::thread::sleep(Duration::from_secs(15));
    // Recreated: the same name and labels, a new ID and cgroup.
    let old_cgroup = podman.cgroup("db");
    let (_, status) = daemon.get("/api/v1/status");
    let removed_at = status["uptime_s"].as_f64().unwrap();
    podman.remove("db");
    podman.fio(
        "db",
        &["io.iofloor.floor=300iops", "app=pg"],
        1,
        Some(330),
        SECS,
    );
    let (_, status) = daemon.get("/api/v1/status");
    let recreated_at = status["uptime_s"].as_f64().unwrap();
    assert_ne!(podman.cgroup("db"), old_cgroup);
    std::thread::sleep(Duration::from_secs(20));
    let noisy_cgroup = podman.cgroup("noisy");
    let noisy_limit =
        std::fs::read_to_string(noisy_cgroup.join("blkio.throttle.read_iops_device")).unwrap();
    let (_, v) = daemon.get("/api/v1/tenants");
    assert_eq!(floor_of(&v, &db)["value"], 300.0, "{v}");
    let path = super::tenant(&v, &db)["path"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        path.ends_with(podman.cgroup("db").file_name().unwrap().to_str().unwrap()),
        "the new container's cgroup: {path}"
    );
    let met = |tenant: &str, floor: f64, from: f64, to: f64| {
        let got: Vec<f64> = iops_since(&daemon, tenant, from)
            .into_iter()
            .take((to - from).max(0.0) as usize)
            .collect();
        let ok = got.iter().filter(|&&g| g >= 0.95 * floor).count();
        eprintln!(
            "  {tenant}: floor {floor} IOPS, met in {ok}/{} windows: {got:.0?}",
            got.len()
        );
        (ok, got.len())
    };
    let (db_ok, db_n) = met(&db, 300.0, start + 5.0, removed_at - 1.0);
    let (db2_ok, db2_n) = met(&db, 300.0, recreated_at + 4.0, recreated_at + 19.0);
    let (web_ok, web_n) = met(&web, 250.0, start + 5.0, start + 34.0);
    let per_member: Vec<Vec<f64>> = members
        .iter()
        .map(|m| iops_since(&daemon, m, start + 5.0))
        .collect();
    let windows = per_member.iter().map(Vec::len).min().unwrap_or(0).min(29);
    let pod_iops: Vec<f64> = (0..windows)
        .map(|i| per_member.iter().map(|m| m[i]).sum())
        .collect();
    let pod_ok = pod_iops.iter().filter(|&&g| g >= 0.95 * 200.0).count();
    eprintln!("  {group}: floor 200 IOPS, met in {pod_ok}/{windows} windows: {pod_iops:.0?}");
    let noisy = iops_since(&daemon, "noisy", start + 5.0);
    eprintln!("  noisy: {noisy:.0?}; its limit: {}", noisy_limit.trim());
    assert!(
        noisy_limit.trim().starts_with(&dev_numbers(&rig.device)),
        "the noisy container is capped: {noisy_limit}"
    );
    for (what, ok, n) in [
        ("db", db_ok, db_n),
        ("db recreated", db2_ok, db2_n),
        ("web", web_ok, web_n),
        ("the pod", pod_ok, windows),
    ] {
        assert!(n >= 8, "{what}: {n} windows");
        // Measured: every window but one or two at a start (fio's first
        // seconds in a container) or beside a container's removal (podman's
        // CPU on two cores).
        assert!(ok + 2 >= n, "{what}: floor met in {ok} of {n} windows");
    }
    podman.remove_pod("pod");
    daemon.wait_for("the pod's tenants dropped", Duration::from_secs(15), |v| {
        members.iter().all(|m| super::tenant(v, m).is_null())
    });
    // The runtime gone: its containers' tenants stay as they are.
    let _ = podman.service_stop();
    std::thread::sleep(Duration::from_secs(3));
    let (_, v) = daemon.get("/api/v1/tenants");
    for name in [db.as_str(), web.as_str(), "noisy"] {
        assert!(!super::tenant(&v, name).is_null(), "{name} kept: {v}");
    }
    let log = daemon.log_text();
    assert!(
        log.contains("the container runtime cannot be asked") && log.contains("cannot connect"),
        "{log}"
    );
    drop(daemon);
    let after =
        std::fs::read_to_string(noisy_cgroup.join("blkio.throttle.read_iops_device")).unwrap();
    assert!(
        !after.contains(&dev_numbers(&rig.device)),
        "the noisy container's limit put back: {after}"
    );
}

/// The daemon's own image, built by `scripts/build-image.sh` from the
/// binary under test, run as the DaemonSet runs it (privileged, the host's
/// network, the host's cgroups at /host/sys/fs/cgroup, /run/iofloor from the
/// host, the config read-only at /etc/iofloor) against fio tenants in the
/// host's cgroups on the rig: it keeps a floor, and `podman stop` (SIGTERM)
/// puts every limit back.
#[test]
fn the_daemon_runs_from_its_image_as_the_daemonset_runs_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !real_environment()
        || !iofloor_testbed::needs::require(
            "the_daemon_runs_from_its_image",
            &[
                iofloor_testbed::needs::Need::Program("podman"),
                iofloor_testbed::needs::Need::Program("runc"),
                iofloor_testbed::needs::Need::Program("fio"),
                iofloor_testbed::needs::Need::Program("objcopy"),
            ],
        )
    {
        return;
    }
    let _libpod = LibpodCgroups::record();
    let tag = format!("localhost/iofloor:e2e-{}", std::process::id());
    // The guard first: a failed check below still removes the image.
    let image = Image(tag.clone());
    let build =
        Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/build-image.sh"))
            .args(["--binary", env!("CARGO_BIN_EXE_iofloor"), "--tag", &tag])
            .output()
            .unwrap();
    assert!(
        build.status.success(),
        "build-image.sh: {}",
        String::from_utf8_lossy(&build.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&build.stdout).trim(), tag);
    let rig = TestRig::up(1000);
    let mut cg = super::harness::Cgroups::new("image", &["quiet", "noisy"]);
    let dir = tempfile::tempdir().unwrap();
    let (etc, run) = (dir.path().join("etc"), dir.path().join("run"));
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(&run).unwrap();
    let port = super::harness::free_port();
    let devno = dev_numbers(&rig.device);
    std::fs::write(
        etc.join("iofloor.toml"),
        format!(
            r#"interval = "1s"
state_file = "/run/iofloor/state.json"
cgroup_root = "/host/sys/fs/cgroup/blkio"

[api]
listen = "127.0.0.1:{port}"

[[device]]
name = "rig"
id = "{devno}"
[device.model]
rbps = 100e9
rseqiops = 1000
rrandiops = 1000
wbps = 100e9
wseqiops = 1000
wrandiops = 1000

[[tenant]]
name = "quiet"
cgroup = "{parent}/quiet"
floor = "300 IOPS"
[[tenant]]
name = "noisy"
cgroup = "{parent}/noisy"
"#,
            parent = cg.parent
        ),
    )
    .unwrap();
    let name = format!("iofloor-e2e-{}-daemon", std::process::id());
    let container = Container(name.clone());
    let started = Command::new("podman")
        .args(["--runtime", "runc", "run", "-d", "--name", &name])
        .args(["--privileged", "--network", "host"])
        .args([
            "--ulimit",
            "nofile=10000:10000",
            "--ulimit",
            "nproc=1000:1000",
        ])
        .args(["-v", "/sys/fs/cgroup:/host/sys/fs/cgroup"])
        .arg("-v")
        .arg(format!("{}:/run/iofloor", run.display()))
        .arg("-v")
        .arg(format!("{}:/etc/iofloor:ro", etc.display()))
        .arg(&tag)
        .output()
        .unwrap();
    assert!(
        started.status.success(),
        "podman run: {}",
        String::from_utf8_lossy(&started.stderr)
    );
    let api = |path: &str| -> Value {
        let url = format!("http://127.0.0.1:{port}{path}");
        match super::harness::agent().get(&url).call() {
            Ok(mut r) => r.body_mut().read_json().unwrap_or(Value::Null),
            Err(_) => Value::Null,
        }
    };
    let waited = Instant::now();
    while api("/api/v1/tenants")["tenants"]
        .as_array()
        .is_none_or(|t| t.len() < 2)
    {
        if waited.elapsed() > Duration::from_secs(30) {
            let logs = Command::new("podman")
                .args(["logs", &name])
                .output()
                .unwrap();
            panic!(
                "the daemon in its image did not adopt both tenants: {}",
                String::from_utf8_lossy(&logs.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let start = api("/api/v1/status")["uptime_s"].as_f64().unwrap();
    cg.fio(
        "quiet",
        &rig.device,
        "randread",
        "4k",
        1,
        Some(&format!("{}", 330 * 4096)),
        25,
    );
    cg.fio("noisy", &rig.device, "randread", "4k", 16, None, 25);
    cg.wait_fio_within(Duration::from_secs(60));
    let limit_file = Path::new("/sys/fs/cgroup/blkio")
        .join(&cg.parent)
        .join("noisy/blkio.throttle.read_iops_device");
    let quiet: Vec<f64> = api("/api/v1/tenants/quiet")["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            let t = p["t"].as_f64().unwrap_or(0.0);
            t > start + 5.0 && t < start + 24.0
        })
        .map(|p| p["iops"].as_f64().unwrap_or(0.0))
        .collect();
    let met = quiet.iter().filter(|&&q| q >= 0.95 * 300.0).count();
    eprintln!("  quiet (floor 300 IOPS) under the daemon in its image: met in {met}/{} windows: {quiet:.0?}", quiet.len());
    assert!(quiet.len() >= 10 && met + 2 >= quiet.len(), "{quiet:?}");
    let stop = Command::new("podman")
        .args(["stop", "-t", "10", &name])
        .output()
        .unwrap();
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    let exit = Command::new("podman")
        .args(["inspect", "--format", "{{.State.ExitCode}}", &name])
        .output()
        .unwrap();
    let logs = Command::new("podman")
        .args(["logs", &name])
        .output()
        .unwrap();
    let logs = String::from_utf8_lossy(&logs.stderr).to_string();
    assert_eq!(String::from_utf8_lossy(&exit.stdout).trim(), "0", "{logs}");
    assert!(
        logs.contains("every limit iofloor set was restored"),
        "{logs}"
    );
    let after = std::fs::read_to_string(&limit_file).unwrap();
    assert!(!after.contains(&devno), "the noisy limit put back: {after}");
    drop(container);
    drop(image);
}

/// podman's cgroupfs driver makes `libpod_parent` (and its `conmon`) in
/// every hierarchy and leaves them when its last container goes: removed
/// when dropped where they were not there before (rmdir: only if empty, so
/// a container someone else runs keeps its parent).
struct LibpodCgroups(Vec<PathBuf>);

impl LibpodCgroups {
    fn record() -> LibpodCgroups {
        let made_here = std::fs::read_dir("/sys/fs/cgroup")
            .map(|d| {
                d.flatten()
                    .map(|e| e.path().join("libpod_parent"))
                    .filter(|p| !p.exists())
                    .collect()
            })
            .unwrap_or_default();
        LibpodCgroups(made_here)
    }
}

impl Drop for LibpodCgroups {
    /// Every cgroup under a `libpod_parent` made here, deepest first: its
    /// `conmon`, and a pod's, which `podman pod rm` leaves in the named
    /// systemd and unified hierarchies. One still in use (not ours) is
    /// refused by the kernel and stays. Tried again for a few seconds: a
    /// container's conmon can still be exiting when `podman rm` returns, and
    /// its cgroup refuses removal until it has (empty `libpod_parent/conmon`
    /// cgroups were left behind in the suite that way).
    fn drop(&mut self) {
        fn remove_tree(dir: &Path) {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for e in entries.flatten().filter(|e| e.path().is_dir()) {
                    remove_tree(&e.path());
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            for parent in &self.0 {
                remove_tree(parent);
            }
            if self.0.iter().all(|p| !p.exists()) || std::time::Instant::now() > deadline {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// A container removed (by name) when dropped.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", &self.0])
            .output();
    }
}

/// An image removed (by tag) when dropped.
struct Image(String);

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("podman").args(["rmi", "-f", &self.0]).output();
    }
}
