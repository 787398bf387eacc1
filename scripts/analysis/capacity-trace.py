#!/usr/bin/env python3
"""Prints the capacity loop's judgement of every decision of a run.

`iofloor sim` and `iofloor bench` keep, in each run record of a policy that
learns capacity (`runs/floor.json` in the results directory), what the loop
was shown at each decision and what it made of it (`capacity_trace`). This
prints one line a decision: the time, whether a look decided it early (`e`),
the verdict, the estimate and the level it regains fast (both as multiples
of the model's capacity), the wait before a probe past that level, the
device's mean latency and queue, the threshold, what was served and what the
floors need, and the flags the policy passed on (H held by the device, W a
tenant wants more, S a floor short, D short by the device, N newcomer, G a
tenant gone).

Usage: scripts/analysis/capacity-trace.py RESULTS_DIR_OR_RUN_JSON [FROM_S [TO_S]]
"""
import json
import os
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    if os.path.isdir(path):
        path = os.path.join(path, "runs", "floor.json")
    lo = float(sys.argv[2]) if len(sys.argv) > 2 else float("-inf")
    hi = float(sys.argv[3]) if len(sys.argv) > 3 else float("inf")
    with open(path) as f:
        record = json.load(f)
    trace = record.get("capacity_trace", [])
    if not trace:
        sys.exit(f"{path}: no capacity_trace (a policy that learns no capacity, or an older record)")
    print(f"{'t':>7} {'':1} {'verdict':<10} {'est':>6} {'level':>6} {'wait':>4} "
          f"{'lat_us':>8} {'queue':>6} {'thr_us':>8} {'served':>6} {'need':>6} flags")
    flags = [("held_by_device", "H"), ("wants_more", "W"), ("floor_short", "S"),
             ("floor_short_by_device", "D"), ("newcomer", "N"), ("departed", "G")]
    num = lambda v, fmt: "-" if v is None else format(v, fmt)
    for s in trace:
        if not lo <= s["t"] <= hi:
            continue
        f = "".join(c for k, c in flags if s.get(k))
        print(f"{s['t']:7.2f} {'e' if s['early'] else ' '} {s['verdict']:<10} "
              f"{s['estimate']:6.3f} {s['level']:6.3f} {s['probe_wait']:4d} "
              f"{num(s['latency_us'], '8.0f')} {num(s['avg_queue'], '6.2f')} "
              f"{num(s['threshold_us'], '8.0f')} {s['served']:6.3f} {s['floors_need']:6.3f} {f}")


if __name__ == "__main__":
    main()
