#!/usr/bin/env bash
# Measures what one cluster agent costs: `iofloor run` with N tenants (idle
# cgroups, floors of 10 IOPS) and a [cluster] section, on a one-host test bed
# (`iofloor cluster up`, so etcd is three real members), alone and therefore
# also the allocator. Prints its CPU time over SECS seconds as a share of
# one core. Needs root and a release build (cargo build --release).
# Usage: scripts/cluster-agent-cpu.sh [TENANTS=100] [SECS=60]
set -euo pipefail
tenants=${1:-100}
secs=${2:-60}
iofloor=$(cd "$(dirname "$0")/.." && pwd)/target/release/iofloor
work=$(mktemp -d /tmp/iofloor-agent-cpu.XXXXXX)
state=$work/bed
cg=/sys/fs/cgroup/blkio/iofloor-agent-cpu-$$
pid=
cleanup() {
  [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  "$iofloor" cluster down --state-dir "$state" >/dev/null 2>&1 || true
  for d in "$cg"/t*; do [[ -d $d ]] && rmdir "$d"; done
  [[ -d $cg ]] && rmdir "$cg"
  rm -rf "$work"
}
trap cleanup EXIT
"$iofloor" cluster up --hosts 1 --size 64MiB --state-dir "$state" >"$work/up.txt"
device=$(awk -F'\t' '$1 == "h0" {print $3}' "$work/up.txt")
netns=$(awk -F'\t' '$1 == "h0" {sub("netns ", "", $4); print $4}' "$work/up.txt")
endpoints=$(sed -n 's/^etcd endpoints: //p' "$work/up.txt" | sed 's/[^,]*/"&"/g')
mkdir "$cg"
cat >"$work/agent.toml" <<TOML
interval = "1s"
state_file = "$work/state.json"
[api]
listen = "10.77.0.10:8080"
[[device]]
name = "shared"
path = "$device"
[device.model]
rbps = 100e9
rseqiops = 4000
rrandiops = 4000
wbps = 100e9
wseqiops = 4000
wrandiops = 4000
[cluster]
endpoints = [$endpoints]
name = "agent-cpu"
host = "h0"
shared_device = "shared"
lease_ttl = "2s"
TOML
for i in $(seq 0 $((tenants - 1))); do
  mkdir "$cg/t$i"
  printf '[[tenant]]\nname = "t%d"\ncgroup = "%s/t%d"\nfloor = "10iops"\n' \
    "$i" "${cg#/sys/fs/cgroup/blkio/}" "$i" >>"$work/agent.toml"
done
nsenter --net="/run/netns/$netns" "$iofloor" run --config "$work/agent.toml" 2>"$work/agent.log" &
pid=$!
sleep 10 # joined, elected, tenants adopted
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
before=$(ticks)
sleep "$secs"
after=$(ticks)
python3 -c "print(f'agent (and allocator) with $tenants tenants: {($after - $before) / $(getconf CLK_TCK) / $secs * 100:.2f} % of a core over $secs s')"
