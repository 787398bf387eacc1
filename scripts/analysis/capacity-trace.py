#!/usr/bin/env python3
"""Prints the capacity loop's judgement of every decision of a run.

`iofloor sim` and `iofloor bench` keep, in each run record of a policy that
learns capacity (`runs/floor.json` in the results directory), what the loop
was shown at each decision and what it made of it (`capacity_trace`). This
prints one line a decision: the time, whether a look decided it early (`e`),
the verdict, the phase, the estimate, the level it regains fast and the
curve's plateau (as multiples of the model's capacity), the wait before a
probe past a known level, the device's mean latency and I/Os in flight,
what was served and what the floors need, the worst floor share, and the flags the policy passed on
(C a tenant capped, X a capped tenant short of its cap, W a tenant wants
more, G a tenant gone) or the fault that held the estimate.

In a cluster scenario the trace is the allocator's loop, one line a
round, at the round's time.

It reads a service-rig trace (`trace.json` kept by `scripts/service-rig.py
--keep DIR`) the same way.

Usage: scripts/analysis/capacity-trace.py RESULTS_DIR_OR_RUN_JSON [FROM_S [TO_S]]
"""
import json
import os
import sys


def num(v, fmt):
    return format(v, fmt) if isinstance(v, (int, float)) else "-"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    if os.path.isdir(path):
        path = os.path.join(path, "runs", "floor.json")
    lo = float(sys.argv[2]) if len(sys.argv) > 2 else float("-inf")
    hi = float(sys.argv[3]) if len(sys.argv) > 3 else float("inf")
    with open(path) as f:
        run = json.load(f)
    # A service-rig trace (`scripts/service-rig.py --keep`) is a list of
    # daemon status samples, each with the step it showed.
    trace = run if isinstance(run, list) else run.get("capacity_trace") or []
    if not trace:
        sys.exit(f"{path}: no capacity_trace (a policy that does not learn capacity?)")
    print("     t e verdict        phase     estim  level plateau learn latency_us  queue served  need  share flags")
    for entry in trace:
        t = entry["t"]
        if not lo <= t <= hi:
            continue
        s = entry.get("step") or entry
        phase = s["phase"]["phase"] if isinstance(s.get("phase"), dict) else s.get("phase")
        flags = "".join(c for c, k in (("C", "capped"), ("X", "capped_shortfall"),
                                       ("W", "wants_more"), ("G", "departed")) if s.get(k))
        if s.get("fault"):
            flags += " fault=" + s["fault"]
        print(f"{t:6.2f} {'e' if s.get('early') else ' '} {s['verdict']:<14} {phase:<9}"
              f" {s['estimate']:5.3f}  {s['level']:5.3f}  {num(s.get('plateau'), '5.3f'):>6}"
              f" {(s.get('learning') or '-')[:5]:>5} {num(s.get('latency_us'), '10.0f')} {num(s.get('avg_queue'), '6.2f')}"
              f"  {s['served']:5.3f} {s['floors_need']:5.3f}  {num(s.get('floor_share'), '4.2f'):>5}"
              f" {flags}")


if __name__ == "__main__":
    main()
