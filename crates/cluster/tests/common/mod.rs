//! A 3-member etcd cluster for the tests, and the environment check.
#![allow(dead_code)]

pub struct EtcdCluster {
    pub etcd: iofloor_cluster::LocalEtcd,
    pub client_urls: Vec<String>,
    _dir: tempfile::TempDir,
}

/// etcd is installed, or the test fails (skips only outside CI with
/// IOFLOOR_SKIP_REAL_TESTS=1).
pub fn etcd_available() -> bool {
    let test = std::thread::current()
        .name()
        .unwrap_or("an etcd test")
        .to_string();
    iofloor_testbed::needs::require(
        &test,
        &[
            iofloor_testbed::needs::Need::Program("etcd"),
            iofloor_testbed::needs::Need::Program("etcdctl"),
        ],
    )
}

impl EtcdCluster {
    pub fn start(n: usize) -> EtcdCluster {
        let dir = tempfile::tempdir().unwrap();
        let etcd = iofloor_cluster::LocalEtcd::start(n, &dir.path().join("etcd"), true)
            .expect("start etcd");
        EtcdCluster {
            client_urls: etcd.client_urls.clone(),
            etcd,
            _dir: dir,
        }
    }

    pub fn kill(&mut self, i: usize) {
        self.etcd.kill(i);
    }
}
