#!/usr/bin/env bash
# Runs every test of iofloor: unit, property, simulator, CLI end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked
