#!/usr/bin/env bash
# The main job on a built-in demo. Installs what is missing (fio,
# qemu-storage-daemon), builds iofloor, brings up a block device of known
# capacity, runs the seed's noisy-neighbour experiment (noisy-4, shortened to
# two minutes per policy) with real fio tenants in cgroups under `none` and
# `floor`, prints the comparison, writes results/demo/report.html, and removes
# everything it made. Needs root (cgroups, loop devices). About 5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cargo build --release --locked -p iofloor
exec ./target/release/iofloor demo "$@"
