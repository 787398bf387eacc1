#!/usr/bin/env bash
# Records the fuzz targets' seed corpora (fuzz/corpus/TARGET/) from real
# sources: the shipped configs and scenarios, the recorded cgroup v2 trees,
# and, made live on this machine, a v1 blkio cgroup's counter and limit files
# after real direct I/O on a loop device, /proc/diskstats, a
# qemu-storage-daemon's QMP answers, fio's JSON output and latency log, a
# simulator run record and a model file from `iofloor calibrate`. Hand-written
# seeds (units, API bodies, etcd values, state files) follow the formats of
# the code that writes them; `cargo test -p iofloor-fuzz` checks that every
# target's corpus holds inputs its parser accepts. Needs root, fio,
# qemu-storage-daemon; cleans up what it makes, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=fuzz/corpus
work=$(mktemp -d /tmp/iofloor-seeds.XXXXXX)
loopdev=""
cgroup=/sys/fs/cgroup/blkio/iofloor-seeds-$$
qsd_pid=""
cleanup() {
  set +e  # every step runs, whatever failed before or here
  [[ -n $qsd_pid ]] && kill "$qsd_pid" 2>/dev/null && wait "$qsd_pid" 2>/dev/null
  [[ -d $cgroup ]] && rmdir "$cgroup"
  [[ -n $loopdev ]] && losetup -d "$loopdev"
  rm -rf "$work"
}
trap cleanup EXIT
seed() { # TARGET NAME: stdin becomes the seed
  mkdir -p "$corpus/$1"
  cat >"$corpus/$1/$2"
}

cargo build -q -p iofloor
iofloor=target/debug/iofloor

# Files the project ships or records.
# The shipped example, with what a parse checks on disk (the token file, the
# device node) given inline, and an agent's config as the cluster tests
# write it.
sed -e 's|^token_file = .*|token = "seed-token"|' -e 's|^path = "/dev/nvme0n1"|id = "259:0"|' \
  examples/iofloor.toml | seed config iofloor.toml
seed config cluster-agent.toml <<'EOF'
interval = "500ms"
state_file = "/run/iofloor/state.json"

[api]
listen = "10.77.0.11:9180"
token = "t0ken"

[[device]]
name = "shared"
id = "7:3"
[device.model]
rbps = 100e9
rseqiops = 4000
rrandiops = 4000
wbps = 100e9
wseqiops = 4000
wrandiops = 4000

[policy]
kind = "floor"
[policy.floor]
latency_target = "2ms"
queue_knee = 6.0

[cluster]
endpoints = ["http://10.77.0.2:2379", "http://10.77.0.3:2379", "http://10.77.0.4:2379"]
name = "e2e"
host = "h1"
shared_device = "shared"
lease_ttl = "2s"

[[tenant]]
name = "quiet"
cgroup = "iofloor-e2e/q*"
floor = "750iops"
latency_sensitive = true

[[tenant]]
name = "noisy"
cgroup = "iofloor-e2e/noisy"
ceiling = "3000iops"
weight = 2
EOF
for f in scenarios/*.toml scenarios/bench/*.toml; do
  seed scenario "$(basename "$f")" <"$f"
done
for pod in crates/host/tests/fixtures/v2/kubepods/pod*; do
  for file in io.stat io.max; do
    # A cgroup without I/O has an empty file: any device then.
    dev=$(awk 'NR==1{print $1; exit}' "$pod/$file")
    { echo "${dev:-8:0}"; cat "$pod/$file"; } | seed cgroup_v2 "$(basename "$pod")-$file"
  done
done

# A v1 blkio cgroup after real direct I/O on a loop device, with limits set.
dd if=/dev/zero of="$work/disk" bs=1M count=16 status=none
loopdev=$(losetup -f --show --direct-io=on "$work/disk")
dev=$(lsblk -ndo MAJ:MIN "$loopdev" | tr -d ' ')
mkdir "$cgroup"
echo "$dev 5000" >"$cgroup/blkio.throttle.read_iops_device"
echo "$dev 10485760" >"$cgroup/blkio.throttle.write_bps_device"
sh -c "echo \$\$ >$cgroup/cgroup.procs; exec dd if=$loopdev of=/dev/null bs=4k count=200 iflag=direct status=none"
sh -c "echo \$\$ >$cgroup/cgroup.procs; exec dd if=/dev/zero of=$loopdev bs=4k count=100 oflag=direct status=none"
for file in blkio.throttle.io_serviced blkio.throttle.io_service_bytes \
  blkio.throttle.read_iops_device blkio.throttle.write_bps_device; do
  { echo "$dev"; cat "$cgroup/$file"; } | seed cgroup_v1 "$file"
done
{ echo "$dev"; cat /proc/diskstats; } | seed diskstats proc-diskstats

# fio's JSON output (with a warning line before it, as fio prints them) and
# its completion-latency log.
(cd "$work" && fio --name=seed --filename="$loopdev" --direct=1 --rw=randrw --bs=4k \
  --runtime=1 --time_based --output-format=json --output=fio.json \
  --write_lat_log=seed --log_avg_msec=0 >/dev/null)
seed fio_output fio.json <"$work/fio.json"
{ echo "fio: note: both iodepth >= 1 and synchronous I/O engine are selected"; cat "$work/fio.json"; } |
  seed fio_output fio-warning.json
head -200 "$work/seed_clat.1.log" | seed fio_output clat.log

# A model file from calibration, as `model_file` reads it.
"$iofloor" calibrate "$loopdev" --secs 1 --out "$work/model.toml" >/dev/null
seed model_file calibrated.toml <"$work/model.toml"

# A simulator run's records.
"$iofloor" sim noisy-4 --policy floor --time-scale 0.05 --out "$work/sim" >/dev/null
for f in "$work"/sim/runs/*.json; do
  seed run_record "$(basename "$f")" <"$f"
done

# A qemu-storage-daemon's QMP greeting and answers, one line each.
qemu-storage-daemon --blockdev driver=file,node-name=f0,filename="$work/disk" \
  --chardev socket,id=m0,path="$work/qmp.sock",server=on,wait=off --monitor chardev=m0 &
qsd_pid=$!
for _ in $(seq 50); do [[ -S $work/qmp.sock ]] && break; sleep 0.1; done
python3 - "$work/qmp.sock" "$corpus/qmp" <<'EOF'
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
out = sys.argv[2]
os.makedirs(out, exist_ok=True)
def save(name, line):
    open(os.path.join(out, name), "w").write(line)
save("greeting", f.readline())
for name, cmd in [("capabilities", {"execute": "qmp_capabilities"}),
                  ("query-blockstats", {"execute": "query-blockstats",
                                        "arguments": {"query-nodes": True}}),
                  ("query-version", {"execute": "query-version"}),
                  ("error", {"execute": "no-such-command"})]:
    f.write(json.dumps(cmd) + "\n"); f.flush()
    save(name, f.readline())
EOF
kill "$qsd_pid"; wait "$qsd_pid" 2>/dev/null || true; qsd_pid=""
# A QEMU 7.2 guest's query-blockstats answer, as the QMP backend's unit test
# records it, and its query-status answers running and paused.
python3 - crates/host/src/backends/qmp.rs "$corpus/qmp" <<'EOF'
import json, os, re, sys
answer = re.search(r'const ANSWER: &str = r#"(.*?)"#;', open(sys.argv[1]).read(), re.S).group(1)
out = sys.argv[2]
open(os.path.join(out, "guest-blockstats"), "w").write(json.dumps({"return": json.loads(answer)}) + "\n")
for state, running in [("running", True), ("paused", False)]:
    reply = {"return": {"status": state, "singlestep": False, "running": running}}
    open(os.path.join(out, "status-" + state), "w").write(json.dumps(reply) + "\n")
EOF
echo "seeds recorded in $corpus"
