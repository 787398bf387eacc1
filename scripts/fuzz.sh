#!/usr/bin/env bash
# Fuzzes iofloor's parsers with AFL++ (cargo-afl, stable Rust): every target
# of fuzz/src/lib.rs, or those named, from its seed corpus in fuzz/corpus.
#
#   scripts/fuzz.sh                      # 60 s per target (scripts/test.sh runs it with IOFLOOR_FUZZ_SECONDS set)
#   scripts/fuzz.sh --seconds 300 qmp    # one target for 5 minutes
#   scripts/fuzz.sh --execs 1000000      # each target to a million runs
#
# One target runs per core at a time. Prints each target's executions,
# speed, paths found, crashes and hangs (an input that takes over 5 s), and
# exits 1 if any target crashed or hung;
# crashing inputs are kept under target/afl/crashes/TARGET/ (replay one with
# `target/afl/release/fuzz TARGET < FILE`; once fixed, add it to
# fuzz/regressions/TARGET/, which `cargo test` replays).
set -euo pipefail
cd "$(dirname "$0")/.."
limit=(-V 60)
targets=()
while (($#)); do
  case $1 in
    --seconds) limit=(-V "$2"); shift 2 ;;
    --execs) limit=(-E "$2"); shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(ls fuzz/corpus)
fi
for t in "${targets[@]}"; do
  [[ -d fuzz/corpus/$t ]] || { echo "fuzz.sh: no target \`$t\` (fuzz/corpus/$t)" >&2; exit 2; }
done

command -v cargo-afl >/dev/null || cargo install cargo-afl --locked --version 0.18.2
# AFL++ itself, built once per Rust toolchain (it says so when it already is;
# a real failure shows in the build below).
cargo afl config --build >/dev/null 2>&1 || true
# A target folder of its own: AFL's instrumentation flags would otherwise
# make every later plain build start from scratch.
export CARGO_TARGET_DIR=target/afl
cargo afl build --release --locked -p iofloor-fuzz --features afl -q
out=target/afl/out
rm -rf "$out" target/afl/crashes
mkdir -p "$out"

# Plain log lines instead of the curses screen; the machine's CPU governor
# and core pattern are not ours to change.
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1
export AFL_NO_AFFINITY=1

pids=()
run() {
  local t=$1
  cargo afl fuzz -i "fuzz/corpus/$t" -o "$out/$t" -t 5000 "${limit[@]}" \
    -- target/afl/release/fuzz "$t" >"$out/$t.log" 2>&1 || true
}
# Each target in a process group of its own, so that stopping this script
# stops cargo-afl, afl-fuzz and the target too.
cleanup() { for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || true; done; }
trap cleanup EXIT
jobs_at_once=$(nproc)
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs_at_once)); do wait -n || true; done
  setsid bash -c "$(declare -p limit out); $(declare -f run); run $t" &
  pids+=($!)
done
wait

stat() { awk -F' *: *' -v k="$2" '$1==k {print $2}' "$out/$1/default/fuzzer_stats" 2>/dev/null; }
failed=0
printf '%-12s %12s %10s %8s %8s %6s\n' target execs execs/s paths crashes hangs
for t in "${targets[@]}"; do
  if [[ ! -f $out/$t/default/fuzzer_stats ]]; then
    echo "$t: AFL did not run; its log:" >&2
    tail -20 "$out/$t.log" >&2
    failed=1
    continue
  fi
  crashes=$(stat "$t" saved_crashes)
  hangs=$(stat "$t" saved_hangs)
  printf '%-12s %12s %10s %8s %8s %6s\n' "$t" "$(stat "$t" execs_done)" \
    "$(stat "$t" execs_per_sec)" "$(stat "$t" corpus_count)" "$crashes" "$hangs"
  if [[ ! $crashes =~ ^[0-9]+$ || ! $hangs =~ ^[0-9]+$ ]]; then
    echo "$t: unreadable fuzzer_stats" >&2
    failed=1
    continue
  fi
  if ((crashes + hangs > 0)); then
    mkdir -p "target/afl/crashes/$t"
    shopt -s nullglob
    for f in "$out/$t"/default/crashes/id:* "$out/$t"/default/hangs/id:*; do
      cp "$f" "target/afl/crashes/$t/"
    done
    shopt -u nullglob
    failed=1
  fi
done
if ((failed)); then
  echo "fuzz.sh: crashes or hangs (or a target that did not run): see target/afl/crashes/ and $out/*.log" >&2
  exit 1
fi
