#!/usr/bin/env bash
# Runs every test of iofloor: unit, property, simulator, CLI end to end, and
# the real-kernel ones (cgroup v1 blk-throttle, the rig, fio). Installs fio and
# qemu-storage-daemon first if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cargo test --workspace --locked
