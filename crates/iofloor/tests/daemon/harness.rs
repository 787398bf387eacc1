//! A running `iofloor run` for a test, test cgroups, fio in them, an HTTP
//! client that keeps 4xx answers, and validation against docs/api.yaml.
//! Everything is removed when dropped, also when the test fails.

use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BLKIO: &str = "/sys/fs/cgroup/blkio";

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A tree of test cgroups under the blkio root, removed on drop after the
/// processes the test put there were killed.
pub struct Cgroups {
    pub parent: String,
    children: Vec<Child>,
}

impl Cgroups {
    pub fn new(tag: &str, names: &[&str]) -> Cgroups {
        // Made before the directories, so a name the kernel refuses still
        // leaves nothing behind (its Drop removes what was made).
        let cgroups = Cgroups {
            parent: format!("iofloor-daemon-{tag}-{}", std::process::id()),
            children: Vec::new(),
        };
        for n in names {
            std::fs::create_dir_all(Path::new(BLKIO).join(&cgroups.parent).join(n)).unwrap();
        }
        cgroups
    }

    pub fn path(&self, name: &str) -> PathBuf {
        Path::new(BLKIO).join(&self.parent).join(name)
    }

    /// Starts fio in a cgroup: direct I/O on `device` (blk-throttle limits
    /// only direct I/O). The arguments are fio's own flags, one each.
    #[allow(clippy::too_many_arguments)]
    pub fn fio(
        &mut self,
        name: &str,
        device: &str,
        rw: &str,
        bs: &str,
        iodepth: u32,
        rate: Option<&str>,
        secs: u32,
    ) {
        let mut args = vec![
            format!("--name={name}"),
            format!("--filename={device}"),
            "--direct=1".into(),
            "--ioengine=libaio".into(),
            format!("--rw={rw}"),
            format!("--bs={bs}"),
            format!("--iodepth={iodepth}"),
            "--time_based".into(),
            format!("--runtime={secs}"),
            "--output-format=json".into(),
        ];
        if let Some(r) = rate {
            args.push(format!("--rate={r}"));
        }
        let child = fio_in_cgroup(&self.path(name), &args);
        self.children.push(child);
    }

    /// 100 cgroups `t000` … `t099` on a loop device over tmpfs (CPU-bound:
    /// any CPU the daemon takes would show), and the `[[tenant]]` entry that
    /// finds them all, each with a floor of 1,000 IOPS.
    pub fn hundred(tag: &str) -> (LoopDevice, Cgroups, &'static str) {
        let backing = PathBuf::from(format!("/dev/shm/iofloor-{tag}-{}.img", std::process::id()));
        let loop_device = LoopDevice::new(&backing, 256 << 20);
        let names: Vec<String> = (0..100).map(|i| format!("t{i:03}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let tenants =
            "\n[[tenant]]\nname = \"t\"\ncgroup = \"{parent}/t*\"\nfloor = \"1000 IOPS\"\n";
        (loop_device, Cgroups::new(tag, &refs), tenants)
    }

    pub fn wait_fio(&mut self) {
        for c in &mut self.children {
            let _ = c.wait();
        }
        self.children.clear();
    }

    /// As `wait_fio`, but a fio still running after `limit` (its tenant
    /// throttled so hard its last I/Os never complete) is killed and the
    /// test fails, instead of hanging the whole run.
    pub fn wait_fio_within(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self
            .children
            .iter_mut()
            .any(|c| c.try_wait().ok().flatten().is_none())
        {
            if Instant::now() > deadline {
                for c in &mut self.children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                self.children.clear();
                panic!("fio still running {limit:?} after it started; killed");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.children.clear();
    }

    pub fn write_limit(&self, name: &str, file: &str, line: &str) {
        std::fs::write(self.path(name).join(file), line).unwrap();
    }

    pub fn read_limit(&self, name: &str, file: &str) -> String {
        std::fs::read_to_string(self.path(name).join(file))
            .unwrap()
            .trim()
            .to_string()
    }
}

/// Starts fio with `args` (its own flags, one each) in the cgroup at `dir`:
/// the shell joins the cgroup, then becomes fio.
pub fn fio_in_cgroup(dir: &Path, args: &[String]) -> Child {
    let procs = dir.join("cgroup.procs");
    Command::new("sh")
        .arg("-c")
        .arg(format!("echo $$ > {} && exec fio \"$@\"", procs.display()))
        .arg("sh")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Every directory under `dir`, deepest first.
fn dirs_deepest_first(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            out.extend(dirs_deepest_first(&e.path()));
        }
    }
    out.push(dir.to_path_buf());
    out
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // fio forks a process per job, which outlives a killed parent: every
        // process in these test cgroups was started by this test.
        let parent = Path::new(BLKIO).join(&self.parent);
        for _ in 0..100 {
            let dirs = dirs_deepest_first(&parent);
            for d in &dirs {
                let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    let _ = Command::new("kill")
                        .args(["-KILL", &pid.to_string()])
                        .status();
                }
            }
            for d in &dirs {
                let _ = std::fs::remove_dir(d);
            }
            if !parent.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove {}", parent.display());
    }
}

/// A loop device over a new sparse file; detached and the file removed when
/// dropped (dropping it mid-test is how a test removes a device).
pub struct LoopDevice {
    pub device: String,
    backing: PathBuf,
}

impl LoopDevice {
    pub fn new(backing: &Path, size: u64) -> LoopDevice {
        std::fs::File::create(backing)
            .unwrap()
            .set_len(size)
            .unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(backing)
            .output()
            .unwrap();
        let device = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let made = LoopDevice {
            device,
            backing: backing.to_path_buf(),
        };
        assert!(
            made.device.starts_with("/dev/loop"),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        made
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if self.device.starts_with("/dev/loop") {
            let _ = Command::new("losetup").args(["-d", &self.device]).status();
        }
        let _ = std::fs::remove_file(&self.backing);
    }
}

/// `iofloor run` on a config written into a temporary directory.
pub struct Daemon {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub port: u16,
    /// The address its API listens on (`{ip}` in the config).
    pub ip: String,
    /// The network namespace it runs in (a host of the cluster test bed).
    netns: Option<String>,
    pub config: PathBuf,
    pub log: PathBuf,
    agent: ureq::Agent,
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

impl Daemon {
    /// Writes `config` (with `{port}` and `{dir}` filled in) and starts the
    /// daemon; returns once its API answers.
    pub fn start(config: &str) -> Daemon {
        Daemon::start_on(None, "127.0.0.1", config)
    }

    /// As `start`, in network namespace `netns` (by `nsenter --net`, so
    /// mounts and cgroups are the machine's), its API on `ip` (`{ip}`).
    pub fn start_on(netns: Option<&str>, ip: &str, config: &str) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let path = dir.path().join("iofloor.toml");
        std::fs::write(&path, fill(config, port, dir.path()).replace("{ip}", ip)).unwrap();
        let mut d = Daemon {
            child: None,
            port,
            ip: ip.to_string(),
            netns: netns.map(str::to_string),
            config: path,
            log: dir.path().join("daemon.log"),
            dir,
            agent: agent(),
        };
        d.spawn();
        d
    }

    /// Starts (again) on the same config, state file and port.
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = match &self.netns {
            // nsenter execs the daemon: the child's PID is the daemon's.
            Some(netns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{netns}"))
                    .arg(env!("CARGO_BIN_EXE_iofloor"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_iofloor")),
        };
        let child = cmd
            .args(["run", "--config"])
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if let Ok(resp) = self.agent.get(&self.url("/api/v1/status")).call() {
                if resp.status() == 200 {
                    return;
                }
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "iofloor run exited ({status}) at start:\n{}",
                    self.log_text()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "API did not come up:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn rewrite_config(&self, config: &str) {
        std::fs::write(
            &self.config,
            fill(config, self.port, self.dir.path()).replace("{ip}", &self.ip),
        )
        .unwrap();
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}:{}{path}", self.ip, self.port)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        let mut resp = self.agent.get(&self.url(path)).call().unwrap();
        let status = resp.status().as_u16();
        (status, resp.body_mut().read_json().unwrap_or(Value::Null))
    }

    pub fn get_text(&self, path: &str) -> String {
        self.agent
            .get(&self.url(path))
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap()
    }

    pub fn send(&self, method: &str, path: &str, body: &str, token: Option<&str>) -> (u16, Value) {
        let url = self.url(path);
        let mut req = match method {
            "PATCH" => self.agent.patch(&url),
            "POST" => self.agent.post(&url),
            "PUT" => self.agent.put(&url),
            other => panic!("method {other}"),
        };
        if let Some(t) = token {
            req = req.header("Authorization", &format!("Bearer {t}"));
        }
        let mut resp = req
            .header("Content-Type", "application/json")
            .send(body)
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.body_mut().read_json().unwrap_or(Value::Null))
    }

    /// Polls the tenant list until `pred` holds (a daemon interval is 1 s or less).
    pub fn wait_for(&self, what: &str, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            let (_, v) = self.get("/api/v1/tenants");
            if pred(&v) {
                return v;
            }
            assert!(
                started.elapsed() < timeout,
                "timed out waiting for {what}; last: {v}\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// Sends SIGTERM and waits; returns the exit status and how long it took.
    pub fn terminate(&mut self) -> (std::process::ExitStatus, Duration) {
        let started = Instant::now();
        self.signal("TERM");
        let status = self.child.take().unwrap().wait().unwrap();
        (status, started.elapsed())
    }

    pub fn kill9(&mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGTERM first so it restores what it set; SIGKILL if it hangs.
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let started = Instant::now();
            while c.try_wait().ok().flatten().is_none()
                && started.elapsed() < Duration::from_secs(5)
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        // IOFLOOR_TEST_PRINT_LOG: the log of a passing run too, to study
        // it (with IOFLOOR_LOG=iofloor_daemon=debug, every capacity step).
        if std::thread::panicking() || std::env::var_os("IOFLOOR_TEST_PRINT_LOG").is_some() {
            eprintln!("--- daemon log ---\n{}", self.log_text());
        }
    }
}

/// A config for tenants in `parent`'s children on `device`, with the rig's
/// cost model (every I/O costs the same: the rig counts operations).
pub fn config(device: &str, iops: u64, parent: &str, tenants: &str) -> String {
    format!(
        r#"interval = "1s"
state_file = "{{dir}}/state.json"

[api]
listen = "127.0.0.1:{{port}}"
token = "let-me-in"
unix_socket = "{{dir}}/api.sock"

[[device]]
name = "rig"
path = "{device}"
[device.model]
rbps = 100e9
rseqiops = {iops}
rrandiops = {iops}
wbps = 100e9
wseqiops = {iops}
wrandiops = {iops}

{tenants}"#
    )
    .replace("{parent}", parent)
}

fn fill(config: &str, port: u16, dir: &Path) -> String {
    config
        .replace("{port}", &port.to_string())
        .replace("{dir}", &dir.display().to_string())
}

/// Reads one server-sent event of type `tick` from the sample stream.
pub fn read_one_tick(port: u16) -> Value {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /api/v1/samples HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "stream closed: {text}");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
        if let Some(i) = text.find("event: tick\ndata: ") {
            let rest = &text[i + "event: tick\ndata: ".len()..];
            if let Some(end) = rest.find('\n') {
                return serde_json::from_str(&rest[..end]).unwrap();
            }
        }
    }
}

/// One request over the API's unix socket (HTTP/1.1, connection closed).
pub fn unix_request(socket: &Path, method: &str, path: &str, body: &str) -> (u16, Value) {
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status: u16 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Validates API answers against the schemas of docs/api.yaml.
pub struct ApiSpec {
    doc: Value,
}

impl ApiSpec {
    pub fn load() -> ApiSpec {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/api.yaml");
        let doc: Value = serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        ApiSpec { doc }
    }

    /// The JSON schema of `method path` answering `status`.
    fn schema(&self, path: &str, method: &str, status: u16) -> Value {
        let op = &self.doc["paths"][path][method];
        assert!(op.is_object(), "docs/api.yaml has no {method} {path}");
        let resp = &op["responses"][status.to_string()];
        assert!(
            resp.is_object(),
            "docs/api.yaml: {method} {path} does not document {status}"
        );
        let resp = match resp.get("$ref").and_then(Value::as_str) {
            Some(r) => self.doc.pointer(r.trim_start_matches('#')).unwrap().clone(),
            None => resp.clone(),
        };
        resp["content"]["application/json"]["schema"].clone()
    }

    #[track_caller]
    pub fn check(&self, path: &str, method: &str, status: u16, body: &Value) {
        let mut root = self.doc.clone();
        let schema = self.schema(path, method, status);
        assert!(
            !schema.is_null(),
            "docs/api.yaml: {method} {path} {status} has no JSON schema"
        );
        // Validate against the schema with the whole document as its root,
        // so `#/components/schemas/...` references resolve.
        root.as_object_mut()
            .unwrap()
            .insert("$ref".into(), Value::String("#/__checked".into()));
        root.as_object_mut()
            .unwrap()
            .insert("__checked".into(), schema);
        let validator = jsonschema::draft202012::new(&root).expect("docs/api.yaml schemas compile");
        let errors: Vec<String> = validator
            .iter_errors(body)
            .map(|e| format!("{} at {}", e, e.instance_path))
            .collect();
        assert!(
            errors.is_empty(),
            "{method} {path} {status} does not match docs/api.yaml: {errors:#?}\nbody: {body}"
        );
    }
}
