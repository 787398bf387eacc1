//! An etcd cluster of `n` members on this machine (127.0.0.1, free ports),
//! for the tests (the `cluster up` test bed runs its members in network
//! namespaces, `iofloor_testbed::cluster`): each member a child process
//! with its data under a directory of its own, killed by PID and its data
//! removed when dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct LocalEtcd {
    members: Vec<Option<Child>>,
    /// One client URL per member, in member order.
    pub client_urls: Vec<String>,
    dir: PathBuf,
    remove_dir: bool,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl LocalEtcd {
    /// Starts `n` members with their data and logs under `dir` (created;
    /// removed on drop when `remove_dir`), and waits until the cluster is
    /// healthy.
    pub fn start(n: usize, dir: &Path, remove_dir: bool) -> std::io::Result<LocalEtcd> {
        std::fs::create_dir_all(dir)?;
        let peers = (0..n)
            .map(|_| free_port().map(|p| format!("http://127.0.0.1:{p}")))
            .collect::<std::io::Result<Vec<_>>>()?;
        let client_urls = (0..n)
            .map(|_| free_port().map(|p| format!("http://127.0.0.1:{p}")))
            .collect::<std::io::Result<Vec<_>>>()?;
        let initial: Vec<String> = peers
            .iter()
            .enumerate()
            .map(|(i, p)| format!("e{i}={p}"))
            .collect();
        let mut etcd = LocalEtcd {
            members: Vec::new(),
            client_urls,
            dir: dir.to_path_buf(),
            remove_dir,
        };
        for (i, peer) in peers.iter().enumerate() {
            let log = std::fs::File::create(dir.join(format!("e{i}.log")))?;
            let child = Command::new("etcd")
                .args(["--name", &format!("e{i}")])
                .arg("--data-dir")
                .arg(dir.join(format!("e{i}")))
                .args(["--listen-peer-urls", peer])
                .args(["--initial-advertise-peer-urls", peer])
                .args(["--listen-client-urls", &etcd.client_urls[i]])
                .args(["--advertise-client-urls", &etcd.client_urls[i]])
                .args(["--initial-cluster", &initial.join(",")])
                .args(["--initial-cluster-token", "iofloor-local"])
                .args(["--initial-cluster-state", "new"])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .map_err(|e| std::io::Error::new(e.kind(), format!("etcd: {e}")))?;
            etcd.members.push(Some(child));
        }
        etcd.wait_healthy(Duration::from_secs(30))?;
        Ok(etcd)
    }

    fn wait_healthy(&mut self, limit: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let healthy = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args([
                    "--endpoints",
                    &self.client_urls.join(","),
                    "endpoint",
                    "health",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()?
                .success();
            if healthy {
                return Ok(());
            }
            for (i, m) in self.members.iter_mut().enumerate() {
                if let Some(status) = m.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                    return Err(std::io::Error::other(format!(
                        "etcd member e{i} exited ({status}); see {}",
                        self.dir.join(format!("e{i}.log")).display()
                    )));
                }
            }
            if Instant::now() >= deadline {
                return Err(std::io::Error::other(format!(
                    "etcd not healthy within {limit:?}; logs in {}",
                    self.dir.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Kills member `i` (SIGKILL), as a crashed machine would lose it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members.get_mut(i).and_then(Option::take) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        if self.remove_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
