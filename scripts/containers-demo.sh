#!/usr/bin/env bash
# Two podman containers that declare their floors in labels, beside a noisy
# one, under `iofloor run`, from a fresh machine: installs what is missing
# (podman, runc, fio, ...: scripts/deps.sh), builds iofloor, brings up a
# 1,000-IOPS rig, starts podman's API service on a socket of its own, builds
# an fio image from the host's fio (no registry), runs the three containers,
# watches them 12 s with `iofloor run` measuring only (policy none), then
# recreates them and keeps their floors for 15 s, prints both, and removes
# everything it made.
# Needs root. About a minute once built.
#
#   ./scripts/containers-demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
./scripts/deps.sh
cargo build --release --locked -p iofloor
bin=$PWD/target/release/iofloor
work=$(mktemp -d /tmp/iofloor-containers.XXXXXX)
prefix="iofloor-demo-$$"
svc="" daemon="" dev=""
# podman's cgroupfs driver leaves libpod_parent (and its conmon) in every
# hierarchy after its last container: removed where this run made them.
libpod_made=()
for h in /sys/fs/cgroup/*/; do [[ -d ${h}libpod_parent ]] || libpod_made+=("${h}libpod_parent"); done
cleanup() {
  set +e
  [[ -n $daemon ]] && kill -TERM "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  for c in db web noisy; do podman rm -f -t 0 "$prefix-$c" >/dev/null 2>&1; done
  [[ -n $svc ]] && kill "$svc" 2>/dev/null && wait "$svc" 2>/dev/null
  for p in "${libpod_made[@]}"; do rmdir "$p/conmon" "$p" 2>/dev/null; done
  [[ -n $dev ]] && "$bin" rig down >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

dev=$("$bin" rig up --iops 1000 | tail -n1)
podman system service --time=0 "unix://$work/podman.sock" >/dev/null 2>&1 &
svc=$!
for _ in $(seq 100); do [[ -S $work/podman.sock ]] && break; sleep 0.1; done

# fio and every library it loads, on an empty image.
image="localhost/iofloor-fio:$(fio --version | tr '/ ' '--')"
if ! podman image exists "$image"; then
  mkdir -p "$work/root/tmp"
  for f in /usr/bin/fio $(ldd /usr/bin/fio | grep -o '/[^ ]*'); do
    install -D "$(readlink -f "$f")" "$work/root$f"
  done
  tar -C "$work/root" -cf - . | podman import - "$image" >/dev/null
fi

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
write_config() {
  cat >"$work/iofloor.toml" <<TOML
interval = "1s"
state_file = "$work/state.json"
[policy]
kind = "$1"
[api]
listen = "127.0.0.1:$port"
[[device]]
name = "rig"
path = "$dev"
[device.model]
rbps = 100e9
rseqiops = 1000
rrandiops = 1000
wbps = 100e9
wseqiops = 1000
wrandiops = 1000

# Containers found through podman's API; their io.iofloor.* labels are
# trusted, so a labelled container is a tenant "podman/<name>" with the
# floor it declares.
[[runtime]]
name = "podman"
socket = "$work/podman.sock"
trust_labels = true

[[tenant]]
name = "noisy"
container = "$prefix-noisy"
TOML
}
start_daemon() {
  write_config "$1"
  "$bin" run --config "$work/iofloor.toml" 2>"$work/daemon-$1.log" &
  daemon=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/api/v1/status" >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "containers-demo: iofloor run did not start:" >&2
  cat "$work/daemon-$1.log" >&2
  exit 1
}
stop_daemon() {
  kill -TERM "$daemon"
  wait "$daemon" || true
  daemon=""
}
container() { # NAME SECONDS QD RATE LABEL...
  local name=$1 secs=$2 qd=$3 rate=$4
  shift 4
  local labels=()
  for l in "$@"; do labels+=(--label "$l"); done
  # runc: crun refuses a hybrid cgroup layout; the ulimits: podman's
  # defaults can exceed a sandbox's hard limits.
  podman --runtime runc run -d --name "$prefix-$name" --network none \
    --ulimit nofile=10000:10000 --ulimit nproc=1000:1000 --device "$dev" "${labels[@]}" \
    "$image" /usr/bin/fio --name=load --filename="$dev" --direct=1 --ioengine=libaio \
    --rw=randread --bs=4k --iodepth="$qd" ${rate:+--rate_iops=$rate} --time_based --runtime="$secs" >/dev/null
}
report() { # FROM_UPTIME TO_UPTIME
  python3 - "$port" "$1" "$2" <<'PY'
import json, sys, urllib.request
port, lo, hi = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
def get(path):
    return json.load(urllib.request.urlopen("http://127.0.0.1:%s%s" % (port, path)))
for t in sorted(get("/api/v1/tenants")["tenants"], key=lambda t: t["name"]):
    name = t["name"]
    iops = [p["iops"] for p in get("/api/v1/tenants/" + name)["history"] if lo < p["t"] < hi]
    floor = (t.get("floor") or {}).get("value")
    if floor:
        met = "floor %.0f IOPS met in %d/%d windows" % (floor, sum(i >= 0.95 * floor for i in iops), len(iops))
    else:
        met = "no floor"
    print("  %-36s %6.0f IOPS  %s" % (name, sum(iops) / max(len(iops), 1), met))
PY
}
uptime() { curl -sf "http://127.0.0.1:$port/api/v1/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["uptime_s"])'; }

containers() { # SECONDS
  for c in db web noisy; do podman rm -f -t 0 "$prefix-$c" >/dev/null 2>&1 || true; done
  container db "$1" 1 330 io.iofloor.floor=300iops app=pg
  container web "$1" 1 275 io.iofloor.floor=250iops
  container noisy "$1" 16 ""
}

# Each phase has containers of its own (fio makes up a rate it missed, so
# containers starved in the first would catch up in the second).
start_daemon none
containers 16
sleep 3
from=$(uptime)
sleep 12
echo "iofloor run, policy none (measures only), 12 s:"
report "$from" "$(uptime)"
stop_daemon
start_daemon floor
containers 25
sleep 5
from=$(uptime)
sleep 15
echo "iofloor run, policy floor, 15 s after 5 s to settle:"
report "$from" "$(uptime)"
limit=$(cat "/sys/fs/cgroup/blkio/$(podman inspect --format '{{.State.Pid}}' "$prefix-noisy" | xargs -I{} sed -n 's/^[0-9]*:[^:]*blkio[^:]*://p' /proc/{}/cgroup)/blkio.throttle.read_iops_device" 2>/dev/null || true)
echo "  the noisy container's cap: ${limit:-none}"
stop_daemon
grep -h "every limit iofloor set was restored" "$work"/daemon-floor.log | tail -n1 | sed 's/^/  /'
echo "containers-demo: done in $(($(date +%s) - started)) s from the start of this command"
