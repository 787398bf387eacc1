#!/usr/bin/env bash
# Runs every check of iofloor: formatting, clippy with warnings as errors,
# then every test — unit, property, simulator, CLI end to end, and the
# real-kernel ones (cgroup v1 blk-throttle, the rig, fio, a TCG guest, the
# daemon) — then a minute of AFL++ on every fuzz target and a five-minute
# soak with crashes (scripts/soak.sh). Installs what the real tests need
# first (scripts/deps.sh). A real test whose machine is missing something
# fails; it never passes silently.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
./scripts/fuzz.sh --seconds 60
./scripts/soak.sh 5m
