#!/usr/bin/env bash
# Runs every check of iofloor: formatting, clippy with warnings as errors,
# then every test — unit, property, simulator, CLI end to end, and the
# real-kernel ones (cgroup v1 blk-throttle, the rig, fio, a TCG guest, the
# daemon) — each test binary timed (scripts/timed-tests.py), then a short
# soak with crashes (scripts/soak.sh). Every fuzz target replays its corpus
# and regressions in the tests (fuzz::corpus); AFL++ itself runs only when
# IOFLOOR_FUZZ_SECONDS is set (its instrumented release build of the whole
# tree costs ~4 minutes on 2 cores, more than the fuzzing a suite can
# afford). The long runs are `scripts/fuzz.sh --seconds 600` and
# `scripts/soak.sh 1h`, before a release. Installs what the real tests need first
# (scripts/deps.sh). A real test whose machine is missing something fails;
# it never passes silently. Prints where the suite's time went at its end,
# also when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."

# The soak's length: enough for restarts after crashes and a clean stop to
# be checked (its memory is judged only on runs of 10 minutes and more).
SOAK=60s

suite_started=$SECONDS
step_times=()
current_step=""
summary() {
  local status=$?
  echo
  echo "suite time by step:"
  printf '%s\n' "${step_times[@]}"
  [[ -n $current_step ]] && echo "  (stopped during: $current_step)"
  local total=$((SECONDS - suite_started))
  echo "suite: $((total / 60)) min $((total % 60)) s$( ((status)) && echo ", FAILED (exit $status)")"
}
trap summary EXIT
# Stopped by a signal: say so in the summary, with the usual exit codes.
trap 'exit 130' INT
trap 'exit 143' TERM

# step NAME COMMAND...: runs COMMAND and notes how long it took.
step() {
  local name=$1
  shift
  local started=$SECONDS
  echo "== $name"
  current_step=$name
  local status=0
  "$@" || status=$?
  current_step=""
  step_times+=("$(printf '%6d s  %s' $((SECONDS - started)) "$name")")
  return "$status"
}

# Clippy lints the workspace in the test build rather than in a check build
# of its own: `cargo clippy` is `cargo check` with clippy-driver compiling
# the workspace's crates, and the same driver compiles them for the tests
# (`-D warnings` as there; every target, benches and examples too). That
# spares a fresh clone checking every dependency a second time: clippy and
# the test build took 3.2 + 6.0 minutes, the two in one 6.5 (measured).
# Exported for every cargo call of the suite, so the doc tests and the soak
# reuse the one build.
RUSTC_WORKSPACE_WRAPPER=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver || true)
if [[ ! -x $RUSTC_WORKSPACE_WRAPPER ]]; then
  echo "test.sh: clippy is needed (rustup component add clippy)" >&2
  exit 1
fi
export RUSTC_WORKSPACE_WRAPPER
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

step "install what the real tests need" ./scripts/deps.sh
step "cargo fmt" cargo fmt --all --check
# The code's habits (issue 33): no production function over about 80 lines
# without a reason, typed errors in library crates, no two-file circles.
step "code habits" bash -c 'scripts/analysis/long-functions.py --limit 80 --strict && scripts/analysis/module-circles.py'
step "clippy -D warnings, tests (build and run)" ./scripts/timed-tests.py
if [[ -n ${IOFLOOR_FUZZ_SECONDS:-} ]]; then
  step "fuzz, ${IOFLOOR_FUZZ_SECONDS} s per target" ./scripts/fuzz.sh --seconds "$IOFLOOR_FUZZ_SECONDS"
fi
step "soak, $SOAK" ./scripts/soak.sh "$SOAK"
