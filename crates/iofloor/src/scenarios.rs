//! The shipped scenarios, built into the binary so `iofloor sim noisy-4` works
//! from anywhere. The files in `scenarios/` are the source.

const BUILTIN: [(&str, &str); 29] = [
    ("noisy-4", include_str!("../../../scenarios/noisy-4.toml")),
    ("noisy-20", include_str!("../../../scenarios/noisy-20.toml")),
    ("size-mix", include_str!("../../../scenarios/size-mix.toml")),
    ("hybrid", include_str!("../../../scenarios/hybrid.toml")),
    ("cliff", include_str!("../../../scenarios/cliff.toml")),
    ("stolen", include_str!("../../../scenarios/stolen.toml")),
    ("on-off", include_str!("../../../scenarios/on-off.toml")),
    ("churn", include_str!("../../../scenarios/churn.toml")),
    ("tight", include_str!("../../../scenarios/tight.toml")),
    ("tree", include_str!("../../../scenarios/tree.toml")),
    ("vm-disks", include_str!("../../../scenarios/vm-disks.toml")),
    ("burst", include_str!("../../../scenarios/burst.toml")),
    (
        "pessimistic",
        include_str!("../../../scenarios/pessimistic.toml"),
    ),
    ("sawing", include_str!("../../../scenarios/sawing.toml")),
    ("backup", include_str!("../../../scenarios/backup.toml")),
    ("orphan", include_str!("../../../scenarios/orphan.toml")),
    (
        "already-noisy",
        include_str!("../../../scenarios/already-noisy.toml"),
    ),
    (
        "noisy-4-cluster",
        include_str!("../../../scenarios/noisy-4-cluster.toml"),
    ),
    (
        "noisy-20-cluster",
        include_str!("../../../scenarios/noisy-20-cluster.toml"),
    ),
    (
        "hybrid-real",
        include_str!("../../../scenarios/bench/hybrid-real.toml"),
    ),
    ("cut", include_str!("../../../scenarios/bench/cut.toml")),
    (
        "stolen-rig",
        include_str!("../../../scenarios/bench/stolen-rig.toml"),
    ),
    (
        "on-off-rig",
        include_str!("../../../scenarios/bench/on-off-rig.toml"),
    ),
    (
        "burst-rig",
        include_str!("../../../scenarios/bench/burst-rig.toml"),
    ),
    (
        "cluster-bed",
        include_str!("../../../scenarios/bench/cluster-bed.toml"),
    ),
    (
        "noisy-guest",
        include_str!("../../../scenarios/guest/noisy-guest.toml"),
    ),
    (
        "on-off-guest",
        include_str!("../../../scenarios/guest/on-off-guest.toml"),
    ),
    (
        "cut-guest",
        include_str!("../../../scenarios/guest/cut-guest.toml"),
    ),
    (
        "tree-guest",
        include_str!("../../../scenarios/guest/tree-guest.toml"),
    ),
];

pub fn builtin(name: &str) -> Option<&'static str> {
    BUILTIN
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| *text)
}

pub fn names() -> Vec<&'static str> {
    BUILTIN.iter().map(|(n, _)| *n).collect()
}
