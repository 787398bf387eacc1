//! Containers named the way their operators name them: by name, by label,
//! or by the promise they carry in their own `io.iofloor.*` labels or
//! annotations (from a runtime whose labels the config trusts). A container
//! in a pod (podman's) whose annotations carry the promise holds it for its
//! pod: `podman kube play` copies a Kubernetes pod's annotations to each of
//! its containers, and the pod becomes a group over them. What a runtime
//! lists is read in `iofloor_host::containers`; this part decides which
//! containers an entry means and what they promise, and says why a label is
//! refused.

use crate::config::TenantSource;
use iofloor_core::units::Rate;
use iofloor_core::GroupSpec;
use iofloor_host::containers::ContainerInfo;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The labels a container declares its promise in.
pub const LABEL_PREFIX: &str = "io.iofloor.";
pub const LABEL_FLOOR: &str = "io.iofloor.floor";
pub const LABEL_CEILING: &str = "io.iofloor.ceiling";
pub const LABEL_WEIGHT: &str = "io.iofloor.weight";
pub const LABEL_GROUP: &str = "io.iofloor.group";

/// What a container's labels promise; each part given replaces its
/// tenant entry's.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Declared {
    pub floor: Option<Rate>,
    pub ceiling: Option<Rate>,
    pub weight: Option<f64>,
    pub group: Option<Arc<GroupSpec>>,
}

/// A running container as discovery sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    /// Index of its `[[runtime]]`.
    pub runtime: usize,
    pub info: ContainerInfo,
    /// Its labels' promise, where its runtime is trusted and the labels
    /// declare one that is valid: its pod's, where it runs in one.
    pub declared: Option<Declared>,
}

impl Listed {
    /// The pod whose promise it carries, if any.
    pub fn promised_pod(&self) -> Option<&str> {
        self.declared.as_ref().and(self.info.pod.as_deref())
    }
}

/// A label that cannot be taken: which, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("label `{label}={value}`: {problem}")]
pub struct LabelError {
    pub label: String,
    pub value: String,
    pub problem: String,
}

/// The promise a container's `io.iofloor.*` labels and annotations
/// declare: `None` if it has none. A label with a bad value (unparsable,
/// zero or negative, a ceiling below the floor, a group the config does not
/// have, a key iofloor does not know, a label and an annotation that say
/// different things) refuses them all: the container is then taken as
/// unlabelled, never given half a promise.
pub fn declared(
    info: &ContainerInfo,
    groups: &[Arc<GroupSpec>],
) -> Result<Option<Declared>, LabelError> {
    let mut labels = own_labels(&info.labels);
    for (key, value) in own_labels(&info.annotations) {
        match labels.get(&key) {
            Some(label) if *label != value => {
                return Err(LabelError {
                    problem: format!("the annotation says `{value}`"),
                    label: key,
                    value: label.clone(),
                })
            }
            _ => labels.insert(key, value),
        };
    }
    let mut d = Declared::default();
    let mut any = false;
    for (label, value) in &labels {
        any = true;
        let refuse = |problem: String| LabelError {
            label: label.clone(),
            value: value.clone(),
            problem,
        };
        let rate = || Rate::parse(value.trim()).map_err(|e| refuse(e.to_string()));
        match label.as_str() {
            LABEL_FLOOR => d.floor = Some(rate()?),
            LABEL_CEILING => d.ceiling = Some(rate()?),
            LABEL_WEIGHT => {
                d.weight = Some(
                    value
                        .trim()
                        .parse::<f64>()
                        .map_err(|_| refuse("not a number".into()))?,
                )
            }
            LABEL_GROUP => {
                d.group = Some(
                    groups
                        .iter()
                        .find(|g| g.name == value.trim())
                        .cloned()
                        .ok_or_else(|| refuse("the config has no such [[group]]".into()))?,
                )
            }
            _ => {
                return Err(refuse(format!(
                    "unknown: iofloor reads {LABEL_FLOOR}, {LABEL_CEILING}, {LABEL_WEIGHT} and {LABEL_GROUP}"
                )))
            }
        }
    }
    iofloor_core::model::check_promise(d.floor, d.ceiling, d.weight).map_err(|e| {
        let label = format!("{LABEL_PREFIX}{}", e.key);
        LabelError {
            value: labels.get(&label).cloned().unwrap_or_default(),
            label,
            problem: e.message,
        }
    })?;
    Ok(any.then_some(d))
}

/// The `io.iofloor.*` entries of a label or annotation map.
fn own_labels(all: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    all.iter()
        .filter(|(k, _)| k.starts_with(LABEL_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Containers of one pod that declare different promises (a container
/// added to a pod with its own annotations): their pod's promise is
/// refused, all of them taken as unlabelled. Returns each such pod once,
/// as (runtime index, pod name).
pub fn refuse_split_pods(listed: &mut [Listed]) -> Vec<(usize, String)> {
    let mut promise: BTreeMap<(usize, String), Option<Declared>> = BTreeMap::new();
    let mut split = Vec::new();
    for c in listed.iter() {
        let Some(pod) = &c.info.pod else { continue };
        let key = (c.runtime, pod.clone());
        match promise.get(&key) {
            None => {
                promise.insert(key, c.declared.clone());
            }
            Some(p) if *p != c.declared && !split.contains(&key) => split.push(key),
            Some(_) => {}
        }
    }
    for c in listed.iter_mut() {
        if let Some(pod) = &c.info.pod {
            if split.contains(&(c.runtime, pod.clone())) {
                c.declared = None;
            }
        }
    }
    split
}

/// Whether a tenant entry's source means this container.
pub fn matches(source: &TenantSource, c: &Listed) -> bool {
    let TenantSource::Container {
        runtime,
        name,
        labels,
        labelled,
    } = source
    else {
        return false;
    };
    let glob =
        |pattern: &str, text: &str| glob::Pattern::new(pattern).is_ok_and(|p| p.matches(text));
    runtime.is_none_or(|r| r == c.runtime)
        && (!labelled || c.declared.is_some())
        && name.as_deref().is_none_or(|n| glob(n, &c.info.name))
        && labels
            .iter()
            .all(|(k, v)| c.info.labels.get(k).is_some_and(|have| glob(v, have)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use iofloor_core::units::Rate;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn info(labels: BTreeMap<String, String>) -> ContainerInfo {
        ContainerInfo {
            id: "x".into(),
            name: "c".into(),
            labels,
            annotations: BTreeMap::new(),
            pod: None,
            cgroup: "c".into(),
        }
    }

    fn group(name: &str) -> Arc<GroupSpec> {
        Arc::new(GroupSpec {
            name: name.into(),
            floor: None,
            ceiling: None,
            weight: 100.0,
            parent: None,
            shared_limit: false,
        })
    }

    #[test]
    fn labels_declare_a_promise_and_bad_ones_refuse_it_naming_the_label() {
        let groups = [group("team")];
        let d = declared(
            &info(labels(&[
                ("app", "pg"),
                (LABEL_FLOOR, "2000iops"),
                (LABEL_CEILING, "50MB/s"),
                (LABEL_WEIGHT, "300"),
                (LABEL_GROUP, "team"),
            ])),
            &groups,
        )
        .unwrap()
        .unwrap();
        assert_eq!(d.floor, Some(Rate::Iops(2000.0)));
        assert_eq!(d.weight, Some(300.0));
        assert_eq!(d.group.unwrap().name, "team");
        assert_eq!(declared(&info(labels(&[("app", "pg")])), &groups), Ok(None));
        for (bad, label) in [
            (vec![(LABEL_FLOOR, "0iops")], LABEL_FLOOR),
            (vec![(LABEL_FLOOR, "-5iops")], LABEL_FLOOR),
            (vec![(LABEL_FLOOR, "lots")], LABEL_FLOOR),
            (vec![(LABEL_WEIGHT, "0")], LABEL_WEIGHT),
            (vec![(LABEL_WEIGHT, "heavy")], LABEL_WEIGHT),
            (vec![(LABEL_GROUP, "nobody")], LABEL_GROUP),
            (vec![("io.iofloor.flor", "100iops")], "io.iofloor.flor"),
            (
                vec![(LABEL_FLOOR, "500iops"), (LABEL_CEILING, "100iops")],
                LABEL_CEILING,
            ),
        ] {
            let err = declared(&info(labels(&bad)), &groups).unwrap_err();
            assert_eq!(err.label, label, "{err}");
            assert!(
                err.to_string().starts_with(&format!("label `{label}=")),
                "{err}"
            );
        }
    }

    #[test]
    fn an_entry_means_containers_by_runtime_name_and_labels() {
        let c = |runtime, name: &str, l: &[(&str, &str)], declared| Listed {
            runtime,
            info: ContainerInfo {
                id: "x".into(),
                name: name.into(),
                labels: labels(l),
                annotations: BTreeMap::new(),
                pod: None,
                cgroup: "c".into(),
            },
            declared,
        };
        let source =
            |runtime, name: Option<&str>, l: &[(&str, &str)], labelled| TenantSource::Container {
                runtime,
                name: name.map(String::from),
                labels: labels(l),
                labelled,
            };
        let db = c(0, "db-1", &[("app", "pg"), ("tier", "gold")], None);
        assert!(matches(&source(None, Some("db-*"), &[], false), &db));
        assert!(matches(
            &source(Some(0), None, &[("app", "pg")], false),
            &db
        ));
        assert!(matches(
            &source(None, Some("db-1"), &[("tier", "g*")], false),
            &db
        ));
        assert!(!matches(&source(Some(1), Some("db-*"), &[], false), &db));
        assert!(!matches(
            &source(None, None, &[("app", "mysql")], false),
            &db
        ));
        assert!(!matches(&source(None, None, &[("owner", "*")], false), &db));
        assert!(!matches(&source(Some(0), None, &[], true), &db));
        let labelled = c(0, "web", &[], Some(Declared::default()));
        assert!(matches(&source(Some(0), None, &[], true), &labelled));
        assert!(!matches(&TenantSource::Cgroup("db-1".into()), &db));
    }

    #[test]
    fn annotations_declare_like_labels_and_a_pod_holds_one_promise() {
        let mut annotated = info(labels(&[(LABEL_FLOOR, "300iops")]));
        annotated.annotations = labels(&[(LABEL_FLOOR, "300iops"), (LABEL_WEIGHT, "200")]);
        let d = declared(&annotated, &[]).unwrap().unwrap();
        assert_eq!((d.floor, d.weight), (Some(Rate::Iops(300.0)), Some(200.0)));
        annotated.annotations = labels(&[(LABEL_FLOOR, "900iops")]);
        let err = declared(&annotated, &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "label `io.iofloor.floor=300iops`: the annotation says `900iops`"
        );

        let in_pod = |runtime, pod: &str, floor: Option<f64>| {
            let mut i = info(BTreeMap::new());
            i.pod = Some(pod.into());
            Listed {
                runtime,
                info: i,
                declared: floor.map(|f| Declared {
                    floor: Some(Rate::Iops(f)),
                    ..Declared::default()
                }),
            }
        };
        let mut listed = vec![
            in_pod(0, "pg", Some(300.0)),
            in_pod(0, "pg", Some(300.0)),
            in_pod(0, "web", Some(100.0)),
            in_pod(0, "web", None),
            in_pod(0, "web", Some(100.0)),
            in_pod(1, "pg", None),
        ];
        assert_eq!(refuse_split_pods(&mut listed), [(0, "web".to_string())]);
        let pods: Vec<Option<&str>> = listed.iter().map(Listed::promised_pod).collect();
        assert_eq!(
            pods,
            [Some("pg"), Some("pg"), None, None, None, None],
            "a pod whose containers disagree is unlabelled as a whole"
        );
    }
}
