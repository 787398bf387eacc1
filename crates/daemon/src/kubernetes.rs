//! Pods as tenants, found the way kubelet and the container runtimes lay out
//! their cgroups, without the Kubernetes API. Kubelet makes a cgroup per pod
//! under `kubepods` (Guaranteed pods directly, Burstable and BestEffort
//! under their QoS class), named by the pod's UID; the runtime makes one per
//! container under it. Both cgroup drivers:
//!
//! - cgroupfs: `kubepods/burstable/pod<uid>/<id>` (containerd, Docker) or
//!   `…/crio-<id>` (CRI-O);
//! - systemd: `kubepods.slice/kubepods-burstable.slice/
//!   kubepods-burstable-pod<uid with _ for ->.slice/cri-containerd-<id>.scope`
//!   (`docker-<id>.scope`, `crio-<id>.scope`).
//!
//! Each container is a tenant (cgroup v1 blk-throttle is flat: a limit on
//! the pod's cgroup does nothing to its containers, so caps go on them) and
//! each pod a group over its containers, holding the entry's floor, ceiling
//! and weight. CRI-O's `crio-conmon-<id>` monitors and, with the systemd
//! driver, the empty `crio-<id>` cgroup it leaves for a pod without an infra
//! container are not workloads; where crun runs a container in a
//! `container` child of its cgroup, that child is the tenant. The pause
//! container is a tenant like the others (it does next to no I/O; telling it
//! apart needs the runtime or the API).

use std::path::{Path, PathBuf};

/// A container found under a pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodContainer {
    /// The pod's UID as the API shows it (dashes, or a static pod's hash).
    pub pod: String,
    /// `guaranteed`, `burstable` or `besteffort`.
    pub qos: &'static str,
    /// The container's ID (64 hex digits).
    pub container: String,
    /// Its cgroup, relative to the cgroup root.
    pub cgroup: PathBuf,
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A pod UID as it appears in a cgroup name: a UUID (with `sep` for its
/// dashes) or the 32-digit hash kubelet gives static pods. Returned as
/// the API writes it.
fn pod_uid(text: &str, sep: char) -> Option<String> {
    if is_hex(text, 32) {
        return Some(text.to_string());
    }
    let parts: Vec<&str> = text.split(sep).collect();
    let lens = [8, 4, 4, 4, 12];
    (parts.len() == 5 && parts.iter().zip(lens).all(|(p, n)| is_hex(p, n))).then(|| parts.join("-"))
}

/// The pod cgroups under `kubepods` (relative to the cgroup root), for
/// either driver, with their UID and QoS class.
fn pods(root: &Path, kubepods: &Path) -> Vec<(String, &'static str, PathBuf)> {
    let systemd = kubepods.extension().is_some_and(|e| e == "slice");
    let mut out = Vec::new();
    let classes: [(&'static str, PathBuf); 3] = if systemd {
        [
            ("guaranteed", kubepods.to_path_buf()),
            ("burstable", kubepods.join("kubepods-burstable.slice")),
            ("besteffort", kubepods.join("kubepods-besteffort.slice")),
        ]
    } else {
        [
            ("guaranteed", kubepods.to_path_buf()),
            ("burstable", kubepods.join("burstable")),
            ("besteffort", kubepods.join("besteffort")),
        ]
    };
    for (qos, dir) in classes {
        let Ok(entries) = std::fs::read_dir(root.join(&dir)) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            let uid = if systemd {
                let prefix = match qos {
                    "guaranteed" => "kubepods-pod".to_string(),
                    q => format!("kubepods-{q}-pod"),
                };
                name.strip_prefix(&prefix)
                    .and_then(|r| r.strip_suffix(".slice"))
                    .and_then(|u| pod_uid(u, '_'))
            } else {
                name.strip_prefix("pod").and_then(|u| pod_uid(u, '-'))
            };
            if let Some(uid) = uid {
                out.push((uid, qos, dir.join(&name)));
            }
        }
    }
    out
}

/// A container cgroup's ID from its directory name, for either driver;
/// `None` for what is not a workload (CRI-O's conmon, the empty sandbox
/// cgroup of the systemd driver) or not a container at all.
fn container_id(name: &str, systemd: bool) -> Option<String> {
    if name.starts_with("crio-conmon-") {
        return None;
    }
    let id = if systemd {
        let scope = name.strip_suffix(".scope")?;
        ["cri-containerd-", "crio-", "docker-"]
            .iter()
            .find_map(|p| scope.strip_prefix(p))?
    } else {
        name.strip_prefix("crio-").unwrap_or(name)
    };
    is_hex(id, 64).then(|| id.to_string())
}

/// Every container of every pod under `kubepods` (relative to the cgroup
/// root `root`), sorted.
pub fn containers(root: &Path, kubepods: &Path) -> Vec<PodContainer> {
    let systemd = kubepods.extension().is_some_and(|e| e == "slice");
    let mut out = Vec::new();
    for (uid, qos, pod) in pods(root, kubepods) {
        let Ok(entries) = std::fs::read_dir(root.join(&pod)) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = container_id(&name, systemd) else {
                continue;
            };
            let mut cgroup = pod.join(&name);
            // crun runs the container in a child of the cgroup it was given.
            if root.join(&cgroup).join("container").is_dir() {
                cgroup = cgroup.join("container");
            }
            out.push(PodContainer {
                pod: uid.clone(),
                qos,
                container: id,
                cgroup,
            });
        }
    }
    out.sort();
    out
}

/// `kubepods` as the config gives it, or found: the systemd driver's
/// `kubepods.slice`, else the cgroupfs driver's `kubepods`.
pub fn kubepods(root: &Path, given: &str) -> Option<PathBuf> {
    if given != "auto" {
        return Some(PathBuf::from(given.trim_start_matches('/')));
    }
    ["kubepods.slice", "kubepods"]
        .iter()
        .map(PathBuf::from)
        .find(|p| root.join(p).is_dir())
}

/// A tenant's name for a container: `entry/<pod uid>/<first 12 digits of
/// the container ID>` (as `crictl` shortens them); and its pod's group name.
pub fn names(entry: &str, c: &PodContainer) -> (String, String) {
    let group = format!("{entry}/{}", c.pod);
    (format!("{group}/{}", &c.container[..12]), group)
}

/// The pod's own cgroup above a container cgroup (relative to the root),
/// for either driver: where cgroup v2 bounds the whole pod.
pub fn pod_cgroup(cgroup: &Path) -> Option<PathBuf> {
    cgroup
        .ancestors()
        .find(|a| {
            a.file_name()
                .is_some_and(|n| pod_of(Path::new(n)).is_some())
        })
        .map(Path::to_path_buf)
}

/// The pod UID of a container cgroup path, for either driver (the inverse
/// of the layout above), to find a tenant's pod group again.
pub fn pod_of(cgroup: &Path) -> Option<String> {
    cgroup.components().rev().find_map(|c| {
        let name = c.as_os_str().to_string_lossy();
        if let Some(rest) = name.strip_suffix(".slice") {
            let u = rest.rsplit_once("-pod")?.1;
            pod_uid(u, '_')
        } else {
            pod_uid(name.strip_prefix("pod")?, '-')
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
    const UID2: &str = "11111111-2222-3333-4444-555555555555";
    const STATIC: &str = "6f1e2d3c4b5a69788796a5b4c3d2e1f0";

    fn id(n: u8) -> String {
        format!("{n:x}").repeat(64)[..64].to_string()
    }

    /// Makes the directories of a recorded tree under `root`.
    fn tree(root: &Path, dirs: &[String]) {
        for d in dirs {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
    }

    #[test]
    fn cgroupfs_pods_in_every_qos_class_with_containerd_and_crio() {
        let root = tempfile::tempdir().unwrap();
        let (c1, c2, c3, pause) = (id(1), id(2), id(3), id(4));
        tree(
            root.path(),
            &[
                // Guaranteed: directly under kubepods; containerd, plus its pause.
                format!("kubepods/pod{UID}/{c1}"),
                format!("kubepods/pod{UID}/{pause}"),
                // Burstable, CRI-O with its conmon (not a workload).
                format!("kubepods/burstable/pod{UID2}/crio-{c2}"),
                format!("kubepods/burstable/pod{UID2}/crio-conmon-{c2}"),
                // A static pod's hash as UID, BestEffort.
                format!("kubepods/besteffort/pod{STATIC}/{c3}"),
                // Not pods, not containers.
                "kubepods/burstable/notapod/x".into(),
                format!("kubepods/pod{UID}/not-a-container"),
            ],
        );
        let kp = kubepods(root.path(), "auto").unwrap();
        assert_eq!(kp, PathBuf::from("kubepods"));
        let found = containers(root.path(), &kp);
        let seen: Vec<(&str, &str, &str)> = found
            .iter()
            .map(|c| (c.pod.as_str(), c.qos, &c.container[..1]))
            .collect();
        assert_eq!(
            seen,
            [
                (UID, "guaranteed", "1"),
                (UID, "guaranteed", "4"),
                (UID2, "burstable", "2"),
                (STATIC, "besteffort", "3"),
            ]
        );
        assert_eq!(
            found[2].cgroup,
            PathBuf::from(format!("kubepods/burstable/pod{UID2}/crio-{c2}"))
        );
        for c in &found {
            assert_eq!(pod_of(&c.cgroup).as_deref(), Some(c.pod.as_str()));
        }
        assert_eq!(
            pod_cgroup(&found[2].cgroup),
            Some(PathBuf::from(format!("kubepods/burstable/pod{UID2}")))
        );
        let (name, group) = names("pods", &found[0]);
        assert_eq!(group, format!("pods/{UID}"));
        assert_eq!(name, format!("pods/{UID}/111111111111"));
    }

    #[test]
    fn systemd_pods_with_containerd_docker_crio_and_crun() {
        let root = tempfile::tempdir().unwrap();
        let u = UID.replace('-', "_");
        let u2 = UID2.replace('-', "_");
        let (c1, c2, c3, c4, sandbox) = (id(1), id(2), id(3), id(5), id(6));
        tree(
            root.path(),
            &[
                format!("kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{c1}.scope"),
                format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u2}.slice/docker-{c2}.scope"),
                // CRI-O: a container run by crun (in a `container` child),
                // its conmon, and the empty cgroup of a pod without infra.
                format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{STATIC}.slice/crio-{c3}.scope/container"),
                format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{STATIC}.slice/crio-conmon-{c3}.scope"),
                format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{STATIC}.slice/crio-{sandbox}"),
                format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{STATIC}.slice/crio-{c4}.scope"),
                // A burstable pod's slice in the wrong class directory.
                format!("kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{u}.slice/cri-containerd-{c1}.scope"),
            ],
        );
        let kp = kubepods(root.path(), "auto").unwrap();
        assert_eq!(kp, PathBuf::from("kubepods.slice"));
        let found = containers(root.path(), &kp);
        let seen: Vec<(&str, &str, &str)> = found
            .iter()
            .map(|c| (c.pod.as_str(), c.qos, &c.container[..1]))
            .collect();
        assert_eq!(
            seen,
            [
                (UID, "guaranteed", "1"),
                (UID2, "burstable", "2"),
                (STATIC, "besteffort", "3"),
                (STATIC, "besteffort", "5"),
            ]
        );
        assert!(found[2]
            .cgroup
            .ends_with(format!("crio-{c3}.scope/container")));
        for c in &found {
            assert_eq!(pod_of(&c.cgroup).as_deref(), Some(c.pod.as_str()), "{c:?}");
        }
    }

    #[test]
    fn nothing_without_kubepods_and_a_given_root_is_taken_as_is() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(kubepods(root.path(), "auto"), None);
        assert_eq!(
            kubepods(root.path(), "/custom/kubepods"),
            Some(PathBuf::from("custom/kubepods"))
        );
        assert!(containers(root.path(), Path::new("kubepods")).is_empty());
    }
}
