//! The checks of what the service controls: devices, container runtimes,
//! tenants (by cgroup, container name or label, QMP, libvirt) and groups.

use super::check::Checker;
use super::checked::*;
use super::raw::*;
use super::ConfigError;
use iofloor_core::{CostModel, GroupSpec, TenantClass, ValidationError};
use iofloor_host::DevId;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use toml::Spanned;

impl Checker<'_> {
    pub(super) fn device(&self, d: DeviceEntry) -> Result<DeviceConfig, ValidationError> {
        let (id, path) = match (&d.path, &d.id) {
            (Some(p), None) => {
                let id = DevId::of_block_device(p)
                    .map_err(|e| ValidationError::new("path", e.to_string()))?;
                (id, Some(p.clone()))
            }
            (None, Some(text)) => {
                let id: DevId = text.parse().map_err(|e: iofloor_host::HostError| {
                    ValidationError::new("id", e.to_string())
                })?;
                (id, None)
            }
            _ => {
                return Err(ValidationError::new(
                    "path",
                    "give exactly one of `path` and `id` (major:minor)",
                ))
            }
        };
        let model = match (d.model, d.model_file, d.calibrate) {
            (Some(p), None, false) => ModelSource::Inline(
                CostModel::new(p).map_err(|e| ValidationError::new("model", e.to_string()))?,
            ),
            (None, Some(f), false) => ModelSource::File(self.resolve(&f)),
            (None, None, true) => ModelSource::Calibrate,
            _ => {
                return Err(ValidationError::new(
                    "model",
                    "give exactly one of `[device.model]`, `model_file` and `calibrate = true`",
                ))
            }
        };
        let name = d.name.unwrap_or_else(|| match &path {
            Some(p) => p.display().to_string(),
            None => id.to_string(),
        });
        Ok(DeviceConfig {
            name,
            path,
            id,
            model,
        })
    }

    pub(super) fn devices(
        &self,
        entries: Vec<Spanned<DeviceEntry>>,
    ) -> Result<Vec<DeviceConfig>, ConfigError> {
        // No device is a valid config: the package ships one, and the
        // service then controls nothing until a device is added (`iofloor
        // run --check` and the service's start say so).
        let mut devices: Vec<DeviceConfig> = Vec::new();
        for (i, entry) in entries.into_iter().enumerate() {
            let span = entry.span();
            let here = format!("device[{i}]");
            let d = self
                .device(entry.into_inner())
                .map_err(|e| self.error(Some(&span), e.under(&here)))?;
            if devices.iter().any(|o| o.name == d.name || o.id == d.id) {
                let e = ValidationError::new(
                    "name",
                    format!("device `{}` ({}) is listed twice", d.name, d.id),
                );
                return Err(self.error(Some(&span), e.under(&here)));
            }
            devices.push(d);
        }
        Ok(devices)
    }

    /// The `[[runtime]]`s: a name, its API socket, and for one whose labels
    /// are trusted the device its labelled containers use.
    pub(super) fn runtimes(
        &self,
        entries: Vec<Spanned<RuntimeEntry>>,
        devices: &[DeviceConfig],
    ) -> Result<Vec<RuntimeConfig>, ConfigError> {
        let mut runtimes: Vec<RuntimeConfig> = Vec::new();
        for (i, entry) in entries.into_iter().enumerate() {
            let span = entry.span();
            let r = entry.into_inner();
            let bad =
                |e: ValidationError| self.error(Some(&span), e.under(&format!("runtime[{i}]")));
            if r.name.trim().is_empty()
                || r.name.contains(['/', '"', '\\'])
                || r.name.chars().any(char::is_control)
            {
                return Err(bad(ValidationError::new(
                    "name",
                    "must be non-empty, without `/`, quotes or control characters",
                )));
            }
            if runtimes.iter().any(|o| o.name == r.name) {
                return Err(bad(ValidationError::new("name", "used twice")));
            }
            let device = if r.trust_labels {
                Some(
                    device_named(
                        r.device.as_deref(),
                        devices,
                        "runtime's labelled containers",
                    )
                    .map_err(bad)?,
                )
            } else if r.device.is_some() {
                return Err(bad(ValidationError::new(
                    "device",
                    "is where labelled containers' promises apply: it goes with `trust_labels = true`",
                )));
            } else {
                None
            };
            let timeout = r.timeout.map(|d| d.0).unwrap_or(Duration::from_secs(2));
            if timeout < Duration::from_millis(10) || timeout > Duration::from_secs(30) {
                return Err(bad(ValidationError::new(
                    "timeout",
                    format!("must be between 10ms and 30s, got {timeout:?}"),
                )));
            }
            runtimes.push(RuntimeConfig {
                name: r.name,
                socket: self.resolve(&r.socket),
                trust_labels: r.trust_labels,
                device,
                timeout,
            });
        }
        Ok(runtimes)
    }

    pub(super) fn tenant(
        &self,
        mut t: TenantEntry,
        devices: &[DeviceConfig],
        runtimes: &[RuntimeConfig],
    ) -> Result<TenantConfig, ValidationError> {
        if t.name.trim().is_empty()
            || t.name.contains(['/', '"', '\\'])
            || t.name.chars().any(char::is_control)
        {
            return Err(ValidationError::new(
                "name",
                "must be non-empty, without `/`, quotes or control characters",
            ));
        }
        let source = self.source(&mut t, runtimes)?;
        let class = t.class.unwrap_or(match source {
            TenantSource::Cgroup(_)
            | TenantSource::Kubernetes { .. }
            | TenantSource::Container { .. } => TenantClass::Container,
            TenantSource::Qmp { .. } | TenantSource::Libvirt { .. } => TenantClass::Vm,
        });
        let device = device_named(t.device.as_deref(), devices, "tenant")?;
        let weight = t.weight.unwrap_or(iofloor_core::model::DEFAULT_WEIGHT);
        let (floor, ceiling) = (t.floor.map(|f| f.0), t.ceiling.map(|c| c.0));
        iofloor_core::model::check_promise(floor, ceiling, Some(weight))?;
        Ok(TenantConfig {
            name: t.name,
            source,
            device,
            class,
            floor,
            ceiling,
            weight,
            latency_sensitive: t.latency_sensitive,
            group: None,
            group_cgroup: None,
            share: t.share,
        })
    }

    /// Where a tenant entry's I/O is found: one cgroup, QEMU drive, libvirt
    /// domain, the kubelet's pods or a runtime's containers (taken out of `t`).
    pub(super) fn source(
        &self,
        t: &mut TenantEntry,
        runtimes: &[RuntimeConfig],
    ) -> Result<TenantSource, ValidationError> {
        if t.container.is_some() || t.labels.is_some() {
            return container_source(t, runtimes);
        }
        keys_without_their_source(t)?;
        let source = match (
            t.cgroup.take(),
            t.qmp.take(),
            t.drive.take(),
            t.libvirt.take(),
            t.kubernetes.take(),
        ) {
            (None, None, None, None, Some(kubepods)) => {
                if kubepods.trim().is_empty() || kubepods.split('/').any(|p| p == "..") {
                    return Err(ValidationError::new(
                        "kubernetes",
                        "must be `auto` or the kubepods cgroup (`kubepods`, `kubepods.slice`), without `..`",
                    ));
                }
                TenantSource::Kubernetes { kubepods }
            }
            (None, None, None, Some(domain), None) => libvirt_source(domain, t.disk.take())?,
            (Some(c), None, None, None, None) => {
                self.not_a_mount_path(&c)?;
                let c = c.trim_start_matches('/').to_string();
                if c.split('/').any(|part| part == "..") {
                    return Err(ValidationError::new("cgroup", "`..` is not allowed"));
                }
                TenantSource::Cgroup(c)
            }
            (None, Some(q), Some(drive), None, None) => TenantSource::Qmp {
                socket: self.resolve(Path::new(&q)).display().to_string(),
                drive,
            },
            (None, Some(_), None, None, None) => {
                return Err(ValidationError::new(
                    "drive",
                    "`qmp` needs `drive` (the drive's id or qdev path)",
                ))
            }
            _ => {
                return Err(ValidationError::new(
                    "cgroup",
                    "give one of `cgroup`, `qmp` with `drive`, `libvirt`, `kubernetes`, `container` or `labels`",
                ))
            }
        };
        Ok(source)
    }

    pub(super) fn tenants(
        &self,
        entries: Vec<Spanned<TenantEntry>>,
        devices: &[DeviceConfig],
        runtimes: &[RuntimeConfig],
    ) -> Result<Vec<TenantConfig>, ConfigError> {
        let mut tenants: Vec<TenantConfig> = Vec::new();
        for (i, entry) in entries.into_iter().enumerate() {
            let span = entry.span();
            let t = entry.into_inner();
            // The name helps find the entry; the index is the key path.
            let here = format!("tenant[{i}]");
            let named = t.name.clone();
            let located = |e: ValidationError| {
                let mut err = self.error(Some(&span), e.under(&here));
                err.message = format!("{} (tenant `{named}`)", err.message);
                err
            };
            if tenants.iter().any(|o| o.name == t.name) {
                return Err(located(ValidationError::new("name", "used twice")));
            }
            let tenant = self.tenant(t, devices, runtimes).map_err(located)?;
            // One cgroup, drive or disk is one tenant, in one group: two
            // entries naming it would give it two promises.
            if let Some(j) = tenants
                .iter()
                .position(|o| o.source == tenant.source && o.device == tenant.device)
            {
                return Err(located(ValidationError::new(
                    tenant.source_key(),
                    format!(
                        "`{}` on this device is `tenant[{j}]`'s too: a tenant is named once (and is in one group)",
                        tenant.source.pattern()
                    ),
                )));
            }
            tenants.push(tenant);
        }
        Ok(tenants)
    }

    /// The `[[group]]`s, checked as scenarios check them
    /// (iofloor_core::hierarchy), and each tenant entry given the group it
    /// names. `named` holds each tenant entry's `group` and span.
    pub(super) fn groups(
        &self,
        entries: Vec<Spanned<GroupEntry>>,
        named: &[(Option<String>, std::ops::Range<usize>)],
        tenants: &mut [TenantConfig],
    ) -> Result<Vec<Arc<GroupSpec>>, ConfigError> {
        use iofloor_core::hierarchy::{build_groups, check_member_floors, GroupDef};
        let spans: Vec<std::ops::Range<usize>> = entries.iter().map(|e| e.span()).collect();
        let mut cgroups = Vec::with_capacity(entries.len());
        let defs: Vec<GroupDef> = entries
            .into_iter()
            .map(|e| {
                let g = e.into_inner();
                cgroups.push(g.cgroup);
                GroupDef {
                    name: g.name,
                    floor: g.floor.map(|f| f.0),
                    ceiling: g.ceiling.map(|c| c.0),
                    weight: g.weight,
                    parent: g.group,
                }
            })
            .collect();
        let at = |(i, e): (usize, ValidationError)| {
            self.error(spans.get(i), e.under(&format!("group[{i}]")))
        };
        let cgroups = cgroups
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                c.map(|c| self.group_cgroup(&c))
                    .transpose()
                    .map_err(|e| at((i, e)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let groups = build_groups(&defs).map_err(at)?;
        if let Some(i) = defs
            .iter()
            .position(|g| tenants.iter().any(|t| t.name == g.name))
        {
            return Err(at((
                i,
                ValidationError::new("name", format!("`{}` names a tenant too", defs[i].name)),
            )));
        }
        let mut members = Vec::new();
        for (ti, (name, span)) in named.iter().enumerate() {
            let Some(name) = name else { continue };
            let Some(g) = groups.iter().position(|g| g.name == *name) else {
                return Err(self.error(
                    Some(span),
                    ValidationError::new("group", format!("`{name}` is not a `[[group]]`"))
                        .under(&format!("tenant[{ti}]")),
                ));
            };
            tenants[ti].group = Some(groups[g].clone());
            tenants[ti].group_cgroup = cgroups[g].clone();
            members.push((g, tenants[ti].floor));
        }
        check_member_floors(&groups, members).map_err(at)?;
        if let Some(e) = one_limit_refused(&groups, &cgroups, tenants) {
            return Err(at(e));
        }
        Ok(groups)
    }

    /// A `[[group]]`'s `cgroup`: one cgroup's path under the root, as a
    /// tenant's (no glob: a group has one cgroup).
    pub(super) fn group_cgroup(&self, cgroup: &str) -> Result<PathBuf, ValidationError> {
        self.not_a_mount_path(cgroup)?;
        let c = cgroup.trim_start_matches('/');
        if c.is_empty() || c.split('/').any(|part| part == "..") || c.contains(['*', '?', '[']) {
            return Err(ValidationError::new(
                "cgroup",
                format!("`{cgroup}` must name one cgroup under the root, without `..` or a glob"),
            ));
        }
        Ok(PathBuf::from(c))
    }
}

/// Keys that only go with a source the entry does not give.
fn keys_without_their_source(t: &TenantEntry) -> Result<(), ValidationError> {
    if t.runtime.is_some() {
        return Err(ValidationError::new(
            "runtime",
            "goes with `container` or `labels` (a runtime's containers)",
        ));
    }
    if t.libvirt.is_none() && t.disk.is_some() {
        return Err(ValidationError::new(
            "disk",
            "goes with `libvirt` (a domain's disk)",
        ));
    }
    if t.share.is_some() && t.libvirt.is_none() {
        return Err(ValidationError::new(
            "share",
            "`share = \"vm\"` goes with `libvirt` (a VM's disks share its floor)",
        ));
    }
    Ok(())
}

/// A libvirt domain's disk (all its disks without `disk`).
fn libvirt_source(domain: String, disk: Option<String>) -> Result<TenantSource, ValidationError> {
    if domain.trim().is_empty() {
        return Err(ValidationError::new(
            "libvirt",
            "must name a domain, a glob or a UUID",
        ));
    }
    let disk = disk.unwrap_or_else(|| "*".into());
    if disk.is_empty() || disk.contains('/') {
        return Err(ValidationError::new(
            "disk",
            format!("`{disk}` is not a disk target such as `vda` (or a glob)"),
        ));
    }
    Ok(TenantSource::Libvirt { domain, disk })
}

/// Why a group with a `cgroup` cannot hold its members' caps as one limit
/// there, if it cannot: one limit holds what the members may use together,
/// so no member may have a floor or ceiling of its own, nor be a group.
pub(super) fn one_limit_refused(
    groups: &[Arc<GroupSpec>],
    cgroups: &[Option<PathBuf>],
    tenants: &[TenantConfig],
) -> Option<(usize, ValidationError)> {
    let refused = |g: &GroupSpec, why: String| {
        ValidationError::new(
            "cgroup",
            format!(
                "`{}`'s members share one limit on its cgroup, so {why}; without `cgroup` \
                 each member is capped on its own",
                g.name
            ),
        )
    };
    for (i, g) in groups.iter().enumerate() {
        if cgroups[i].is_none() {
            continue;
        }
        let member = tenants.iter().find(|t| {
            t.group.as_ref().is_some_and(|m| m.name == g.name)
                && (t.floor.is_some() || t.ceiling.is_some())
        });
        if let Some(t) = member {
            return Some((
                i,
                refused(
                    g,
                    format!(
                        "member `{}` may not have a floor or ceiling of its own",
                        t.name
                    ),
                ),
            ));
        }
        if let Some(inner) = groups
            .iter()
            .find(|o| o.parent.as_ref().is_some_and(|p| p.name == g.name))
        {
            return Some((
                i,
                refused(g, format!("group `{}` may not be inside it", inner.name)),
            ));
        }
    }
    None
}

/// The index of the device a tenant (or a runtime's labelled containers,
/// `what`) names, or of the only one.
pub(super) fn device_named(
    name: Option<&str>,
    devices: &[DeviceConfig],
    what: &str,
) -> Result<usize, ValidationError> {
    match name {
        Some(name) => devices
            .iter()
            .position(|d| d.name == name)
            .ok_or_else(|| ValidationError::new("device", format!("no [[device]] named `{name}`"))),
        None if devices.len() == 1 => Ok(0),
        None if devices.is_empty() => Err(ValidationError::new(
            "device",
            format!("no [[device]] is configured: add the one this {what} uses"),
        )),
        None => Err(ValidationError::new(
            "device",
            "is needed when there are several devices",
        )),
    }
}

/// A tenant entry's containers: `container` (a name or glob), `labels`
/// (each value a glob), of the `[[runtime]]` `runtime` names or of any.
pub(super) fn container_source(
    t: &mut TenantEntry,
    runtimes: &[RuntimeConfig],
) -> Result<TenantSource, ValidationError> {
    let others = [
        ("cgroup", t.cgroup.is_some()),
        ("qmp", t.qmp.is_some()),
        ("libvirt", t.libvirt.is_some()),
        ("kubernetes", t.kubernetes.is_some()),
    ];
    if let Some((key, _)) = others.iter().find(|(_, given)| *given) {
        return Err(ValidationError::new(
            *key,
            "a tenant is found one way: `container`/`labels` or this, not both",
        ));
    }
    if runtimes.is_empty() {
        return Err(ValidationError::new(
            "container",
            "containers are found through a runtime: add a [[runtime]] with its socket",
        ));
    }
    let runtime = match t.runtime.take() {
        Some(name) => Some(
            runtimes
                .iter()
                .position(|r| r.name == name)
                .ok_or_else(|| {
                    ValidationError::new("runtime", format!("no [[runtime]] named `{name}`"))
                })?,
        ),
        None => None,
    };
    let name = t.container.take();
    if let Some(n) = &name {
        if n.trim().is_empty() || glob::Pattern::new(n).is_err() {
            return Err(ValidationError::new(
                "container",
                format!("`{n}` is not a container name or glob"),
            ));
        }
    }
    let labels = t.labels.take().unwrap_or_default();
    for (key, value) in &labels {
        if key.trim().is_empty() || glob::Pattern::new(value).is_err() {
            return Err(ValidationError::new(
                "labels",
                format!("`{key} = \"{value}\"` is not a label and a value (or glob)"),
            ));
        }
    }
    if name.is_none() && labels.is_empty() {
        return Err(ValidationError::new(
            "labels",
            "must name at least one label (or give `container`)",
        ));
    }
    Ok(TenantSource::Container {
        runtime,
        name,
        labels,
        labelled: false,
    })
}

/// For each runtime whose labels are trusted, the entry of its containers
/// that declare a promise in `io.iofloor.*` labels and that no tenant entry
/// names, appended after the file's: tenants named `RUNTIME/CONTAINER`.
/// `Err` names the runtime whose name a tenant entry already has.
pub(super) fn labelled_tenants(
    runtimes: &[RuntimeConfig],
    tenants: &mut Vec<TenantConfig>,
) -> Result<(), (usize, String)> {
    for (i, r) in runtimes.iter().enumerate() {
        let Some(device) = r.device.filter(|_| r.trust_labels) else {
            continue;
        };
        if tenants.iter().any(|t| t.name == r.name) {
            return Err((
                i,
                format!(
                    "`{}` is a tenant's name too: its labelled containers are named `{}/CONTAINER`",
                    r.name, r.name
                ),
            ));
        }
        tenants.push(TenantConfig {
            name: r.name.clone(),
            source: TenantSource::Container {
                runtime: Some(i),
                name: None,
                labels: Default::default(),
                labelled: true,
            },
            device,
            class: TenantClass::Container,
            floor: None,
            ceiling: None,
            weight: iofloor_core::model::DEFAULT_WEIGHT,
            latency_sensitive: false,
            group: None,
            group_cgroup: None,
            share: None,
        });
    }
    Ok(())
}
