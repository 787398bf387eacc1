use super::*;
use iofloor_core::units::Rate;
use iofloor_core::TenantClass;
use iofloor_host::DevId;
use std::sync::Arc;
use std::time::Duration;

const GOOD: &str = r#"
interval = "500ms"
state_file = "state.json"

[policy]
kind = "floor"
[policy.floor]
queue_knee = 4

[api]
listen = "127.0.0.1:0"
token = "s3cret"

[[device]]
name = "data"
id = "7:0"
[device.model]
rbps = 200e6
rseqiops = 2000
rrandiops = 2000
wbps = 200e6
wseqiops = 2000
wrandiops = 2000

[[tenant]]
name = "pods"
cgroup = "/kubepods*/pod*"
floor = "100 IOPS"

[[tenant]]
name = "vm1"
qmp = "/run/vm1.qmp"
drive = "drive0"
floor = "10MiB/s"
ceiling = "20 MiB/s"
weight = 200
"#;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("/etc/iofloor/test.toml"))
}

#[test]
fn a_full_config_parses() {
    let c = parse(GOOD).unwrap();
    assert_eq!(c.interval, Duration::from_millis(500));
    assert_eq!(c.state_file, PathBuf::from("/etc/iofloor/state.json"));
    assert_eq!(c.params.floor.queue_knee, Some(4.0));
    assert_eq!(c.api.token.as_deref(), Some("s3cret"));
    assert_eq!(c.devices[0].id, DevId { major: 7, minor: 0 });
    assert_eq!(
        c.tenants[0].source,
        TenantSource::Cgroup("kubepods*/pod*".into())
    );
    assert!(c.tenants[0].source.is_glob());
    assert_eq!(c.tenants[0].class, TenantClass::Container);
    assert_eq!(c.tenants[1].class, TenantClass::Vm);
    assert_eq!(
        c.tenants[1].floor,
        Some(Rate::BytesPerSec(10.0 * 1048576.0))
    );
    assert_eq!(c.tenants[1].weight, 200.0);
    // A config in a log never shows the token.
    let shown = format!("{c:?}");
    assert!(
        !shown.contains("s3cret") && shown.contains("<redacted>"),
        "{shown}"
    );
}

#[test]
fn the_shipped_example_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/iofloor.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    // Its device does not exist here: checked by path at load time.
    let text = text
        .replace("path = \"/dev/nvme0n1\"", "id = \"259:0\"")
        .replace("token_file", "# token_file");
    let c = Config::parse(&text, &path).unwrap();
    // Its four entries and the runtime's own for labelled containers.
    assert_eq!(c.tenants.len(), 5);
    assert_eq!(c.tenants[2].floor, Some(Rate::Cost(0.1)));
    assert!(c.tenants[0].source.is_glob());
    assert_eq!(c.tenants[4].name, "podman");
}

/// The package's config (packaging/deb) names no device: valid, and
/// the service controls nothing until one is added.
#[test]
fn the_packaged_config_parses_without_a_device() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/deb/iofloor.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    // Its token file is made at install.
    let text = text.replace("token_file", "# token_file");
    let c = Config::parse(&text, &path).unwrap();
    assert!(c.devices.is_empty() && c.tenants.is_empty());
    assert_eq!(c.api.listen, Some("127.0.0.1:9180".parse().unwrap()));
}

/// The DaemonSet's ConfigMap holds a config this daemon takes.
#[test]
fn the_kubernetes_manifest_carries_a_valid_config() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kubernetes/daemonset.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut found = None;
    for doc in serde_norway::Deserializer::from_str(&text) {
        let v: serde_norway::Value = serde::Deserialize::deserialize(doc).unwrap();
        if v["kind"].as_str() == Some("ConfigMap") {
            found = v["data"]["iofloor.toml"].as_str().map(str::to_string);
        }
    }
    let toml = found.expect("a ConfigMap with iofloor.toml");
    let c = Config::parse(&toml, Path::new("/etc/iofloor/iofloor.toml")).unwrap();
    assert_eq!(
        c.tenants[0].source,
        TenantSource::Kubernetes {
            kubepods: "auto".into()
        }
    );
    assert_eq!(
        c.cgroup_root.as_deref(),
        Some(Path::new("/host/sys/fs/cgroup"))
    );
}

fn error_of(text: &str) -> ConfigError {
    parse(text).unwrap_err()
}

#[test]
fn runtimes_and_container_tenants_parse_and_refuse_bad_entries_at_their_line() {
    let device = "[[device]]\nname = \"data\"\nid = \"7:0\"\nmodel = { rbps = 1e9, rseqiops = 1e3, rrandiops = 1e3, wbps = 1e9, wseqiops = 1e3, wrandiops = 1e3 }\n";
    let runtime = "[[runtime]]\nname = \"podman\"\nsocket = \"/run/podman/podman.sock\"\ntrust_labels = true\n";
    let with = |rest: &str| format!("{device}{runtime}\n{rest}");
    let c = parse(&with(
        "[[tenant]]\nname = \"db\"\ncontainer = \"db-*\"\nlabels = { tier = \"gold\" }\nruntime = \"podman\"\nfloor = \"500iops\"\n",
    ))
    .unwrap();
    assert_eq!(c.runtimes[0].device, Some(0));
    assert_eq!(c.runtimes[0].timeout, Duration::from_secs(2));
    assert!(matches!(
        &c.tenants[0].source,
        TenantSource::Container { runtime: Some(0), name: Some(n), labels, labelled: false }
            if n == "db-*" && labels["tier"] == "gold"
    ));
    assert_eq!(c.tenants[0].class, TenantClass::Container);
    // The runtime's own entry for its labelled containers, after the file's.
    assert_eq!(c.tenants[1].name, "podman");
    assert!(matches!(
        c.tenants[1].source,
        TenantSource::Container { labelled: true, .. }
    ));
    for (rest, line, expected) in [
        (
            "[[tenant]]\nname = \"a\"\nruntime = \"podman\"\ncgroup = \"a\"\n",
            10,
            "`tenant[0].runtime` goes with `container` or `labels`",
        ),
        (
            "[[tenant]]\nname = \"a\"\ncontainer = \"a\"\nruntime = \"docker\"\n",
            10,
            "no [[runtime]] named `docker`",
        ),
        (
            "[[tenant]]\nname = \"a\"\ncontainer = \"a\"\ncgroup = \"a\"\n",
            10,
            "`tenant[0].cgroup` a tenant is found one way",
        ),
        (
            "[[tenant]]\nname = \"a\"\ncontainer = \"[\"\n",
            10,
            "is not a container name or glob",
        ),
        (
            "[[tenant]]\nname = \"a\"\nlabels = {}\n",
            10,
            "must name at least one label",
        ),
        (
            "[[tenant]]\nname = \"podman\"\ncgroup = \"a\"\n",
            5,
            "its labelled containers are named `podman/CONTAINER`",
        ),
        (
            "[[runtime]]\nname = \"podman\"\nsocket = \"/x\"\n",
            10,
            "`runtime[1].name` used twice",
        ),
        (
            "[[runtime]]\nname = \"d\"\nsocket = \"/x\"\ndevice = \"data\"\n",
            10,
            "goes with `trust_labels = true`",
        ),
        (
            "[[runtime]]\nname = \"d\"\nsocket = \"/x\"\ntimeout = \"1h\"\n",
            10,
            "between 10ms and 30s",
        ),
    ] {
        let e = error_of(&with(rest));
        assert!(e.message.contains(expected), "{rest}: {e}");
        assert_eq!(e.line, Some(line), "{rest}: {e}");
    }
    let e = error_of(&format!(
        "{device}[[tenant]]\nname = \"a\"\ncontainer = \"a\"\n"
    ));
    assert!(e.message.contains("add a [[runtime]]"), "{e}");
}

#[test]
fn libvirt_tenants_parse_and_refuse_bad_entries() {
    let device = "[[device]]\nname = \"data\"\nid = \"7:0\"\nmodel = { rbps = 1e9, rseqiops = 1e3, rrandiops = 1e3, wbps = 1e9, wseqiops = 1e3, wrandiops = 1e3 }\n";
    let with = |rest: &str| format!("{device}\n{rest}");
    let c = parse(&with(
        "[libvirt]\nuri = \"qemu+ssh://host/system\"\n\n[[tenant]]\nname = \"web\"\nlibvirt = \"web-*\"\nshare = \"vm\"\nfloor = \"500 IOPS\"\n\n[[tenant]]\nname = \"db\"\nlibvirt = \"45d7044c-161a-47c0-adb9-42576888cba3\"\ndisk = \"vdb\"\n",
    ))
    .unwrap();
    assert_eq!(c.libvirt_uri, "qemu+ssh://host/system");
    assert_eq!(
        c.tenants[0].source,
        TenantSource::Libvirt {
            domain: "web-*".into(),
            disk: "*".into()
        }
    );
    assert_eq!(c.tenants[0].share, Some(Share::Vm));
    assert_eq!(c.tenants[0].class, TenantClass::Vm);
    assert!(c.tenants[0].source.is_glob() && !c.tenants[1].source.is_glob());
    let plain = parse(&with("[[tenant]]\nname = \"a\"\ncgroup = \"a\"\n")).unwrap();
    assert_eq!(plain.libvirt_uri, "qemu:///system");

    let e = error_of(&with(
        "[[tenant]]\nname = \"a\"\ncgroup = \"a\"\nshare = \"vm\"\n",
    ));
    assert!(
        e.message.contains("`tenant[0].share`") && e.message.contains("goes with `libvirt`"),
        "{e}"
    );
    let e = error_of(&with(
        "[[tenant]]\nname = \"a\"\ncgroup = \"a\"\ndisk = \"vda\"\n",
    ));
    assert!(
        e.message.contains("`tenant[0].disk` goes with `libvirt`"),
        "{e}"
    );
    let e = error_of(&with(
        "[[tenant]]\nname = \"a\"\nlibvirt = \"vm\"\ncgroup = \"a\"\n",
    ));
    assert!(e.message.contains("give one of `cgroup`"), "{e}");
    let e = error_of(&with(
        "[[tenant]]\nname = \"a\"\nlibvirt = \"vm\"\ndisk = \"../vda\"\n",
    ));
    assert!(e.message.contains("`tenant[0].disk`"), "{e}");
    let e = error_of(&with(
        "[[tenant]]\nname = \"a\"\nlibvirt = \"vm\"\nshare = \"pod\"\n",
    ));
    assert!(e.message.contains("unknown variant `pod`"), "{e}");
    assert_eq!(e.line, Some(9), "{e}");
    let e = error_of(&with("[[tenant]]\nname = \"a\"\ncgroup = \"x/y\"\n\n[[tenant]]\nname = \"b\"\ncgroup = \"/x/y\"\n"));
    assert!(
        e.message
            .contains("`tenant[1].cgroup` `x/y` on this device is `tenant[0]`'s too"),
        "{e}"
    );
    let e = error_of(&with("[libvirt]\nuri = \"\"\n"));
    assert!(e.message.contains("`libvirt.uri`"), "{e}");
}

#[test]
fn a_cgroup_given_as_a_filesystem_path_is_refused_with_the_path_to_give() {
    let device = "[[device]]\nname = \"data\"\nid = \"7:0\"\nmodel = { rbps = 1e9, rseqiops = 1e3, rrandiops = 1e3, wbps = 1e9, wseqiops = 1e3, wrandiops = 1e3 }\n";
    let tenant = |root: &str, cgroup: &str| {
        format!("{root}{device}\n[[tenant]]\nname = \"a\"\ncgroup = \"{cgroup}\"\n")
    };
    let e = error_of(&tenant("", "/sys/fs/cgroup/blkio/team/db"));
    assert!(e.message.contains("`tenant[0].cgroup`"), "{e}");
    assert!(e.message.contains("e.g. `team/db`"), "{e}");
    assert_eq!(e.line, Some(6), "the tenant's table: {e}");
    let e = error_of(&tenant(
        "cgroup_root = \"/host/cg\"\n",
        "/host/cg/unified/team/db",
    ));
    assert!(e.message.contains("e.g. `team/db`"), "{e}");
    // A path inside the hierarchy, with or without its leading `/`.
    for cgroup in ["/team/db", "team/db", "/kubepods*/pod*"] {
        let c = parse(&tenant("", cgroup)).unwrap();
        assert_eq!(c.tenants.len(), 1, "{cgroup}");
    }
}

#[test]
fn groups_link_tenants_and_refuse_bad_trees_at_their_line() {
    let device = "[[device]]\nname = \"data\"\nid = \"7:0\"\nmodel = { rbps = 1e9, rseqiops = 1e3, rrandiops = 1e3, wbps = 1e9, wseqiops = 1e3, wrandiops = 1e3 }\n";
    let tenants = "[[tenant]]\nname = \"db\"\ncgroup = \"a/db\"\nfloor = \"300 IOPS\"\ngroup = \"team\"\n\n[[tenant]]\nname = \"web\"\ncgroup = \"a/web*\"\ngroup = \"team\"\n";
    let with = |groups: &str| format!("{device}\n{tenants}\n{groups}");
    let good = with(
        "[[group]]\nname = \"customer\"\nfloor = \"1000 IOPS\"\n\n[[group]]\nname = \"team\"\nfloor = \"600 IOPS\"\nceiling = \"900 IOPS\"\nweight = 300\ngroup = \"customer\"\n",
    );
    let c = parse(&good).unwrap();
    assert_eq!(c.groups.len(), 2);
    let team = c.tenants[0].group.as_ref().unwrap();
    assert_eq!(team.name, "team");
    assert_eq!(team.parent.as_ref().unwrap().name, "customer");
    assert_eq!(team.ceiling, Some(Rate::Iops(900.0)));
    assert!(Arc::ptr_eq(team, c.tenants[1].group.as_ref().unwrap()));

    // A cycle, at the line of the group that starts it.
    let e = error_of(&with(
        "[[group]]\nname = \"team\"\ngroup = \"customer\"\n\n[[group]]\nname = \"customer\"\ngroup = \"team\"\n",
    ));
    assert!(
        e.message
            .contains("`group[0].group` makes a cycle: team in customer in team"),
        "{e}"
    );
    assert_eq!(e.line, Some(17), "{e}");
    // A tenant naming no group, at the tenant's line.
    let e = error_of(&with("[[group]]\nname = \"other\"\n"));
    assert_eq!(e.message, "`tenant[0].group` `team` is not a `[[group]]`");
    assert_eq!(e.line, Some(6), "{e}");
    // Members' floors above the group's.
    let e = error_of(&with("[[group]]\nname = \"team\"\nfloor = \"200 IOPS\"\n"));
    assert!(
        e.message.contains(
            "`group[0].floor` 200 IOPS is below what its members' floors add up to (300 IOPS)"
        ),
        "{e}"
    );
    assert_eq!(e.line, Some(17), "{e}");
    // A name used for a group and a tenant.
    let e = error_of(&with(
        "[[group]]\nname = \"team\"\n\n[[group]]\nname = \"db\"\n",
    ));
    assert!(
        e.message
            .contains("`group[1].name` `db` names a tenant too"),
        "{e}"
    );
    // Two groups of one name.
    let e = error_of(&with(
        "[[group]]\nname = \"team\"\n\n[[group]]\nname = \"team\"\n",
    ));
    assert!(
        e.message
            .contains("`group[1].name` `team` names two groups"),
        "{e}"
    );
    assert_eq!(e.line, Some(20), "{e}");
}

#[test]
fn a_group_with_a_cgroup_holds_plain_members_and_refuses_the_rest_at_its_line() {
    let device = "[[device]]\nname = \"data\"\nid = \"7:0\"\nmodel = { rbps = 1e9, rseqiops = 1e3, rrandiops = 1e3, wbps = 1e9, wseqiops = 1e3, wrandiops = 1e3 }\n";
    let tenants = "[[tenant]]\nname = \"staff\"\ncgroup = \"customers/acme/*\"\ngroup = \"acme\"\n";
    let with = |group: &str| {
        format!("{device}\n{tenants}\n[[group]]\nname = \"acme\"\nfloor = \"400 IOPS\"\n{group}")
    };
    let c = parse(&with("cgroup = \"/customers/acme\"\n")).unwrap();
    assert_eq!(
        c.tenants[0].group_cgroup.as_deref(),
        Some(Path::new("customers/acme"))
    );
    let c = parse(&with("")).unwrap();
    assert_eq!(c.tenants[0].group_cgroup, None);
    for bad in ["customers/*", "../x", "", "/"] {
        let e = error_of(&with(&format!("cgroup = \"{bad}\"\n")));
        assert!(
            e.message.starts_with("`group[0].cgroup`") && e.message.contains("one cgroup"),
            "{bad}: {e}"
        );
        assert_eq!(e.line, Some(11), "{e}");
    }
    let e = error_of(&with("cgroup = \"/sys/fs/cgroup/customers/acme\"\n"));
    assert!(e.message.contains("e.g. `customers/acme`"), "{e}");
    // One limit for all: no member with a promise of its own.
    let e = error_of(&format!(
        "{device}\n[[tenant]]\nname = \"db\"\ncgroup = \"c/db\"\nfloor = \"100 IOPS\"\ngroup = \"acme\"\n\n[[group]]\nname = \"acme\"\ncgroup = \"c\"\n"
    ));
    assert!(
        e.message.contains("`group[0].cgroup` `acme`'s members share one limit on its cgroup, so member `db` may not have a floor or ceiling of its own"),
        "{e}"
    );
    // Nor a group inside it.
    let e = error_of(&format!(
        "{device}\n{tenants}\n[[group]]\nname = \"acme\"\ncgroup = \"c\"\n\n[[group]]\nname = \"team\"\ngroup = \"acme\"\n"
    ));
    assert!(
        e.message.contains("group `team` may not be inside it"),
        "{e}"
    );
}

#[test]
fn a_cluster_section_parses_with_defaults_and_refuses_bad_values() {
    let device = "[[device]]\nname = \"data\"\nid = \"7:0\"\nmodel = { rbps = 1e9, rseqiops = 1e3, rrandiops = 1e3, wbps = 1e9, wseqiops = 1e3, wrandiops = 1e3 }\n";
    let with = |cluster: &str| format!("interval = \"500ms\"\n{device}\n[cluster]\n{cluster}");
    let parsed = parse(&with(
        "endpoints = [\"http://10.0.0.1:2379\"]\nhost = \"h1\"\n",
    ))
    .unwrap();
    assert_eq!(
        parsed.watch_interval, None,
        "a cluster decides once an interval"
    );
    let e = error_of(&format!(
        "watch_interval = \"100ms\"\n{}",
        with("endpoints = [\"http://10.0.0.1:2379\"]\nhost = \"h1\"\n")
    ));
    assert_eq!(e.line, Some(1), "{e}");
    assert!(e.message.contains("decide together"), "{e}");
    let c = parsed.cluster.unwrap();
    assert_eq!(c.name, "iofloor");
    assert_eq!(c.host, "h1");
    assert_eq!((c.device, c.shared_device.as_str()), (0, "data"));
    assert_eq!(c.lease_ttl, Duration::from_secs(3));
    assert_eq!(c.stale_after, Duration::from_millis(1500), "3 intervals");
    assert_eq!(
        c.orphan_timeout, None,
        "a quiet host is counted until it reports"
    );
    assert_eq!(c.etcd.request_timeout, Duration::from_millis(500));
    for (cluster, needle) in [
        ("endpoints = []", "cluster.endpoints"),
        ("endpoints = [\"10.0.0.1:2379\"]", "cluster.endpoints"),
        (
            "endpoints = [\"http://e:2379\"]\nhost = \"a/b\"",
            "cluster.host",
        ),
        (
            "endpoints = [\"http://e:2379\"]\ndevice = \"nope\"",
            "cluster.device",
        ),
        (
            "endpoints = [\"http://e:2379\"]\nlease_ttl = \"1s\"",
            "cluster.lease_ttl",
        ),
        (
            "endpoints = [\"http://e:2379\"]\nlease_ttl = \"2500ms\"",
            "cluster.lease_ttl",
        ),
        (
            "endpoints = [\"http://e:2379\"]\nstale_after = \"100ms\"",
            "cluster.stale_after",
        ),
        (
            "endpoints = [\"http://e:2379\"]\norphan_timeout = \"1s\"",
            "cluster.orphan_timeout",
        ),
        (
            "endpoints = [\"http://e:2379\"]\nuser = \"u\"",
            "cluster.user",
        ),
        (
            "endpoints = [\"http://e:2379\"]\ncert_file = \"/etc/hostname\"",
            "cluster.cert_file",
        ),
        (
            "endpoints = [\"http://e:2379\"]\nca_file = \"/no/such/ca.pem\"",
            "cluster.ca_file",
        ),
        ("endpoints = [\"http://e:2379\"]\nleader = true", "leader"),
    ] {
        let e = error_of(&with(cluster));
        assert!(e.message.contains(needle), "{cluster}: {e}");
        // The [cluster] table's line, or the offending key's.
        assert!(matches!(e.line, Some(7..=9)), "{cluster}: {e}");
    }
}

#[test]
fn errors_name_file_line_and_key() {
    let e = error_of(&GOOD.replace("floor = \"100 IOPS\"", "floor = \"100 furlongs\""));
    assert_eq!(e.file, "/etc/iofloor/test.toml");
    assert_eq!(e.line, Some(28), "{e}");
    assert!(
        e.message.contains("furlongs") && e.message.contains("`tenant[0].floor`"),
        "{e}"
    );

    let e = error_of(&GOOD.replace("weight = 200", "weight = 200\nwieght = 3"));
    assert!(e.message.contains("wieght"), "unknown keys are errors: {e}");
    assert_eq!(e.line, Some(37), "{e}");

    let e = error_of(&GOOD.replace("ceiling = \"20 MiB/s\"", "ceiling = \"5 MiB/s\""));
    assert!(
        e.message.contains("`tenant[1].ceiling`")
            && e.message.contains("below `floor`")
            && e.message.contains("(tenant `vm1`)"),
        "{e}"
    );
    assert_eq!(e.line, Some(30), "the line of the tenant's table: {e}");

    let e = error_of(&GOOD.replace("kind = \"floor\"", "kind = \"flor\""));
    assert!(
        e.message.contains("policy.kind") && e.message.contains("flor"),
        "{e}"
    );

    let e = error_of(&GOOD.replace("drive = \"drive0\"\n", ""));
    assert!(e.message.contains("needs `drive`"), "{e}");

    let e = error_of(&GOOD.replace("interval = \"500ms\"", "interval = \"5ms\""));
    assert_eq!(e.line, Some(2));

    let watched = |w: &str| {
        GOOD.replace(
            "state_file",
            &format!("watch_interval = \"{w}\"\nstate_file"),
        )
    };
    assert_eq!(
        parse(GOOD).unwrap().watch_interval,
        Some(Duration::from_micros(62_500)),
        "an eighth of the interval unless given"
    );
    assert_eq!(parse(&watched("0s")).unwrap().watch_interval, None);
    assert_eq!(
        parse(&watched("100ms")).unwrap().watch_interval,
        Some(Duration::from_millis(100))
    );
    for bad in ["500ms", "2ms"] {
        let e = error_of(&watched(bad));
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.starts_with("`watch_interval` must be 0s"), "{e}");
    }

    let e = error_of(&GOOD.replace("listen = \"127.0.0.1:0\"", "listen = \"localhost\""));
    assert!(e.message.contains("api.listen"), "{e}");

    let e = error_of(&GOOD.replace("weight = 200", "weight = -1"));
    assert!(e.message.contains("`tenant[1].weight`"), "{e}");

    let e = error_of(&GOOD.replace("rrandiops = 2000", "rrandiops = 0"));
    assert!(e.message.contains("`device[0].model`"), "{e}");

    let e = error_of(&GOOD.replace("cgroup = \"/kubepods*/pod*\"", "cgroup = \"../../etc\""));
    assert!(e.message.contains("`..`"), "{e}");

    // Without a device the file is valid; a tenant then has none to be on.
    assert!(parse("interval = \"1s\"\n").unwrap().devices.is_empty());
    let e = error_of("[[tenant]]\nname = \"db\"\ncgroup = \"db\"\n");
    assert!(
        e.message.contains("tenant[0].device") && e.message.contains("no [[device]] is configured"),
        "{e}"
    );
    assert!(e.to_string().starts_with("/etc/iofloor/test.toml:1"), "{e}");
}
