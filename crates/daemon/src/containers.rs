//! Containers named the way their operators name them: by name, by label,
//! or by the promise they carry in their own `io.iofloor.*` labels (from a
//! runtime whose labels the config trusts). What a runtime lists is read in
//! `iofloor_host::containers`; this part decides which containers an entry
//! means and what their labels promise, and says why a label is refused.

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
    /// declare one that is valid.
    pub declared: Option<Declared>,
}

/// A label that cannot be taken: which, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("label `{label}={value}`: {problem}")]
pub struct LabelError {
    pub label: String,
    pub value: String,
    pub problem: String,
}

/// The promise a container's `io.iofloor.*` labels declare: `None` if it
/// has none. A label with a bad value (unparsable, zero or negative, a
/// ceiling below the floor, a group the config does not have, a key
/// iofloor does not know) refuses them all: the container is then taken as
/// unlabelled, never given half a promise.
pub fn declared(
    labels: &BTreeMap<String, String>,
    groups: &[Arc<GroupSpec>],
) -> Result<Option<Declared>, LabelError> {
    let mut d = Declared::default();
    let mut any = false;
    for (label, value) in labels.iter().filter(|(k, _)| k.starts_with(LABEL_PREFIX)) {
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
            &labels(&[
                ("app", "pg"),
                (LABEL_FLOOR, "2000iops"),
                (LABEL_CEILING, "50MB/s"),
                (LABEL_WEIGHT, "300"),
                (LABEL_GROUP, "team"),
            ]),
            &groups,
        )
        .unwrap()
        .unwrap();
        assert_eq!(d.floor, Some(Rate::Iops(2000.0)));
        assert_eq!(d.weight, Some(300.0));
        assert_eq!(d.group.unwrap().name, "team");
        assert_eq!(declared(&labels(&[("app", "pg")]), &groups), Ok(None));
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
            let err = declared(&labels(&bad), &groups).unwrap_err();
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
}
