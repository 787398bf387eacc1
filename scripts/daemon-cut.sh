#!/usr/bin/env bash
# Issue 10's service run, judged by fio's own logs: `iofloor run` (the
# daemon, inline model of 4,000 IOPS) on a rig of 4,000 IOPS; three quiet
# tenants asking 1,050/790/395 IOPS of 4 KiB random reads at QD1 with floors
# of 1,000/750/375 IOPS, a noisy one with 8 jobs x QD4 (floor 200 IOPS); at
# 20 s the rig drops to CUT IOPS with nothing told to the daemon. Prints,
# per quiet tenant, its 1 s windows from 5 s on (fio's IOPS logs, direct=1)
# met at >= 95 % of its floor, the two windows after the cut excepted (the
# issue allows 2 intervals there), then the windows after the cut, the misses
# from the third window after it, and the noisy tenant's mean.
# Needs root and a release build (cargo build --release).
# WATCH sets the daemon's `watch_interval` (`0s`: no looks between
# intervals); left out, the daemon's default (an eighth of the interval).
# LOAD `burst` (issue 32's case) gives the noisy tenant a floor of 1,000
# IOPS and makes it idle 10 s and burst 10 s with 8 jobs x QD4, over and
# over (floors 78 % of the rig); CUT 4000 leaves the rig as it is.
# Usage: scripts/daemon-cut.sh [INTERVAL=1s] [CUT=2800] [WATCH] [LOAD=steady|burst]
set -euo pipefail
interval=${1:-1s}
cut_iops=${2:-2800}
watch=${3:-}
load=${4:-steady}
noisy_floor=200
[[ $load == burst ]] && noisy_floor=1000
iofloor=$(cd "$(dirname "$0")/.." && pwd)/target/release/iofloor
work=$(mktemp -d /tmp/iofloor-daemon-cut.XXXXXX)
rigs=$work/rigs
name=iofloor-daemon-cut-$$
cg=/sys/fs/cgroup/blkio/$name
secs=45 cut_at=20
[[ $load == burst ]] && secs=80
((cut_iops == 4000)) && cut_at=-100
readonly secs cut_at
pids=()
daemon=
cleanup() {
  local status=$?
  # `wait` without PIDs would wait for the daemon too.
  if [[ ${#pids[@]} -gt 0 ]]; then
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
  if [[ -n $daemon ]]; then
    kill -TERM "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
  fi
  "$iofloor" rig down --state-dir "$rigs" >/dev/null 2>&1 || true
  for t in noisy q1 q2 q3; do [[ -d $cg/$t ]] && rmdir "$cg/$t"; done
  [[ -d $cg ]] && rmdir "$cg"
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
device=$("$iofloor" rig up --iops 4000 --state-dir "$rigs" 2>/dev/null | tail -1)
for t in noisy q1 q2 q3; do mkdir -p "$cg/$t"; done
cat >"$work/iofloor.toml" <<TOML
interval = "$interval"
${watch:+watch_interval = \"$watch\"}
state_file = "$work/state.json"
[[device]]
name = "rig"
path = "$device"
[device.model]
rbps = 100e9
rseqiops = 4000
rrandiops = 4000
wbps = 100e9
wseqiops = 4000
wrandiops = 4000
[[tenant]]
name = "noisy"
cgroup = "$name/noisy"
floor = "${noisy_floor}iops"
[[tenant]]
name = "q1"
cgroup = "$name/q1"
floor = "1000iops"
[[tenant]]
name = "q2"
cgroup = "$name/q2"
floor = "750iops"
[[tenant]]
name = "q3"
cgroup = "$name/q3"
floor = "375iops"
TOML
"$iofloor" run --config "$work/iofloor.toml" 2>"$work/daemon.log" &
daemon=$!
# Adopted before the load starts (the daemon logs each tenant it adopts).
for _ in $(seq 50); do
  [[ $(grep -c adopted "$work/daemon.log" || true) -ge 4 ]] && break
  sleep 0.2
done
# fio in a tenant's cgroup: the subshell moves itself there, then becomes fio.
fio_in() {
  local tenant=$1
  shift
  (
    echo "$BASHPID" >"$cg/$tenant/cgroup.procs"
    exec fio --output="$work/$tenant.out" --filename="$device" --direct=1 \
      --rw=randread --bs=4k --ioengine=libaio --time_based --runtime=$secs \
      --name="$tenant" --write_iops_log="$work/$tenant" --log_avg_msec=1000 "$@"
  ) &
  pids+=($!)
}
if [[ $load == burst ]]; then
  # Idle 10 s, burst 10 s, from fio time 0 (the quiet tenants start now).
  for ((k = 0; k < secs / 20; k++)); do
    fio_in "noisy" --iodepth=4 --numjobs=8 --runtime=10 --startdelay=$((20 * k + 10)) \
      --write_iops_log="$work/noisy-$k" --output="$work/noisy-$k.out"
  done
else
  fio_in noisy --iodepth=4 --numjobs=8
fi
fio_in q1 --iodepth=1 --rate_iops=1050
fio_in q2 --iodepth=1 --rate_iops=790
fio_in q3 --iodepth=1 --rate_iops=395
if ((cut_at >= 0)); then
  sleep $cut_at
  "$iofloor" rig set --iops "$cut_iops" --device "$device" --state-dir "$rigs" >/dev/null 2>&1
fi
wait "${pids[@]}"
pids=()
echo "interval $interval, watch_interval ${watch:-default}, load $load, rig 4000 -> $cut_iops IOPS at ${cut_at} s (fio time)"
for spec in q1:1000 q2:750 q3:375; do
  tenant=${spec%%:*}
  floor=${spec##*:}
  awk -F', *' -v t="$tenant" -v f="$floor" -v cut=$cut_at -v end=$secs '
    { s = $1 / 1000; v = $2 }
    s > 5 && s < end - 1 && (s <= cut || s > cut + 2) { n++; if (v >= 0.95 * f) ok++ }
    s > cut && s < end - 1 { after = after sprintf(" %d", v); if (s > cut + 2 && v < 0.95 * f) late++ }
    END { printf "%s: floor %d IOPS, met %d/%d; late misses %d%s\n", t, f, ok, n, late, cut < 0 ? "" : "; after the cut:" after }
  ' "$work/${tenant}_iops.1.log"
done
if [[ $load == burst ]]; then
  # Each burst's eight jobs, summed per second; the first and last second
  # of a burst are partial.
  for ((k = 0; k < secs / 20; k++)); do
    cat "$work"/noisy-"$k"_iops.*.log | awk -F', *' -v k=$k '
      { s = int($1 / 1000 + 0.5); sum[s] += $2 }
      END { for (s in sum) if (s >= 2 && s <= 9) { total += sum[s]; n++; if (sum[s] < 950) low++ }
            printf "burst %d: %.0f IOPS on average over its seconds 2-9, %d below 95 %% of its floor (what the quiet tenants ask leaves 4,000 - 2,235 = 1,765)\n", k, total / n, low }'
  done
  exit 0
fi
# The noisy tenant's eight jobs, summed per second after the cut.
cat "$work"/noisy_iops.*.log | awk -F', *' -v cut=$cut_at -v end=$secs '
  { s = int($1 / 1000 + 0.5) } s > cut && s < end - 1 { sum[s] += $2 }
  END { for (s in sum) { total += sum[s]; n++ } printf "noisy after the cut: %.0f IOPS on average (%d - 2,125 floors = %d left)\n", total / n, '"$cut_iops"', '"$cut_iops"' - 2125 }'
