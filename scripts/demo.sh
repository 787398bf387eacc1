#!/usr/bin/env bash
# The main job on a built-in demo: build iofloor, then simulate the seed's
# noisy-neighbour experiment (noisy-4) under every policy and write the report.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p iofloor
out=${1:-results/noisy-4}
./target/release/iofloor sim noisy-4 --out "$out"
echo "HTML report with charts: $out/report.html"
