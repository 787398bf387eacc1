//! Finding the tenants a config names: cgroup directories, QEMU monitor
//! sockets, libvirt domains' disks and a runtime's containers, either one of
//! them or a glob whose every match is a tenant (pods, systemd slices, VMs
//! and containers that come and go). Run each interval.

use crate::config::{Config, TenantSource};
use iofloor_host::backends::libvirt::DomainInfo;
use std::path::{Path, PathBuf};

/// A tenant found on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// The config's name, or `name/rest-of-the-match` for a glob.
    pub name: String,
    /// Index of the `[[tenant]]` entry.
    pub entry: usize,
    pub kind: FoundKind,
    /// The container it is, where a runtime named it: a container
    /// recreated (a new ID) or relabelled is found anew.
    pub container: Option<FoundContainer>,
}

/// A container behind a found tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct FoundContainer {
    /// Its `[[runtime]]`'s name: a reload that reorders them moves nothing.
    pub runtime: String,
    pub id: String,
    /// The promise its labels declare, replacing its entry's parts.
    pub declared: Option<crate::containers::Declared>,
    /// The pod whose promise `declared` is: the pod is then a group over
    /// its containers, holding it.
    pub pod: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum FoundKind {
    /// Path relative to the cgroup root.
    Cgroup(PathBuf),
    Qmp {
        socket: PathBuf,
        drive: String,
    },
    /// A libvirt domain's disk; the domain known by its UUID (a name can
    /// be reused by another domain).
    Libvirt {
        domain: String,
        uuid: String,
        disk: String,
    },
}

impl Found {
    /// The path an operator recognises (absolute cgroup directory or socket).
    pub fn path(&self, cgroup_root: &Path) -> PathBuf {
        match &self.kind {
            FoundKind::Cgroup(rel) => cgroup_root.join(rel),
            FoundKind::Qmp { socket, .. } => socket.clone(),
            FoundKind::Libvirt { domain, disk, .. } => format!("libvirt:{domain}/{disk}").into(),
        }
    }
}

/// Every match of a (possibly glob) pattern under `base`, with the part of
/// the match after the pattern's fixed prefix, for naming.
fn matches(base: &Path, pattern: &str, want_dir: bool) -> Vec<(PathBuf, String)> {
    let full = base.join(pattern);
    let full_text = full.to_string_lossy().to_string();
    let glob_text = format!(
        "{}/{}",
        glob::Pattern::escape(&base.to_string_lossy()),
        pattern
    );
    let fixed: PathBuf = Path::new(&full_text)
        .components()
        .take_while(|c| !c.as_os_str().to_string_lossy().contains(['*', '?', '[']))
        .collect();
    let is_glob = pattern.contains(['*', '?', '[']);
    let candidates: Vec<PathBuf> = if is_glob {
        match glob::glob(&glob_text) {
            Ok(paths) => paths.filter_map(Result::ok).collect(),
            Err(_) => Vec::new(),
        }
    } else {
        vec![full.clone()]
    };
    let mut out = Vec::new();
    for p in candidates {
        let ok = if want_dir {
            p.is_dir()
        } else {
            use std::os::unix::fs::FileTypeExt;
            std::fs::metadata(&p)
                .map(|m| m.file_type().is_socket())
                .unwrap_or(false)
        };
        if !ok {
            continue;
        }
        let rest = p
            .strip_prefix(&fixed)
            .map(|r| r.to_string_lossy().to_string())
            .unwrap_or_default();
        out.push((p, rest));
    }
    out
}

/// Whether a libvirt domain pattern is a UUID (matched exactly) rather
/// than a name or a glob of names.
fn is_uuid(pattern: &str) -> bool {
    pattern.len() == 36
        && pattern.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// A glob that matches `name` (a pattern that is not a glob matches itself).
fn glob_matches(pattern: &str, name: &str) -> bool {
    glob::Pattern::new(pattern).is_ok_and(|p| p.matches(name))
}

/// All tenants of `config` present now, sorted by name. A name found twice
/// (two entries matching the same cgroup) keeps its first entry. `domains`
/// is what libvirt lists now (`None` when it could not be asked: no
/// libvirt tenant is found then, and the caller keeps the ones it has);
/// `containers` what the runtimes that answered list.
pub fn discover(
    config: &Config,
    cgroup_root: &Path,
    domains: Option<&[DomainInfo]>,
    containers: &[crate::containers::Listed],
) -> Vec<Found> {
    let mut found: Vec<Found> = Vec::new();
    for (entry, t) in config.tenants.iter().enumerate() {
        let glob = t.source.is_glob();
        let name_of = |rest: &str| {
            if glob {
                format!("{}/{}", t.name, rest)
            } else {
                t.name.clone()
            }
        };
        match &t.source {
            TenantSource::Cgroup(pattern) => {
                for (path, rest) in matches(cgroup_root, pattern, true) {
                    let Ok(rel) = path.strip_prefix(cgroup_root) else {
                        continue;
                    };
                    found.push(Found {
                        name: name_of(&rest),
                        entry,
                        kind: FoundKind::Cgroup(rel.to_path_buf()),
                        container: None,
                    });
                }
            }
            TenantSource::Qmp { socket, drive } => {
                for (path, rest) in matches(Path::new("/"), socket.trim_start_matches('/'), false) {
                    found.push(Found {
                        name: name_of(&rest),
                        entry,
                        kind: FoundKind::Qmp {
                            socket: path,
                            drive: drive.clone(),
                        },
                        container: None,
                    });
                }
            }
            TenantSource::Kubernetes { kubepods } => {
                let Some(kp) = crate::kubernetes::kubepods(cgroup_root, kubepods) else {
                    continue;
                };
                for c in crate::kubernetes::containers(cgroup_root, &kp) {
                    found.push(Found {
                        name: crate::kubernetes::names(&t.name, &c).0,
                        entry,
                        kind: FoundKind::Cgroup(c.cgroup),
                        container: None,
                    });
                }
            }
            TenantSource::Container { .. } => {
                found.extend(container_tenants(config, entry, name_of, containers))
            }
            TenantSource::Libvirt { domain, disk } => found.extend(libvirt_disks(
                &t.name,
                entry,
                domain,
                disk,
                domains.unwrap_or_default(),
            )),
        }
    }
    let mut seen = std::collections::HashSet::new();
    found.retain(|f| seen.insert(f.name.clone()) && seen.insert(format!("\0{:?}", f.kind)));
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

/// The containers entry `entry` means, named by `name_of` from the
/// container's name (its pod's first, where it holds its pod's promise).
fn container_tenants(
    config: &Config,
    entry: usize,
    name_of: impl Fn(&str) -> String,
    containers: &[crate::containers::Listed],
) -> Vec<Found> {
    let source = &config.tenants[entry].source;
    containers
        .iter()
        .filter(|c| crate::containers::matches(source, c))
        .map(|c| {
            let pod = c.promised_pod();
            let rest = match pod {
                Some(pod) => format!("{pod}/{}", c.info.name),
                None => c.info.name.clone(),
            };
            Found {
                name: name_of(&rest),
                entry,
                kind: FoundKind::Cgroup(c.info.cgroup.clone()),
                container: Some(FoundContainer {
                    runtime: config.runtimes[c.runtime].name.clone(),
                    id: c.info.id.clone(),
                    declared: c.declared.clone(),
                    pod: pod.map(String::from),
                }),
            }
        })
        .collect()
}

/// The disks of the libvirt `domains` that a `libvirt` entry named `name`
/// (its `domain` a name, glob or UUID, its `disk` a target or glob) means.
fn libvirt_disks(
    name: &str,
    entry: usize,
    domain: &str,
    disk: &str,
    domains: &[DomainInfo],
) -> Vec<Found> {
    let by_uuid = is_uuid(domain);
    let domain_glob = !by_uuid && domain.contains(['*', '?', '[']);
    let disk_glob = disk.contains(['*', '?', '[']);
    let mut found = Vec::new();
    for d in domains {
        let hit = if by_uuid {
            d.uuid.eq_ignore_ascii_case(domain)
        } else {
            glob_matches(domain, &d.name)
        };
        if !hit {
            continue;
        }
        for target in d.disks.iter().filter(|t| glob_matches(disk, t)) {
            let name = match (domain_glob, disk_glob) {
                (true, _) => format!("{name}/{}/{target}", d.name),
                (false, true) => format!("{name}/{target}"),
                (false, false) => name.to_string(),
            };
            found.push(Found {
                name,
                entry,
                kind: FoundKind::Libvirt {
                    domain: d.name.clone(),
                    uuid: d.uuid.clone(),
                    disk: target.clone(),
                },
                container: None,
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn config(tenants: &str) -> Config {
        let text = format!(
            "[[device]]\nid = \"7:0\"\nmodel = {{ rbps = 1e8, rseqiops = 1e3, rrandiops = 1e3, wbps = 1e8, wseqiops = 1e3, wrandiops = 1e3 }}\n{tenants}"
        );
        Config::parse(&text, Path::new("/x.toml")).unwrap()
    }

    #[test]
    fn globs_find_each_match_and_plain_paths_only_when_present() {
        let root = tempfile::tempdir().unwrap();
        for d in [
            "kubepods/burstable/pod1",
            "kubepods/burstable/pod2",
            "kubepods/besteffort/pod3",
            "system.slice/db.service",
        ] {
            std::fs::create_dir_all(root.path().join(d)).unwrap();
        }
        std::fs::write(root.path().join("kubepods/burstable/podfile"), "").unwrap();
        let sock = root.path().join("vm-a.qmp");
        let _listener = UnixListener::bind(&sock).unwrap();
        let c = config(&format!(
            "[[tenant]]\nname = \"pods\"\ncgroup = \"kubepods/*/pod*\"\n\
             [[tenant]]\nname = \"db\"\ncgroup = \"system.slice/db.service\"\n\
             [[tenant]]\nname = \"gone\"\ncgroup = \"system.slice/gone.service\"\n\
             [[tenant]]\nname = \"vms\"\nqmp = \"{}/vm-*.qmp\"\ndrive = \"drive0\"\n",
            root.path().display()
        ));
        let found = discover(&c, root.path(), None, &[]);
        let names: Vec<&str> = found.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "db",
                "pods/besteffort/pod3",
                "pods/burstable/pod1",
                "pods/burstable/pod2",
                "vms/vm-a.qmp"
            ],
            "directories only, absent plain paths skipped"
        );
        assert_eq!(
            found[0].kind,
            FoundKind::Cgroup("system.slice/db.service".into())
        );
        assert_eq!(
            found[4].kind,
            FoundKind::Qmp {
                socket: sock.clone(),
                drive: "drive0".into()
            }
        );

        std::fs::remove_dir(root.path().join("kubepods/burstable/pod1")).unwrap();
        assert_eq!(
            discover(&c, root.path(), None, &[]).len(),
            4,
            "a vanished cgroup is no longer found"
        );
    }

    #[test]
    fn containers_are_found_by_name_labels_and_their_own_labelled_promise() {
        use crate::containers::{Declared, Listed};
        use iofloor_host::containers::ContainerInfo;
        let c = config(
            "[[runtime]]\nname = \"podman\"\nsocket = \"/run/podman/podman.sock\"\ntrust_labels = true\n\
             [[runtime]]\nname = \"docker\"\nsocket = \"/run/docker.sock\"\n\
             [[tenant]]\nname = \"db\"\ncontainer = \"db-*\"\nfloor = \"500iops\"\n\
             [[tenant]]\nname = \"web\"\ncontainer = \"web\"\nruntime = \"docker\"\n\
             [[tenant]]\nname = \"pg\"\nlabels = { app = \"pg*\" }\n",
        );
        let listed = |runtime, id: &str, name: &str, labels: &[(&str, &str)], declared| Listed {
            runtime,
            info: ContainerInfo {
                id: id.into(),
                name: name.into(),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                annotations: Default::default(),
                pod: None,
                cgroup: format!("libpod_parent/libpod-{id}").into(),
            },
            declared,
        };
        let promise = Declared {
            floor: Some(iofloor_core::units::Rate::Iops(300.0)),
            ..Declared::default()
        };
        let mut in_pod = listed(0, "a5", "pgpod-db", &[], Some(promise.clone()));
        in_pod.info.pod = Some("pgpod".into());
        let containers = [
            in_pod,
            listed(0, "a1", "db-1", &[], None),
            listed(0, "a2", "web", &[], None),
            listed(1, "b1", "web", &[], None),
            listed(1, "b2", "analytics", &[("app", "pgbouncer")], None),
            listed(0, "a3", "cache", &[], Some(promise.clone())),
            listed(0, "a4", "db-2", &[], Some(promise.clone())),
        ];
        let found = discover(&c, Path::new("/nonexistent"), None, &containers);
        let names: Vec<(&str, &str)> = found
            .iter()
            .map(|f| (f.name.as_str(), f.container.as_ref().unwrap().id.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("db/db-1", "a1"),
                ("db/db-2", "a4"),
                ("pg/analytics", "b2"),
                ("podman/cache", "a3"),
                ("podman/pgpod/pgpod-db", "a5"),
                ("web", "b1"),
            ],
            "an entry's own match wins over the runtime's labelled entry; `runtime` chooses"
        );
        assert_eq!(found[1].container.as_ref().unwrap().declared, Some(promise));
        assert_eq!(
            found[4].container.as_ref().unwrap().pod.as_deref(),
            Some("pgpod")
        );
        assert_eq!(
            found[0].kind,
            FoundKind::Cgroup("libpod_parent/libpod-a1".into())
        );
    }
}
