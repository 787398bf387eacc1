//! Coordination behind a small trait: a lease that dies with the agent,
//! keys bound to it, an election, and writes fenced on leadership. etcd
//! implements it here ([`Etcd`]); a Kubernetes backend would map the lease
//! to a `coordination.k8s.io` Lease object and the fenced write to an
//! update conditioned on its `resourceVersion` (docs/cluster.md).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoordError {
    #[error("{0}")]
    Unavailable(String),
    #[error("the lease expired")]
    LeaseExpired,
}

pub type Lease = i64;

/// Won leadership: the election key and its create revision, which is the
/// allocator's epoch and the fence of its writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Leadership {
    pub key: Vec<u8>,
    pub epoch: i64,
}

pub trait Coordinator: Clone + Send + Sync + 'static {
    fn grant_lease(
        &mut self,
        ttl: Duration,
    ) -> impl Future<Output = Result<Lease, CoordError>> + Send;

    /// Renews the lease once; `LeaseExpired` when it is gone.
    fn keep_alive(&mut self, lease: Lease) -> impl Future<Output = Result<(), CoordError>> + Send;

    fn revoke(&mut self, lease: Lease) -> impl Future<Output = Result<(), CoordError>> + Send;

    /// Creates `key` bound to `lease` unless it exists; returns the value
    /// already there when it does (someone else's claim).
    fn create(
        &mut self,
        key: &str,
        value: Vec<u8>,
        lease: Lease,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, CoordError>> + Send;

    fn put(
        &mut self,
        key: &str,
        value: Vec<u8>,
        lease: Option<Lease>,
    ) -> impl Future<Output = Result<(), CoordError>> + Send;

    fn get(
        &mut self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, CoordError>> + Send;

    fn delete(&mut self, key: &str) -> impl Future<Output = Result<(), CoordError>> + Send;

    fn get_prefix(
        &mut self,
        prefix: &str,
    ) -> impl Future<Output = Result<Vec<(String, Vec<u8>)>, CoordError>> + Send;

    /// Waits until this candidate leads `election`.
    fn campaign(
        &mut self,
        election: &str,
        value: Vec<u8>,
        lease: Lease,
    ) -> impl Future<Output = Result<Leadership, CoordError>> + Send;

    /// The value of the current leader of `election`, if any.
    fn leader(
        &mut self,
        election: &str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, CoordError>> + Send;

    /// Writes all of `kvs` if `leadership` still holds, none otherwise;
    /// returns whether it held.
    fn put_fenced(
        &mut self,
        leadership: &Leadership,
        kvs: Vec<(String, Vec<u8>)>,
    ) -> impl Future<Output = Result<bool, CoordError>> + Send;
}

/// How to reach etcd, as its clients expect it. Its `Debug` leaves the
/// password out.
#[derive(Clone, Default, PartialEq)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    pub user: Option<(String, String)>,
    /// PEM files: the CA that signed the servers' certificates, and this
    /// client's certificate and key for mutual TLS.
    pub ca_file: Option<std::path::PathBuf>,
    pub cert_file: Option<std::path::PathBuf>,
    pub key_file: Option<std::path::PathBuf>,
    /// Each request's deadline: a partitioned host must notice within an
    /// interval, not after TCP gives up.
    pub request_timeout: Duration,
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("endpoints", &self.endpoints)
            .field(
                "user",
                &self.user.as_ref().map(|(user, _)| (user, "<redacted>")),
            )
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// One etcd member and its client, made on first use (with auth, making a
/// client asks the member for a token, which a dead member cannot give).
struct Member {
    url: String,
    client: tokio::sync::Mutex<Option<etcd_client::Client>>,
}

/// etcd v3 over gRPC, one member at a time.
///
/// Why not one client balanced over all endpoints, as `etcd_client` offers:
/// its balancer keeps a dead member in rotation (a refused connection is
/// reported on the request, not as the member being unready), so with one
/// of three members killed about every third request failed and an agent
/// on the test bed fell back to its local rule for good. Here requests stay
/// on one member and move to the next when it fails to answer.
#[derive(Clone)]
pub struct Etcd {
    members: Arc<Vec<Member>>,
    /// The member requests go to.
    current: Arc<AtomicUsize>,
    connect: etcd_client::ConnectOptions,
    timeout: Duration,
}

fn unavailable(e: impl std::fmt::Display) -> CoordError {
    let message = e.to_string();
    // etcd's answer to a keep-alive or a put on a revoked or expired lease.
    if message.contains("requested lease not found") {
        return CoordError::LeaseExpired;
    }
    CoordError::Unavailable(message)
}

/// etcd's answer to `leader` when nobody campaigns: an answer, not a
/// member failing.
const NO_LEADER: &str = "election: no leader";

impl Etcd {
    /// Connects to the endpoints; fails when none answers within the
    /// request timeout.
    pub async fn connect(options: &EtcdOptions) -> Result<Etcd, CoordError> {
        let mut connect = etcd_client::ConnectOptions::new()
            .with_connect_timeout(options.request_timeout)
            .with_keep_alive(Duration::from_secs(1), options.request_timeout);
        if let Some((user, password)) = &options.user {
            connect = connect.with_user(user, password);
        }
        if options.ca_file.is_some() || options.cert_file.is_some() {
            let mut tls = etcd_client::TlsOptions::new();
            if let Some(ca) = &options.ca_file {
                let pem = std::fs::read(ca)
                    .map_err(|e| unavailable(format!("`ca_file` {}: {e}", ca.display())))?;
                tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
            }
            match (&options.cert_file, &options.key_file) {
                (Some(cert), Some(key)) => {
                    let read = |p: &std::path::Path, field: &str| {
                        std::fs::read(p)
                            .map_err(|e| unavailable(format!("`{field}` {}: {e}", p.display())))
                    };
                    tls = tls.identity(etcd_client::Identity::from_pem(
                        read(cert, "cert_file")?,
                        read(key, "key_file")?,
                    ));
                }
                (None, None) => {}
                _ => {
                    return Err(unavailable(
                        "`cert_file` and `key_file` go together (mutual TLS)",
                    ))
                }
            }
            connect = connect.with_tls(tls);
        }
        if options.endpoints.is_empty() {
            return Err(unavailable("no etcd endpoints"));
        }
        let mut etcd = Etcd {
            members: Arc::new(
                options
                    .endpoints
                    .iter()
                    .map(|url| Member {
                        url: url.clone(),
                        client: tokio::sync::Mutex::new(None),
                    })
                    .collect(),
            ),
            current: Arc::new(AtomicUsize::new(0)),
            connect,
            timeout: options.request_timeout,
        };
        // A connection is lazy: make one request so wrong endpoints fail here.
        etcd.get("/iofloor-connect-check")
            .await
            .map_err(|e| unavailable(format!("no answer from {:?}: {e}", options.endpoints)))?;
        Ok(etcd)
    }

    /// The lease a key is bound to, for tools and tests (`None`: no key).
    pub async fn lease_of(&mut self, key: &str) -> Result<Option<Lease>, CoordError> {
        let key = key.to_string();
        let r = self
            .call(move |mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await?;
        Ok(r.kvs().first().map(|kv| kv.lease()))
    }

    /// The client of member `i`, made if it is not yet.
    async fn client(&self, i: usize) -> Result<etcd_client::Client, CoordError> {
        let member = &self.members[i];
        let mut slot = member.client.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = tokio::time::timeout(
            self.timeout,
            etcd_client::Client::connect([member.url.as_str()], Some(self.connect.clone())),
        )
        .await
        .map_err(|_| {
            unavailable(format!(
                "{} did not answer within {:?}",
                member.url, self.timeout
            ))
        })?
        .map_err(unavailable)?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Runs `op` on the current member within the request timeout; when
    /// the member fails to answer, moves to the next and tries again in the
    /// time left. A refused connection fails at once, so a dead member costs
    /// little; a silent one is given half of the time left, so a live member
    /// is still tried, and a host cut off from all of them still knows
    /// within the whole timeout.
    async fn call<T, F, Fut>(&self, op: F) -> Result<T, CoordError>
    where
        F: Fn(etcd_client::Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let n = self.members.len();
        let mut last = None;
        for attempt_no in 0..n {
            let i = self.current.load(Ordering::Relaxed) % n;
            let attempt = async {
                let c = self.client(i).await?;
                op(c).await.map_err(unavailable)
            };
            // A member killed mid-connection may not answer at all rather
            // than refuse: with the whole timeout on it, the request failed
            // without trying a live member (a CI run of the etcd test). Each
            // attempt but the last gets half of what is left.
            let until = if attempt_no + 1 < n {
                let now = tokio::time::Instant::now();
                now + deadline.saturating_duration_since(now) / 2
            } else {
                deadline
            };
            let outcome = match tokio::time::timeout_at(until, attempt).await {
                Ok(outcome) => outcome,
                Err(_) => Err(unavailable(format!(
                    "etcd did not answer within {:?}",
                    self.timeout
                ))),
            };
            match outcome {
                Err(CoordError::Unavailable(m)) if !m.contains(NO_LEADER) => {
                    // Another task may have moved on already.
                    let _ = self.current.compare_exchange(
                        i,
                        (i + 1) % n,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    last = Some(CoordError::Unavailable(format!(
                        "{}: {m}",
                        self.members[i].url
                    )));
                    if tokio::time::Instant::now() >= deadline {
                        break;
                    }
                }
                other => return other,
            }
        }
        Err(last.unwrap_or_else(|| unavailable("etcd did not answer")))
    }
}

impl Coordinator for Etcd {
    async fn grant_lease(&mut self, ttl: Duration) -> Result<Lease, CoordError> {
        let ttl = ttl.as_secs().max(1) as i64;
        let r = self
            .call(|mut c| async move { c.lease_grant(ttl, None).await })
            .await?;
        Ok(r.id())
    }

    async fn keep_alive(&mut self, lease: Lease) -> Result<(), CoordError> {
        let answer = self
            .call(|mut c| async move {
                let (mut keeper, mut stream) = c.lease_keep_alive(lease).await?;
                keeper.keep_alive().await?;
                stream.message().await
            })
            .await?;
        match answer {
            Some(r) if r.ttl() > 0 => Ok(()),
            _ => Err(CoordError::LeaseExpired),
        }
    }

    async fn revoke(&mut self, lease: Lease) -> Result<(), CoordError> {
        self.call(|mut c| async move { c.lease_revoke(lease).await })
            .await
            .map(|_| ())
    }

    async fn create(
        &mut self,
        key: &str,
        value: Vec<u8>,
        lease: Lease,
    ) -> Result<Option<Vec<u8>>, CoordError> {
        use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                value,
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let r = self
            .call(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        if r.succeeded() {
            return Ok(None);
        }
        let existing = r.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        });
        // Deleted between the compare and the get: taken all the same.
        Ok(Some(existing.unwrap_or_default()))
    }

    async fn put(
        &mut self,
        key: &str,
        value: Vec<u8>,
        lease: Option<Lease>,
    ) -> Result<(), CoordError> {
        self.call(|mut c| {
            let options = lease.map(|l| etcd_client::PutOptions::new().with_lease(l));
            let (key, value) = (key.to_string(), value.clone());
            async move { c.put(key, value, options).await }
        })
        .await
        .map(|_| ())
    }

    async fn delete(&mut self, key: &str) -> Result<(), CoordError> {
        self.call(|mut c| {
            let key = key.to_string();
            async move { c.delete(key, None).await }
        })
        .await
        .map(|_| ())
    }

    async fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, CoordError> {
        let r = self
            .call(|mut c| {
                let key = key.to_string();
                async move { c.get(key, None).await }
            })
            .await?;
        Ok(r.kvs().first().map(|kv| kv.value().to_vec()))
    }

    async fn get_prefix(&mut self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, CoordError> {
        let r = self
            .call(|mut c| {
                let prefix = prefix.to_string();
                async move {
                    c.get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
                        .await
                }
            })
            .await?;
        Ok(r.kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    kv.value().to_vec(),
                )
            })
            .collect())
    }

    async fn campaign(
        &mut self,
        election: &str,
        value: Vec<u8>,
        lease: Lease,
    ) -> Result<Leadership, CoordError> {
        // No deadline: a campaign waits for as long as another leads. A
        // member that fails moves requests to the next; the caller retries.
        let i = self.current.load(Ordering::Relaxed) % self.members.len();
        let mut c = self.client(i).await?;
        let r = match c.campaign(election, value, lease).await {
            Ok(r) => r,
            Err(e) => {
                let n = self.members.len();
                let _ = self.current.compare_exchange(
                    i,
                    (i + 1) % n,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                return Err(unavailable(e));
            }
        };
        let leader = r
            .leader()
            .ok_or_else(|| unavailable("campaign answered without a leader key"))?;
        Ok(Leadership {
            key: leader.key().to_vec(),
            epoch: leader.rev(),
        })
    }

    async fn leader(&mut self, election: &str) -> Result<Option<Vec<u8>>, CoordError> {
        let answer = self
            .call(|mut c| {
                let election = election.to_string();
                async move { c.leader(election).await }
            })
            .await;
        match answer {
            Ok(r) => Ok(r.kv().map(|kv| kv.value().to_vec())),
            // etcd answers "no leader" as an error.
            Err(CoordError::Unavailable(e)) if e.contains(NO_LEADER) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn put_fenced(
        &mut self,
        leadership: &Leadership,
        kvs: Vec<(String, Vec<u8>)>,
    ) -> Result<bool, CoordError> {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        // etcd takes at most 128 operations per transaction (--max-txn-ops);
        // each chunk carries the fence, so none lands after leadership is lost.
        for chunk in kvs.chunks(100) {
            let txn = Txn::new()
                .when([Compare::create_revision(
                    leadership.key.clone(),
                    CompareOp::Equal,
                    leadership.epoch,
                )])
                .and_then(
                    chunk
                        .iter()
                        .map(|(k, v)| TxnOp::put(k.as_str(), v.clone(), None))
                        .collect::<Vec<_>>(),
                );
            let answer = self
                .call(|mut c| {
                    let txn = txn.clone();
                    async move { c.txn(txn).await }
                })
                .await?;
            if !answer.succeeded() {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
