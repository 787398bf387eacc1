//! Containers as their runtime knows them: names, labels and the cgroup each
//! runs in, asked over the Docker Engine API on the runtime's unix socket.
//! Docker serves it, and so does podman (`podman system service`, the
//! `podman.socket` unit), so one client covers both. Where the socket also
//! answers podman's own (libpod) API, that is asked instead: it adds each
//! container's pod and its annotations, where `podman kube play` puts a
//! Kubernetes pod's annotations, and the compatible API shows neither (the
//! first 4xx answer to it says the runtime is Docker). A container's cgroup is
//! read from its first process's `/proc/PID/cgroup`, which is right for every
//! runtime and cgroup driver (cgroupfs or systemd, v1 or v2) without knowing
//! their path conventions. containerd speaks gRPC with no such API; on
//! Kubernetes nodes its containers are found by the kubelet's layout.
//!
//! Written on `std::os::unix::net::UnixStream` with `httparse` for the
//! response head, not an HTTP client crate: the control thread asks between
//! intervals with a hard deadline and no async runtime, and the blocking
//! clients (ureq) do not speak to unix sockets. Requests are HTTP/1.0, so
//! the answer ends with the connection; a chunked one is still decoded.

use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The API version asked for: 1.41 is Docker 20.10's and podman 3's and
/// later's compatible API; both answer it.
const API_VERSION: &str = "v1.41";
/// podman's own API, as podman 3 and later answer it.
const LIBPOD_API: &str = "v3.0.0/libpod";
/// The most of an answer read: a listing of a few thousand containers.
const MAX_ANSWER: usize = 16 << 20;

/// A running container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    pub id: String,
    /// Its name, without the API's leading `/`.
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Its OCI annotations (podman's API only): a pod's, where `podman kube
    /// play` made it from a Kubernetes pod.
    pub annotations: BTreeMap<String, String>,
    /// The name of the pod it runs in (podman's API only).
    pub pod: Option<String>,
    /// Its cgroup, relative to the root of the hierarchy that holds the
    /// I/O controller.
    pub cgroup: PathBuf,
}

/// Why a runtime could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{socket}: cannot connect: {source}")]
    Connect {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("{socket}: no answer to {request} within {timeout:?}")]
    Timeout {
        socket: PathBuf,
        request: String,
        timeout: Duration,
    },
    #[error("{socket}: {request}: {source}")]
    Io {
        socket: PathBuf,
        request: String,
        source: std::io::Error,
    },
    /// An answer that is not the API's: not HTTP, an error status, JSON of
    /// another shape, or too long.
    #[error("{socket}: {request}: {problem}")]
    Garbage {
        socket: PathBuf,
        request: String,
        problem: String,
    },
}

/// One runtime's API socket, with the first process of each container it
/// has seen (inspected once per start; its cgroup is read again at every
/// look, so a process gone or a PID reused is noticed).
#[derive(Debug)]
pub struct RuntimeClient {
    socket: PathBuf,
    /// For one whole look: the listing and every inspect it needs.
    timeout: Duration,
    /// By container ID: its first process and its annotations.
    known: HashMap<String, Known>,
    /// Whether the socket answers podman's own API: not known until the
    /// first listing that gets an answer.
    libpod: Option<bool>,
}

#[derive(Debug)]
struct Known {
    pid: u32,
    annotations: BTreeMap<String, String>,
}

/// A container in a listing: what both APIs give.
#[derive(Deserialize)]
struct Listed {
    #[serde(rename = "Id")]
    id: String,
    #[serde(rename = "Names", default)]
    names: Vec<String>,
    #[serde(rename = "Labels", default)]
    labels: Option<BTreeMap<String, String>>,
}

impl Listed {
    /// Its first name, without the compatible API's leading `/`.
    fn name(&self) -> Option<String> {
        self.names
            .first()
            .map(|n| n.trim_start_matches('/').to_string())
    }
}

#[derive(Deserialize)]
struct Inspected {
    #[serde(rename = "State")]
    state: InspectedState,
}

/// A container in podman's own listing: also its process and pod.
#[derive(Deserialize)]
struct LibpodListed {
    #[serde(flatten)]
    listed: Listed,
    #[serde(rename = "PodName", default)]
    pod: String,
    #[serde(rename = "Pid", default)]
    pid: i64,
    /// A pod's infra (pause) container: not a workload.
    #[serde(rename = "IsInfra", default)]
    infra: bool,
}

#[derive(Deserialize)]
struct LibpodInspected {
    #[serde(rename = "Config")]
    config: LibpodConfig,
}

#[derive(Deserialize)]
struct LibpodConfig {
    #[serde(rename = "Annotations", default)]
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
struct InspectedState {
    #[serde(rename = "Pid", default)]
    pid: i64,
}

impl RuntimeClient {
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> RuntimeClient {
        RuntimeClient {
            socket: socket.into(),
            timeout,
            known: HashMap::new(),
            libpod: None,
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The running containers with their cgroups in the hierarchy of
    /// `version`. A container that stops between the listing and the
    /// reading of its cgroup is left out: it is found again, or not, at
    /// the next look.
    pub fn containers(
        &mut self,
        version: crate::Version,
    ) -> Result<Vec<ContainerInfo>, RuntimeError> {
        let deadline = Instant::now() + self.timeout;
        let out = if self.libpod == Some(false) {
            self.compatible_containers(version, deadline)?
        } else {
            match self.libpod_containers(version, deadline) {
                Ok(out) => {
                    self.libpod = Some(true);
                    out
                }
                // Docker: no such path, or no such API version.
                Err(RuntimeError::Garbage { problem, .. })
                    if self.libpod.is_none() && problem.starts_with("HTTP 4") =>
                {
                    self.libpod = Some(false);
                    self.compatible_containers(version, deadline)?
                }
                Err(e) => return Err(e),
            }
        };
        let running: std::collections::HashSet<&str> = out.iter().map(|c| c.id.as_str()).collect();
        self.known.retain(|id, _| running.contains(id.as_str()));
        Ok(out)
    }

    /// [`RuntimeClient::containers`] from the Docker-compatible API.
    fn compatible_containers(
        &mut self,
        version: crate::Version,
        deadline: Instant,
    ) -> Result<Vec<ContainerInfo>, RuntimeError> {
        let request = format!("/{API_VERSION}/containers/json");
        let listed: Vec<Listed> = self.get_json(&request, deadline)?;
        let mut out = Vec::with_capacity(listed.len());
        for c in listed {
            let Some(name) = c.name() else {
                continue;
            };
            if let Some(cgroup) = self.cgroup_of(&c.id, version, deadline)? {
                out.push(ContainerInfo {
                    id: c.id,
                    name,
                    labels: c.labels.unwrap_or_default(),
                    annotations: BTreeMap::new(),
                    pod: None,
                    cgroup,
                });
            }
        }
        Ok(out)
    }

    /// [`RuntimeClient::containers`] from podman's own API: the listing
    /// gives each process and pod; a container's annotations are inspected
    /// once per start. Pods' infra containers are left out.
    fn libpod_containers(
        &mut self,
        version: crate::Version,
        deadline: Instant,
    ) -> Result<Vec<ContainerInfo>, RuntimeError> {
        let request = format!("/{LIBPOD_API}/containers/json");
        let listed: Vec<LibpodListed> = self.get_json(&request, deadline)?;
        let mut out = Vec::with_capacity(listed.len());
        for c in listed.into_iter().filter(|c| !c.infra) {
            let id = c.listed.id.as_str();
            self.check_id(id, &request)?;
            let (Some(name), Ok(pid)) = (c.listed.name(), u32::try_from(c.pid)) else {
                continue;
            };
            let Some(cgroup) = process_cgroup(pid, version) else {
                continue;
            };
            if self.known.get(id).is_none_or(|k| k.pid != pid) {
                let inspect = format!("/{LIBPOD_API}/containers/{id}/json");
                let inspected: LibpodInspected = match self.get_json(&inspect, deadline) {
                    Ok(i) => i,
                    Err(RuntimeError::Garbage { problem, .. })
                        if problem.starts_with("HTTP 404") =>
                    {
                        continue
                    }
                    Err(e) => return Err(e),
                };
                let annotations = inspected.config.annotations.unwrap_or_default();
                self.known
                    .insert(id.to_string(), Known { pid, annotations });
            }
            out.push(ContainerInfo {
                annotations: self.known[id].annotations.clone(),
                id: c.listed.id.clone(),
                name,
                labels: c.listed.labels.unwrap_or_default(),
                pod: (!c.pod.is_empty()).then_some(c.pod),
                cgroup,
            });
        }
        Ok(out)
    }

    /// An ID put in a request's path: letters and digits only.
    fn check_id(&self, id: &str, listing: &str) -> Result<(), RuntimeError> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(self.garbage(listing, format!("container ID `{id}` is not an ID")));
        }
        Ok(())
    }

    /// A container's cgroup, read from its first process (inspected when
    /// not known). `None`: it has no process (stopped since listed), its
    /// process is gone, or its cgroup is not in this host's view (another
    /// cgroup namespace: iofloor in a container without the host's PIDs).
    fn cgroup_of(
        &mut self,
        id: &str,
        version: crate::Version,
        deadline: Instant,
    ) -> Result<Option<PathBuf>, RuntimeError> {
        if let Some(cgroup) = self
            .known
            .get(id)
            .and_then(|k| process_cgroup(k.pid, version))
        {
            return Ok(Some(cgroup));
        }
        self.check_id(id, "/containers/json")?;
        let request = format!("/{API_VERSION}/containers/{id}/json");
        let inspected: Inspected = match self.get_json(&request, deadline) {
            Ok(i) => i,
            // Removed since it was listed.
            Err(RuntimeError::Garbage { problem, .. }) if problem.starts_with("HTTP 404") => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let pid = u32::try_from(inspected.state.pid).unwrap_or(0);
        if pid == 0 {
            return Ok(None);
        }
        let cgroup = process_cgroup(pid, version);
        if cgroup.is_some() {
            self.known.insert(
                id.to_string(),
                Known {
                    pid,
                    annotations: BTreeMap::new(),
                },
            );
        }
        Ok(cgroup)
    }

    fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        request: &str,
        deadline: Instant,
    ) -> Result<T, RuntimeError> {
        let body = self.get(request, deadline)?;
        serde_json::from_slice(&body)
            .map_err(|e| self.garbage(request, format!("not the API's JSON: {e}")))
    }

    /// The body of `GET request`, by `deadline` (the look's).
    fn get(&self, request: &str, deadline: Instant) -> Result<Vec<u8>, RuntimeError> {
        let io = |source: std::io::Error| {
            if matches!(
                source.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                RuntimeError::Timeout {
                    socket: self.socket.clone(),
                    request: request.to_string(),
                    timeout: self.timeout,
                }
            } else {
                RuntimeError::Io {
                    socket: self.socket.clone(),
                    request: request.to_string(),
                    source,
                }
            }
        };
        let left = || match deadline.saturating_duration_since(Instant::now()) {
            left if left.is_zero() => Err(io(std::io::ErrorKind::TimedOut.into())),
            left => Ok(left),
        };
        let mut stream =
            UnixStream::connect(&self.socket).map_err(|source| RuntimeError::Connect {
                socket: self.socket.clone(),
                source,
            })?;
        stream.set_write_timeout(Some(left()?)).map_err(io)?;
        let head =
            format!("GET {request} HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).map_err(io)?;
        let mut answer = Vec::new();
        let mut chunk = [0u8; 64 * 1024];
        loop {
            stream.set_read_timeout(Some(left()?)).map_err(io)?;
            let n = stream.read(&mut chunk).map_err(io)?;
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&chunk[..n]);
            if answer.len() > MAX_ANSWER {
                return Err(self.garbage(request, format!("answer longer than {MAX_ANSWER} bytes")));
            }
        }
        self.body(request, &answer)
    }

    /// The body of a whole HTTP answer, if its status is 200.
    fn body(&self, request: &str, answer: &[u8]) -> Result<Vec<u8>, RuntimeError> {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut response = httparse::Response::new(&mut headers);
        let head = match response.parse(answer) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => {
                return Err(self.garbage(request, "the answer ended in its head".into()))
            }
            Err(e) => return Err(self.garbage(request, format!("not HTTP: {e}"))),
        };
        let body = &answer[head..];
        let status = response.code.unwrap_or(0);
        if status != 200 {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
            return Err(self.garbage(request, format!("HTTP {status}: {}", text.trim())));
        }
        let chunked = response.headers.iter().any(|h| {
            h.name.eq_ignore_ascii_case("transfer-encoding")
                && String::from_utf8_lossy(h.value)
                    .to_ascii_lowercase()
                    .contains("chunked")
        });
        if chunked {
            dechunk(body).ok_or_else(|| self.garbage(request, "a broken chunked body".into()))
        } else {
            Ok(body.to_vec())
        }
    }

    fn garbage(&self, request: &str, problem: String) -> RuntimeError {
        RuntimeError::Garbage {
            socket: self.socket.clone(),
            request: request.to_string(),
            problem,
        }
    }
}

/// A chunked body decoded; `None` if it is not one.
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let (len, rest) = match httparse::parse_chunk_size(body) {
            Ok(httparse::Status::Complete((used, len))) => (len, &body[used..]),
            _ => return None,
        };
        if len == 0 {
            return Some(out);
        }
        let len = usize::try_from(len).ok()?;
        let data = rest.get(..len)?;
        out.extend_from_slice(data);
        body = rest.get(len..)?.strip_prefix(b"\r\n")?;
    }
}

/// The I/O controller's cgroup of process `pid`, if it runs and its cgroup
/// is in this host's view.
fn process_cgroup(pid: u32, version: crate::Version) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    io_cgroup(&text, version)
}

/// The cgroup of the I/O controller in a `/proc/PID/cgroup` text: v1's
/// `blkio` line, or v2's unified `0::` line.
pub fn io_cgroup(text: &str, version: crate::Version) -> Option<PathBuf> {
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let ours = match version {
            crate::Version::V1 => controllers.split(',').any(|c| c == "blkio"),
            crate::Version::V2 => id == "0" && controllers.is_empty(),
        };
        let path = path.trim_start_matches('/');
        (ours && !path.split('/').any(|p| p == "..")).then(|| PathBuf::from(path))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A runtime socket that answers each connection with the next of
    /// `answers` (after `delay`), and the requests it got.
    fn fake_runtime(
        answers: Vec<Vec<u8>>,
        delay: Duration,
    ) -> (
        tempfile::TempDir,
        PathBuf,
        std::thread::JoinHandle<Vec<String>>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("api.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let server = std::thread::spawn(move || {
            let mut requests = Vec::new();
            for answer in answers {
                let (mut s, _) = listener.accept().unwrap();
                let mut buf = [0u8; 4096];
                let n = s.read(&mut buf).unwrap();
                requests.push(String::from_utf8_lossy(&buf[..n]).to_string());
                std::thread::sleep(delay);
                let _ = s.write_all(&answer);
            }
            requests
        });
        (dir, socket, server)
    }

    fn ok(body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    #[test]
    fn a_listing_gives_names_labels_and_each_cgroup_from_its_process() {
        let me = std::process::id();
        let own = io_cgroup(
            &std::fs::read_to_string("/proc/self/cgroup").unwrap(),
            crate::Version::V2,
        );
        let listing = r#"[{"Id":"abc123","Names":["/db-1"],"Labels":{"app":"pg","io.iofloor.floor":"500iops"}},
                          {"Id":"def456","Names":["/gone"],"Labels":null}]"#;
        let (_dir, socket, server) = fake_runtime(
            vec![
                b"HTTP/1.0 404 Not Found\r\n\r\n{\"message\":\"page not found\"}".to_vec(),
                ok(listing),
                ok(&format!(r#"{{"State":{{"Pid":{me}}}}}"#)),
                b"HTTP/1.0 404 Not Found\r\n\r\n{\"message\":\"no such container\"}".to_vec(),
            ],
            Duration::ZERO,
        );
        let mut client = RuntimeClient::new(&socket, Duration::from_secs(5));
        let found = client.containers(crate::Version::V2).unwrap();
        let requests = server.join().unwrap();
        assert!(requests[0].starts_with("GET /v3.0.0/libpod/containers/json HTTP/1.0\r\n"));
        assert!(requests[1].starts_with("GET /v1.41/containers/json HTTP/1.0\r\n"));
        assert!(requests[2].starts_with("GET /v1.41/containers/abc123/json "));
        match own {
            Some(cgroup) => {
                assert_eq!(found.len(), 1, "{found:?}");
                assert_eq!(found[0].name, "db-1");
                assert_eq!(found[0].labels["app"], "pg");
                assert_eq!(found[0].cgroup, cgroup);
            }
            // This host has no unified line (v1 only): nothing to read.
            None => assert!(found.is_empty()),
        }
    }

    #[test]
    fn podman_s_own_api_gives_pods_and_annotations_inspected_once_per_start() {
        let me = std::process::id();
        let own = io_cgroup(
            &std::fs::read_to_string("/proc/self/cgroup").unwrap(),
            crate::Version::V1,
        );
        let listing = format!(
            r#"[{{"Id":"aa11","Names":["pgpod-infra"],"PodName":"pgpod","Pid":{me},"IsInfra":true}},
                {{"Id":"bb22","Names":["pgpod-db"],"Labels":{{"app":"pg"}},"PodName":"pgpod","Pid":{me},"IsInfra":false}},
                {{"Id":"cc33","Names":["solo"],"Labels":null,"PodName":"","Pid":{me}}},
                {{"Id":"dd44","Names":["stopped"],"PodName":"","Pid":0}}]"#
        );
        let annotated = r#"{"Config":{"Annotations":{"io.iofloor.floor":"300iops"}}}"#;
        let (_dir, socket, server) = fake_runtime(
            vec![
                ok(&listing),
                ok(annotated),
                ok(r#"{"Config":{"Annotations":null}}"#),
                ok(&listing),
            ],
            Duration::ZERO,
        );
        let mut client = RuntimeClient::new(&socket, Duration::from_secs(5));
        let first = client.containers(crate::Version::V1).unwrap();
        let again = client.containers(crate::Version::V1).unwrap();
        let requests = server.join().unwrap();
        if own.is_none() {
            // No blkio line here: nothing to read.
            assert!(first.is_empty());
            return;
        }
        assert_eq!(first, again, "the second look inspects nothing");
        assert_eq!(requests.len(), 4, "{requests:?}");
        assert!(requests[1].starts_with("GET /v3.0.0/libpod/containers/bb22/json "));
        let names: Vec<(&str, Option<&str>)> = first
            .iter()
            .map(|c| (c.name.as_str(), c.pod.as_deref()))
            .collect();
        assert_eq!(names, [("pgpod-db", Some("pgpod")), ("solo", None)]);
        assert_eq!(first[0].annotations["io.iofloor.floor"], "300iops");
        assert_eq!(first[0].labels["app"], "pg");
        assert!(first[1].annotations.is_empty());
    }

    #[test]
    fn garbage_errors_and_silence_are_clear_errors_naming_the_socket() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"SSH-2.0-OpenSSH\r\n".to_vec(), "not HTTP"),
            (ok("{\"not\": \"a list\"}"), "not the API's JSON"),
            (
                ok("[{\"Id\":\"../../etc\",\"Names\":[\"/x\"]}]"),
                "is not an ID",
            ),
            (
                b"HTTP/1.0 500 Oops\r\n\r\ninternal".to_vec(),
                "HTTP 500: internal",
            ),
            (b"HTTP/1.0 200 OK\r\nContent-".to_vec(), "ended in its head"),
        ];
        for (answer, expected) in cases {
            let (_dir, socket, server) = fake_runtime(vec![answer], Duration::ZERO);
            let mut client = RuntimeClient::new(&socket, Duration::from_secs(5));
            let err = client
                .containers(crate::Version::V1)
                .unwrap_err()
                .to_string();
            server.join().unwrap();
            assert!(err.contains(expected), "{err}");
            assert!(err.contains("api.sock"), "{err}");
        }
        let (_dir, socket, _server) = fake_runtime(vec![ok("[]")], Duration::from_secs(3));
        let mut client = RuntimeClient::new(&socket, Duration::from_millis(200));
        let err = client.containers(crate::Version::V1).unwrap_err();
        assert!(matches!(err, RuntimeError::Timeout { .. }), "{err}");
        let mut client = RuntimeClient::new("/nonexistent/docker.sock", Duration::from_secs(1));
        let err = client
            .containers(crate::Version::V1)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/nonexistent/docker.sock: cannot connect"),
            "{err}"
        );
    }

    #[test]
    fn a_chunked_answer_is_decoded() {
        let answer =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n[\r\n1\r\n]\r\n0\r\n\r\n";
        let (_dir, socket, server) = fake_runtime(vec![answer.to_vec()], Duration::ZERO);
        let mut client = RuntimeClient::new(&socket, Duration::from_secs(5));
        assert!(client.containers(crate::Version::V1).unwrap().is_empty());
        server.join().unwrap();
        assert_eq!(dechunk(b"5\r\nab"), None);
    }

    #[test]
    fn the_io_cgroup_is_blkio_on_v1_and_the_unified_line_on_v2() {
        let text =
            "9:name=systemd:/libpod_parent/libpod-ab\n7:blkio:/libpod_parent/libpod-ab\n0::/x/y\n";
        assert_eq!(
            io_cgroup(text, crate::Version::V1),
            Some(PathBuf::from("libpod_parent/libpod-ab"))
        );
        assert_eq!(
            io_cgroup(text, crate::Version::V2),
            Some(PathBuf::from("x/y"))
        );
        assert_eq!(io_cgroup("7:cpu,blkio:/a/../b\n", crate::Version::V1), None);
        assert_eq!(io_cgroup("garbage", crate::Version::V1), None);
    }
}
