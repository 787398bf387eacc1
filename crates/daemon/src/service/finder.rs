//! Finding tenants: each interval, what the config's entries match now
//! (cgroups, QEMU monitors, libvirt domains, pods, containers), with what
//! could not be found or adopted said once, not every interval, and failing
//! adoptions retried with backoff. This part owns libvirt's connection and
//! the container runtimes' clients for discovery and the memory of what
//! failed; adoption itself is the service's.

use super::LIBVIRT_TIMEOUT;
use crate::config::Config;
use crate::containers::Listed;
use crate::discovery::{discover, Found};
use iofloor_host::backends::libvirt::{DomainInfo, LibvirtBackend};
use iofloor_host::containers::RuntimeClient;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use tracing::{debug, info, warn};

/// The longest wait, in intervals, between tries to adopt a failing tenant.
const MAX_RETRY_INTERVALS: u64 = 32;

/// A tenant that could not be adopted: why, how often, and when to try again.
#[derive(Debug)]
struct FailedAdoption {
    message: String,
    failures: u32,
    next_try: u64,
}

/// What one look found.
pub(super) struct Finding {
    pub(super) found: Vec<Found>,
    /// libvirt could not be asked: its domains' tenants are neither found
    /// nor gone.
    pub(super) libvirt_unknown: bool,
    /// The `[[runtime]]`s that could not be asked, by name: their
    /// containers' tenants are neither found nor gone.
    pub(super) runtimes_down: HashSet<String>,
}

#[derive(Default)]
pub(super) struct Finder {
    /// Tenants found but not adopted, with the reason already logged.
    failed: HashMap<String, FailedAdoption>,
    /// libvirt for discovery, where the config names domains; and the
    /// error it last gave, logged once.
    libvirt: Option<LibvirtBackend>,
    libvirt_error: Option<String>,
    /// libvirt entries whose one domain or disk is missing, logged once.
    libvirt_missing: HashSet<String>,
    /// Tenant entries naming one cgroup or monitor socket that is not
    /// there (logged once, until it appears).
    absent: HashSet<String>,
    /// A client per `[[runtime]]`, in the config's order, and the error each
    /// last gave (logged once per outage).
    runtimes: Vec<RuntimeClient>,
    runtime_errors: HashMap<String, String>,
    /// A runtime that failed is asked again after 1, 2, 4 … up to
    /// [`MAX_RETRY_INTERVALS`] looks: one that accepts and never answers
    /// would otherwise cost its whole timeout in every interval. By name:
    /// failures so far and the look it is due at.
    runtime_backoff: HashMap<String, (u32, u64)>,
    /// Looks so far.
    looks: u64,
    /// Containers whose labels were refused, by ID, and pods whose
    /// containers disagree, as `pod RUNTIME-INDEX/NAME`, with the reason
    /// (logged once per container or pod and reason).
    refused_labels: HashMap<String, String>,
    /// Tenant names two containers claimed (logged once).
    claimed_twice: HashSet<String>,
}

impl Finder {
    /// What the config's entries match now under `cgroup_root` (a cgroup v2
    /// hierarchy if `v2`).
    pub(super) fn find(&mut self, config: &Config, cgroup_root: &Path, v2: bool) -> Finding {
        let domains = self.libvirt_domains(config);
        let (containers, runtimes_down) = self.containers(config, v2);
        let found = discover(config, cgroup_root, domains.as_deref(), &containers);
        self.note_claimed_twice(config, &containers);
        // Which config entries matched something, once for both notes.
        let mut matched = vec![false; config.tenants.len()];
        for f in &found {
            matched[f.entry] = true;
        }
        if let Some(domains) = &domains {
            self.note_missing_domains(config, domains, &matched);
        }
        self.note_absent_paths(config, cgroup_root, &matched);
        Finding {
            found,
            libvirt_unknown: domains.is_none(),
            runtimes_down: runtimes_down
                .into_iter()
                .map(|i| config.runtimes[i].name.clone())
                .collect(),
        }
    }

    /// What every `[[runtime]]` runs now, with the promise each trusted
    /// runtime's container declares in its labels, and the runtimes that
    /// could not be asked.
    fn containers(&mut self, config: &Config, v2: bool) -> (Vec<Listed>, HashSet<usize>) {
        let same = self.runtimes.len() == config.runtimes.len()
            && self
                .runtimes
                .iter()
                .zip(&config.runtimes)
                .all(|(c, r)| c.socket() == r.socket && c.timeout() == r.timeout);
        if !same {
            self.runtimes = config
                .runtimes
                .iter()
                .map(|r| RuntimeClient::new(&r.socket, r.timeout))
                .collect();
        }
        let version = if v2 {
            iofloor_host::Version::V2
        } else {
            iofloor_host::Version::V1
        };
        let mut listed = Vec::new();
        let mut down = HashSet::new();
        let mut seen_ids = HashSet::new();
        self.looks += 1;
        for (i, (client, r)) in self.runtimes.iter_mut().zip(&config.runtimes).enumerate() {
            if self
                .runtime_backoff
                .get(&r.name)
                .is_some_and(|(_, due)| self.looks < *due)
            {
                down.insert(i);
                continue;
            }
            match client.containers(version) {
                Ok(containers) => {
                    self.runtime_backoff.remove(&r.name);
                    if self.runtime_errors.remove(&r.name).is_some() {
                        info!(runtime = %r.name, "the container runtime answers again");
                    }
                    for info in containers {
                        let declared = if r.trust_labels {
                            declared_or_refused(&mut self.refused_labels, &r.name, &info, config)
                        } else {
                            None
                        };
                        seen_ids.insert(info.id.clone());
                        listed.push(Listed {
                            runtime: i,
                            info,
                            declared,
                        });
                    }
                }
                Err(e) => {
                    let message = e.to_string();
                    if self.runtime_errors.get(&r.name) != Some(&message) {
                        warn!(runtime = %r.name, "the container runtime cannot be asked: {message}; its containers' tenants are kept, unchanged, until it answers (asked again with backoff, at least every {MAX_RETRY_INTERVALS} intervals)");
                        self.runtime_errors.insert(r.name.clone(), message);
                    }
                    let failures = self.runtime_backoff.get(&r.name).map_or(0, |(f, _)| *f) + 1;
                    let wait = 1u64 << (failures - 1).min(MAX_RETRY_INTERVALS.ilog2());
                    self.runtime_backoff.insert(
                        r.name.clone(),
                        (failures, self.looks + wait.min(MAX_RETRY_INTERVALS)),
                    );
                    down.insert(i);
                }
            }
        }
        self.refuse_split_pods(config, &mut listed, &mut seen_ids);
        if down.is_empty() {
            self.refused_labels.retain(|id, _| seen_ids.contains(id));
        }
        (listed, down)
    }

    /// Pods whose containers declare different promises taken as
    /// unlabelled, each said once; their keys added to `seen`.
    fn refuse_split_pods(
        &mut self,
        config: &Config,
        listed: &mut [Listed],
        seen: &mut HashSet<String>,
    ) {
        for (runtime, pod) in crate::containers::refuse_split_pods(listed) {
            let key = format!("pod {runtime}/{pod}");
            let message = "its containers declare different promises".to_string();
            if self.refused_labels.get(&key) != Some(&message) {
                warn!(runtime = %config.runtimes[runtime].name, %pod, "{message}; the pod is taken as unlabelled");
                self.refused_labels.insert(key.clone(), message);
            }
            seen.insert(key);
        }
    }

    /// Says once when two containers claim one tenant: an entry naming one
    /// container (not a glob) that several runtimes run. The first (in the
    /// `[[runtime]]`s' order) is the tenant.
    fn note_claimed_twice(&mut self, config: &Config, containers: &[Listed]) {
        for t in config.tenants.iter().filter(|t| {
            matches!(t.source, crate::config::TenantSource::Container { .. }) && !t.source.is_glob()
        }) {
            let claims: Vec<&Listed> = containers
                .iter()
                .filter(|c| crate::containers::matches(&t.source, c))
                .collect();
            if claims.len() > 1 {
                if self.claimed_twice.insert(t.name.clone()) {
                    let who: Vec<String> = claims
                        .iter()
                        .map(|c| format!("{} in {}", c.info.name, config.runtimes[c.runtime].name))
                        .collect();
                    warn!(tenant = %t.name, "claimed by {} containers ({}): the first is the tenant; name a `runtime` to choose", claims.len(), who.join(", "));
                }
            } else {
                self.claimed_twice.remove(&t.name);
            }
        }
    }

    /// A tenant was adopted: its failures are forgotten.
    pub(super) fn adopted(&mut self, name: &str) {
        self.failed.remove(name);
    }

    /// Forgets the failures of tenants no longer found.
    pub(super) fn forget_absent(&mut self, present: &HashSet<&str>) {
        self.failed.retain(|n, _| present.contains(n.as_str()));
    }

    /// A new config: every failing tenant is tried again at once.
    pub(super) fn retry_all(&mut self) {
        self.failed.clear();
    }

    /// Logs a tenant that cannot be adopted once, not every interval, and
    /// backs its retries off: 1, 2, 4 … up to [`MAX_RETRY_INTERVALS`]
    /// intervals apart. A QEMU monitor that accepts and never answers costs
    /// a whole QMP timeout per try, in the control thread: retried every
    /// interval, a few of them would make every interval late.
    pub(super) fn failed(&mut self, name: &str, message: &str, now: u64) {
        let failed = self
            .failed
            .entry(name.to_string())
            .or_insert_with(|| FailedAdoption {
                message: String::new(),
                failures: 0,
                next_try: now,
            });
        if failed.failures == 0 {
            warn!(tenant = %name, "{message}; retried with backoff, at least every {MAX_RETRY_INTERVALS} intervals");
        } else if failed.message != message {
            debug!(tenant = %name, "still failing: {message}");
        }
        failed.failures += 1;
        failed.message = message.to_string();
        let wait = 1u64 << (failed.failures - 1).min(MAX_RETRY_INTERVALS.ilog2());
        failed.next_try = now + wait.min(MAX_RETRY_INTERVALS);
    }

    /// Whether a tenant whose adoption failed is due for another try.
    pub(super) fn due(&self, name: &str, now: u64) -> bool {
        self.failed.get(name).is_none_or(|f| now >= f.next_try)
    }

    /// The libvirt domains now, where the config names any; `None` when
    /// libvirt cannot be asked (logged once per outage).
    fn libvirt_domains(&mut self, config: &Config) -> Option<Vec<DomainInfo>> {
        use crate::config::TenantSource;
        let wanted = config
            .tenants
            .iter()
            .any(|t| matches!(t.source, TenantSource::Libvirt { .. }));
        if !wanted {
            self.libvirt = None;
            return Some(Vec::new());
        }
        if self
            .libvirt
            .as_ref()
            .is_none_or(|l| l.uri() != config.libvirt_uri)
        {
            match LibvirtBackend::new(&config.libvirt_uri, LIBVIRT_TIMEOUT) {
                Ok(l) => self.libvirt = Some(l),
                Err(e) => {
                    self.libvirt_down(&config.libvirt_uri, &e.to_string());
                    return None;
                }
            }
        }
        let answer = self.libvirt.as_mut().map(|l| l.domains());
        match answer {
            Some(Ok(domains)) => {
                if self.libvirt_error.take().is_some() {
                    info!(uri = %config.libvirt_uri, "libvirt answers again");
                }
                Some(domains)
            }
            Some(Err(e)) => {
                self.libvirt_down(&config.libvirt_uri, &e.to_string());
                None
            }
            None => None,
        }
    }

    /// A libvirt entry naming one domain (or disk) that libvirt does not
    /// have is logged once, and once more when it appears; it is looked for
    /// again every interval.
    fn note_missing_domains(&mut self, config: &Config, domains: &[DomainInfo], matched: &[bool]) {
        use crate::config::TenantSource;
        for (entry, t) in config.tenants.iter().enumerate() {
            let TenantSource::Libvirt { domain, disk } = &t.source else {
                continue;
            };
            let missing = if matched[entry] || domain.contains(['*', '?', '[']) {
                None
            } else if let Some(d) = domains
                .iter()
                .find(|d| d.name == *domain || d.uuid.eq_ignore_ascii_case(domain))
            {
                Some(format!(
                    "libvirt domain `{}` has no disk `{disk}` (its disks: {})",
                    d.name,
                    d.disks.join(", ")
                ))
            } else {
                Some(format!("libvirt has no running domain `{domain}`"))
            };
            match missing {
                Some(m) => {
                    if self.libvirt_missing.insert(t.name.clone()) {
                        warn!(tenant = %t.name, "{m}; looked for again each interval");
                    }
                }
                None => {
                    if self.libvirt_missing.remove(&t.name) {
                        info!(tenant = %t.name, "libvirt domain found");
                    }
                }
            }
        }
    }

    /// Says once when an entry naming one cgroup or monitor socket (not a
    /// glob, which may rightly match nothing yet) finds nothing: a typo or a
    /// path given from the wrong root otherwise leaves the tenant
    /// unmanaged without a word.
    fn note_absent_paths(&mut self, config: &Config, cgroup_root: &Path, matched: &[bool]) {
        use crate::config::TenantSource;
        for (entry, t) in config.tenants.iter().enumerate() {
            // Joined only to be logged (a socket's path is absolute).
            let (base, named) = match &t.source {
                TenantSource::Cgroup(c) => (cgroup_root, c),
                TenantSource::Qmp { socket, .. } => (Path::new("/"), socket),
                _ => continue,
            };
            let path = || base.join(named);
            if t.source.is_glob() || matched[entry] {
                if self.absent.remove(&t.name) {
                    info!(tenant = %t.name, path = %path().display(), "present now");
                }
            } else if self.absent.insert(t.name.clone()) {
                info!(tenant = %t.name, path = %path().display(), "not present; looked for again each interval");
            }
        }
    }

    fn libvirt_down(&mut self, uri: &str, message: &str) {
        if self.libvirt_error.as_deref() != Some(message) {
            warn!(uri = %uri, "libvirt cannot be asked for its domains: {message}; its tenants are kept, unavailable, until it answers");
            self.libvirt_error = Some(message.to_string());
        }
    }
}

/// The promise a trusted runtime's container declares; a refused one
/// said once per container and reason (`refused` holds what was said).
fn declared_or_refused(
    refused: &mut HashMap<String, String>,
    runtime: &str,
    info: &iofloor_host::containers::ContainerInfo,
    config: &Config,
) -> Option<crate::containers::Declared> {
    match crate::containers::declared(info, &config.groups) {
        Ok(d) => d,
        Err(e) => {
            let message = e.to_string();
            if refused.get(&info.id) != Some(&message) {
                warn!(%runtime, container = %info.name, "{message}; the container is taken as unlabelled");
                refused.insert(info.id.clone(), message);
            }
            None
        }
    }
}
