#!/usr/bin/env python3
"""How much of a simulator figure is chance: one scenario under many seeds.

The simulator is deterministic for a seed, and a shipped scenario's figures
are those of its own seed. The seed moves the device's jitter and so the
moment each overload, probe and cut lands; a figure that changes by more
than its spread here is the policy, one within it is luck. Runs
`iofloor sim SCENARIO --policy floor --json --seed N` for each seed (and the
scenario's own first) and prints, per seed and as mean / min / max:
floor-miss, the worst protected tenant's floor-miss, work conservation
(the whole device's where the scenario has unmanaged load) and the protected
p99 ratio, and how many seeds left a protected tenant above 2 %.

The default seeds are those of docs/policies.md's figures (the scenario's
own, 10, 17, ..., 45 and 148, 161, ..., 291: 19 in all).

Usage (from the repository, after `cargo build --release`):
  scripts/analysis/seeds.py stolen
  scripts/analysis/seeds.py churn 1 2 3 4 5
"""
import json
import os
import statistics
import subprocess
import sys

DEFAULT_SEEDS = [7 * k + 3 for k in range(1, 7)] + [13 * k + 5 for k in range(11, 23)]
# `IOFLOOR` names another build (the tests run their own).
IOFLOOR = os.environ.get("IOFLOOR") or os.path.join(
    os.path.dirname(__file__), "..", "..", "target", "release", "iofloor"
)


def run(scenario, seed, iofloor=IOFLOOR):
    """(floor-miss, worst protected floor-miss, WC, p99 ratio) of one run of
    `iofloor` (this build by default), at the scenario's own seed if None."""
    args = [iofloor, "sim", scenario, "--policy", "floor", "--json"]
    if seed is not None:
        args += ["--seed", str(seed)]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"iofloor sim {scenario} --seed {seed}: {out.stderr.strip()}")
    floor = json.loads(out.stdout)["policies"]["floor"]
    protected = [t for t in floor["tenants"] if not t["noisy"] and t["floor"] is not None]
    worst = max((t["floor_miss_rate"] for t in protected), default=0.0)
    wc = floor.get("device_work_conservation") or floor["work_conservation"]
    return floor["floor_miss_rate"], worst, wc, floor["protected_p99_ratio"]


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0 if len(sys.argv) > 1 else 2)
    scenario = sys.argv[1]
    try:
        seeds = [int(s) for s in sys.argv[2:]] or DEFAULT_SEEDS
    except ValueError as e:
        sys.exit(f"seeds must be whole numbers: {e}")
    rows = [("own", run(scenario, None))] + [(str(s), run(scenario, s)) for s in seeds]
    print(f"{'seed':>6} {'floor-miss':>10} {'worst':>7} {'WC':>6} {'p99 ratio':>9}")
    for seed, (miss, worst, wc, p99) in rows:
        print(f"{seed:>6} {miss:10.1%} {worst:7.1%} {wc:6.3f} {p99:9.2f}")
    columns = list(zip(*(r for _, r in rows)))
    for label, pick in (("mean", statistics.fmean), ("min", min), ("max", max)):
        miss, worst, wc, p99 = (pick(c) for c in columns)
        print(f"{label:>6} {miss:10.1%} {worst:7.1%} {wc:6.3f} {p99:9.2f}")
    above = sum(1 for w in columns[1] if w > 0.02)
    print(f"{len(rows)} seeds; a protected tenant above 2 % in {above}")


if __name__ == "__main__":
    main()
