//! The whole cluster as one table, for `iofloor top --cluster`, the
//! dashboard and `GET /api/v1/cluster`: every host's tenants of a shared
//! device with their promises, use and caps, and who allocates. Built from
//! what etcd holds (the reports and the allocations), so any agent can
//! answer, not only the allocator; pure, so it is tested without etcd.

use crate::wire::{Allocation, HostReport};
use iofloor_core::{Caps, Rate, TenantClass};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterView {
    pub cluster: String,
    pub device: String,
    /// The allocator's host, from the election.
    pub allocator: Option<String>,
    /// The allocator's term and what it believes, from the newest allocation.
    pub epoch: Option<i64>,
    /// Learned capacity and the active floors' cost, in cost units per second.
    pub capacity: Option<f64>,
    pub floors: Option<f64>,
    /// Hosts with a live report, in name order.
    pub hosts: Vec<HostView>,
    /// Hosts with an allocation but no live report: gone quiet with their
    /// caps in force (agent killed, host cut off) or left without deleting
    /// it. The allocator counts their last load as load it cannot cap
    /// (crate::allocate::Ghost), for a while.
    #[serde(default)]
    pub quiet: Vec<QuietHost>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuietHost {
    pub host: String,
    /// Its tenants' use in its last report, in cost units per second.
    pub load: f64,
    pub allocation: AllocationRef,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostView {
    pub host: String,
    /// Sum of its tenants' use over the last interval.
    pub iops: f64,
    pub bytes_per_s: f64,
    /// The allocation etcd holds for it, if any.
    pub allocation: Option<AllocationRef>,
    pub tenants: Vec<TenantRow>,
}

/// Which allocation: the allocator's term and its round in that term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationRef {
    pub epoch: i64,
    pub seq: u64,
}

impl From<&Allocation> for AllocationRef {
    fn from(a: &Allocation) -> AllocationRef {
        AllocationRef {
            epoch: a.epoch,
            seq: a.seq,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantRow {
    pub name: String,
    pub class: TenantClass,
    pub floor: Option<Rate>,
    pub ceiling: Option<Rate>,
    pub weight: f64,
    /// Use over the host's last interval; `None` without a trustworthy sample.
    pub iops: Option<f64>,
    pub bytes_per_s: Option<f64>,
    /// Caps in force on its host during that interval.
    pub caps: Caps,
    /// What the allocator gave it last (absent before the first allocation,
    /// or for a tenant the allocator has not seen yet).
    pub allocated: Option<Caps>,
}

impl ClusterView {
    /// The view of `device` from the reports and allocations read from etcd
    /// (values of other devices are left out).
    pub fn build(
        cluster: &str,
        device: &str,
        allocator: Option<String>,
        reports: &[HostReport],
        allocations: &[Allocation],
    ) -> ClusterView {
        let allocations: Vec<&Allocation> =
            allocations.iter().filter(|a| a.device == device).collect();
        let newest = allocations.iter().max_by_key(|a| (a.epoch, a.seq)).copied();
        let mut reports: Vec<&HostReport> = reports.iter().filter(|r| r.device == device).collect();
        reports.sort_by(|a, b| a.host.cmp(&b.host));
        let hosts = reports
            .into_iter()
            .map(|r| {
                let allocation = allocations.iter().find(|a| a.host == r.host);
                let tenants: Vec<TenantRow> = r
                    .tenants
                    .iter()
                    .map(|t| TenantRow {
                        name: t.spec.name.clone(),
                        class: t.spec.class,
                        floor: t.spec.floor,
                        ceiling: t.spec.ceiling,
                        weight: t.spec.weight,
                        iops: t.usage.map(|u| u.read.ios + u.write.ios),
                        bytes_per_s: t.usage.map(|u| u.read.bytes + u.write.bytes),
                        caps: t.caps,
                        allocated: allocation.and_then(|a| a.caps_of(&t.spec.name)),
                    })
                    .collect();
                HostView {
                    host: r.host.clone(),
                    iops: tenants.iter().filter_map(|t| t.iops).sum(),
                    bytes_per_s: tenants.iter().filter_map(|t| t.bytes_per_s).sum(),
                    allocation: allocation.map(|a| AllocationRef::from(*a)),
                    tenants,
                }
            })
            .collect::<Vec<HostView>>();
        let mut quiet: Vec<QuietHost> = allocations
            .iter()
            .filter(|a| !hosts.iter().any(|h| h.host == a.host))
            .map(|a| QuietHost {
                host: a.host.clone(),
                load: a.load,
                allocation: AllocationRef::from(*a),
            })
            .collect();
        quiet.sort_by(|a, b| a.host.cmp(&b.host));
        ClusterView {
            cluster: cluster.to_string(),
            device: device.to_string(),
            allocator,
            epoch: newest.map(|a| a.epoch),
            capacity: newest.map(|a| a.capacity),
            floors: newest.map(|a| a.floors),
            hosts,
            quiet,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{TenantReport, SCHEMA};
    use iofloor_core::TenantSpec;

    fn report(host: &str, device: &str, tenants: &[(&str, Option<f64>, f64)]) -> HostReport {
        HostReport {
            schema: SCHEMA,
            host: host.into(),
            device: device.into(),
            seq: 1,
            interval_s: 1.0,
            local_device: None,
            tenants: tenants
                .iter()
                .map(|(name, floor, iops)| {
                    let mut spec = TenantSpec::new(*name, TenantClass::Container);
                    spec.floor = floor.map(Rate::Iops);
                    TenantReport {
                        spec,
                        usage: Some(iofloor_core::synthetic::random_reads_4k(*iops)),
                        caps: Caps::NONE,
                    }
                })
                .collect(),
        }
    }

    fn allocation(host: &str, epoch: i64, seq: u64, caps: &[(&str, f64)]) -> Allocation {
        Allocation {
            schema: SCHEMA,
            host: host.into(),
            device: "shared".into(),
            epoch,
            seq,
            interval_s: 1.0,
            capacity: 0.8,
            floors: 0.25 * epoch as f64,
            hosts: 2,
            caps: caps
                .iter()
                .map(|(t, iops)| {
                    let caps = Caps {
                        read_iops: Some(*iops),
                        ..Caps::NONE
                    };
                    (t.to_string(), caps)
                })
                .collect(),
            load: 0.0,
            contended: None,
        }
    }

    #[test]
    fn every_hosts_tenants_with_their_allocation_and_the_newest_term() {
        let reports = [
            report("h2", "shared", &[("noisy", None, 3000.0)]),
            report(
                "h1",
                "shared",
                &[("db", Some(1000.0), 1050.0), ("web", None, 0.0)],
            ),
            report("h9", "other", &[("x", None, 5.0)]),
        ];
        let mut quiet = allocation("h3", 6, 8, &[("etl", 500.0)]);
        quiet.load = 0.12;
        let allocations = [
            allocation("h1", 7, 3, &[("db", 1200.0)]),
            allocation("h2", 6, 9, &[("noisy", 900.0)]),
            quiet,
        ];
        let v = ClusterView::build("c", "shared", Some("h1".into()), &reports, &allocations);
        let hosts: Vec<&str> = v.hosts.iter().map(|h| h.host.as_str()).collect();
        assert_eq!(hosts, ["h1", "h2"], "by name, only this device's");
        assert_eq!(v.epoch, Some(7));
        assert_eq!(v.floors, Some(1.75), "from the newest allocation");
        let h1 = &v.hosts[0];
        assert_eq!(h1.iops, 1050.0);
        assert_eq!(h1.allocation, Some(AllocationRef { epoch: 7, seq: 3 }));
        assert_eq!(
            h1.tenants[0].allocated.and_then(|c| c.read_iops),
            Some(1200.0)
        );
        assert_eq!(h1.tenants[1].allocated, None, "not allocated yet");
        assert_eq!(h1.tenants[0].floor, Some(Rate::Iops(1000.0)));
        assert_eq!(
            v.quiet,
            vec![QuietHost {
                host: "h3".into(),
                load: 0.12,
                allocation: AllocationRef { epoch: 6, seq: 8 },
            }],
            "an allocation without a report"
        );
        let empty = ClusterView::build("c", "shared", None, &[], &[]);
        assert!(empty.hosts.is_empty() && empty.capacity.is_none());
    }
}
