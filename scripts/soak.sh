#!/usr/bin/env bash
# The soak with crashes (crates/iofloor/tests/soak.rs): `iofloor run` over
# the rig for DURATION (default 1h; 90s in scripts/test.sh) while tenants come and go, load
# changes, a QEMU guest comes and goes, the config is reloaded, floors change
# over the API, and the daemon is SIGKILLed and restarted. Prints its figures
# and fails on a throttle the state file does not own, a limit not restored,
# or a leaked process, cgroup or loop device.
#
#   scripts/soak.sh [DURATION]      # DURATION: 90s, 5m, 1h or seconds
#   IOFLOOR_SOAK_SEED=N scripts/soak.sh 5m   # repeat a run's actions
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-1h}
case $duration in
  *h) secs=$((${duration%h} * 3600)) ;;
  *m) secs=$((${duration%m} * 60)) ;;
  *s) secs=${duration%s} ;;
  *) secs=$duration ;;
esac
[[ $secs =~ ^[0-9]+$ && $secs -ge 60 ]] || { echo "soak.sh: DURATION must be at least 60s, got \`$duration\`" >&2; exit 2; }
# The whole workspace's features, as the suite builds them: `-p iofloor`
# alone would build the binaries again with fewer features.
IOFLOOR_SOAK_SECS=$secs cargo test --workspace --locked -q --test soak -- --ignored --nocapture
