//! The iofloor service (`iofloor run`): reads a config ([`config`]), finds the
//! tenants it names — cgroups and QEMU monitors, by path or glob
//! ([`discovery`]) — and runs the same policy code as the simulator and the
//! bench against the host backends, once per interval, on a thread of its own
//! ([`service`]). It owns the throttles it writes: their previous values are
//! recorded before the first write and restored on shutdown or, after a
//! crash, on the next start ([`ownership`]). What it does is visible through
//! Prometheus metrics ([`metrics`]), a JSON API with a live sample stream and a
//! dashboard page ([`api`], [`view`]); floors can be changed and the config
//! reloaded at run time.

pub mod api;
pub mod config;
pub mod containers;
pub mod discovery;
pub mod kubernetes;
pub mod limits;
pub mod memory;
pub mod metrics;
pub mod ownership;
pub mod service;
pub mod view;

use crate::api::ApiState;
use crate::config::Config;
use crate::service::{ClusterLink, Command, Service, Shared};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tracing::{info, warn};

/// Runs the daemon until SIGTERM or SIGINT, then restores every limit it
/// set. SIGHUP reloads the config. Errors before the first interval (config,
/// listeners, cgroups, cost models) return before anything was written.
pub fn run(config: Config) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let result = runtime.block_on(serve(config));
    // Open API connections (a dashboard's event stream) must not delay exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    result
}

async fn serve(config: Config) -> anyhow::Result<()> {
    // Signals first: a SIGTERM during start-up must not kill us half-way.
    let mut signals = Signals::install()?;
    let listeners = ApiListeners::bind(&config).await?;
    let etcd = connect_etcd(&config).await?;
    let shared = shared_state(&config);
    let unix_path = config.api.unix_socket.clone();
    let service = {
        let shared = shared.clone();
        tokio::task::spawn_blocking(move || Service::new(config, shared)).await??
    };
    // Joins before the first interval: a host name another agent holds is
    // refused before any tenant is touched.
    let agent = match join_cluster(etcd, &service, &shared).await {
        Ok(agent) => agent,
        Err(e) => {
            // Nothing was adopted yet: this only removes the state file.
            tokio::task::spawn_blocking(move || service.stop_before_start()).await??;
            return Err(e);
        }
    };
    let (commands, control) = start_control_thread(service)?;
    listeners.serve(&shared, &commands)?;
    signals.until_stop(&commands).await;
    shut_down(&commands, control, agent, unix_path).await
}

/// The signals the daemon answers: SIGTERM and SIGINT stop it, SIGHUP
/// reloads the config.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// Returns on SIGTERM or SIGINT. A SIGHUP's reload is not waited on:
    /// the control thread logs its outcome and counts it in the metrics, and
    /// a stop signal must be heard meanwhile.
    async fn until_stop(&mut self, commands: &Sender<Command>) {
        loop {
            tokio::select! {
                _ = self.term.recv() => { info!("SIGTERM: restoring limits and stopping"); return; }
                _ = self.int.recv() => { info!("SIGINT: restoring limits and stopping"); return; }
                _ = self.hup.recv() => {
                    info!("SIGHUP: reloading the config");
                    let _ = commands.send(Command::Reload { reply: None });
                }
            }
        }
    }
}

/// The API's listeners, bound before the service starts: an address in use
/// is an error at start, before any limit is written.
struct ApiListeners {
    tcp: Option<tokio::net::TcpListener>,
    unix: Option<tokio::net::UnixListener>,
}

impl ApiListeners {
    async fn bind(config: &Config) -> anyhow::Result<ApiListeners> {
        let tcp = match config.api.listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| anyhow::anyhow!("`api.listen` {addr}: {e}"))?,
            ),
            None => None,
        };
        let unix = match &config.api.unix_socket {
            Some(path) => Some(bind_unix(path)?),
            None => None,
        };
        Ok(ApiListeners { tcp, unix })
    }

    /// Serves the API on each listener. Requests through the unix socket
    /// may change state without the token: the socket's permissions are
    /// its access control.
    fn serve(self, shared: &Arc<Shared>, commands: &Sender<Command>) -> anyhow::Result<()> {
        let state = |via_unix| ApiState {
            shared: shared.clone(),
            commands: commands.clone(),
            via_unix,
        };
        if let Some(listener) = self.tcp {
            info!("API and dashboard on http://{}", listener.local_addr()?);
            spawn_api(listener, state(false));
        }
        if let Some(listener) = self.unix {
            spawn_api(listener, state(true));
        }
        Ok(())
    }
}

/// Serves the API on `listener` in a task of its own. The listener bounds
/// open connections because axum's `serve` has no such bound.
fn spawn_api<L>(listener: L, state: ApiState)
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let app = api::router(state);
    let listener = limits::BoundedListener::new(listener, limits::MAX_CONNECTIONS);
    tokio::spawn(async move { axum::serve(listener, app).await });
}

/// Cluster mode: etcd must answer before anything else happens, so a
/// wrong endpoint is an error at start, not a host silently on its own.
async fn connect_etcd(config: &Config) -> anyhow::Result<Option<iofloor_cluster::Etcd>> {
    let Some(c) = &config.cluster else {
        return Ok(None);
    };
    let etcd = iofloor_cluster::Etcd::connect(&c.etcd)
        .await
        .map_err(|e| anyhow::anyhow!("`cluster.endpoints` {:?}: {e}", c.etcd.endpoints))?;
    Ok(Some(etcd))
}

/// What the control thread and the API share, with the metrics labelled by
/// the host they describe.
fn shared_state(config: &Config) -> Arc<Shared> {
    let (ticks, _) = tokio::sync::broadcast::channel(16);
    let host = match &config.cluster {
        Some(c) => c.host.clone(),
        // Only a label: a machine without a readable hostname is still served.
        None => config::machine_hostname().unwrap_or_else(|_| "localhost".into()),
    };
    Arc::new(Shared {
        view: Mutex::new(Service::initial_view(config)),
        metrics: metrics::Metrics::new(&host),
        ticks,
        token: Mutex::new(None),
        cluster: config.cluster.as_ref().map(|_| ClusterLink::default()),
    })
}

/// Cluster mode: joins the cluster and hands the control thread and the API
/// what they read it through. `None` outside cluster mode.
async fn join_cluster(
    etcd: Option<iofloor_cluster::Etcd>,
    service: &Service,
    shared: &Shared,
) -> anyhow::Result<Option<iofloor_cluster::AgentHandle>> {
    let (Some(etcd), Some(settings), Some(link)) =
        (etcd, service.cluster_settings(), &shared.cluster)
    else {
        return Ok(None);
    };
    let reader = iofloor_cluster::ClusterReader::new(etcd.clone(), &settings);
    *link.reader.lock().unwrap() = Some(reader);
    let agent = iofloor_cluster::start(etcd, settings, link.mailbox.clone()).await?;
    *link.status.lock().unwrap() = Some(agent.status.clone());
    Ok(Some(agent))
}

/// The control loop gets a thread of its own, not a task on the runtime: it
/// blocks on cgroup files and QEMU monitors and raises its own thread's
/// priority, so its intervals never wait behind the API.
fn start_control_thread(
    service: Service,
) -> anyhow::Result<(Sender<Command>, JoinHandle<anyhow::Result<()>>)> {
    let (commands, rx) = std::sync::mpsc::channel();
    let control = std::thread::Builder::new()
        .name("iofloor-control".into())
        .spawn(move || service.run(rx))?;
    Ok((commands, control))
}

/// Stops the control thread, which restores every limit, then leaves the
/// cluster and removes the API's socket.
async fn shut_down(
    commands: &Sender<Command>,
    control: JoinHandle<anyhow::Result<()>>,
    agent: Option<iofloor_cluster::AgentHandle>,
    unix_path: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    let _ = commands.send(Command::Shutdown);
    let result = tokio::task::spawn_blocking(move || control.join()).await?;
    // After the limits are restored: leaving revokes the lease, and the
    // other hosts' next allocation no longer counts this one.
    if let Some(agent) = agent {
        agent.stop().await;
    }
    if let Some(p) = unix_path {
        let _ = std::fs::remove_file(p);
    }
    match result {
        Ok(r) => r,
        Err(_) => anyhow::bail!("the control thread panicked"),
    }
}

/// Binds the API's unix socket, replacing a stale one, readable and
/// writable by its owner only: the socket's permissions are its access control.
fn bind_unix(path: &std::path::Path) -> anyhow::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            anyhow::bail!(
                "`api.unix_socket` {}: exists and is not a socket",
                path.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!(
                "`api.unix_socket` {}: another process is listening on it",
                path.display()
            );
        }
        warn!("removing stale socket {}", path.display());
        std::fs::remove_file(path)?;
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Bound under a temporary name and renamed once it is 0600: at its real
    // path the socket is never open to others, not even for a moment.
    let staging = path.with_file_name(format!(
        ".{}.{}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&staging);
    let bound = tokio::net::UnixListener::bind(&staging)
        .map_err(|e| anyhow::anyhow!("`api.unix_socket` {}: {e}", path.display()));
    let listener = bound.and_then(|listener| {
        std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&staging, path)?;
        Ok(listener)
    });
    if listener.is_err() {
        let _ = std::fs::remove_file(&staging);
    }
    listener
}
