#!/usr/bin/env python3
"""Compares iofloor builds on every shipped simulator scenario, over seeds.

A policy change that helps one scenario may cost another: this runs
`iofloor sim NAME --policy floor --json [--seed N]` for every shipped
scenario (those `sim-identical.py` runs) with each build given, and prints,
per scenario and build, over the seeds: mean floor-miss, the worst protected
tenant's floor-miss at any seed, how many seeds left a protected tenant above
2 %, mean work conservation (the whole device's where the scenario has
unmanaged load) and mean protected p99 ratio. A scenario whose figures
differ from the first build's is marked `*`.

    scripts/analysis/sim-compare.py [--seeds N] [--only A,B] BUILD [BUILD ...]

`--seeds N` runs the scenario's own seed and the first N of `seeds.py`'s
(19 at most); without it, only the own seed. `--only` runs only the named
scenarios. Runs two simulations at a time.
"""

import concurrent.futures
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from seeds import DEFAULT_SEEDS, run  # noqa: E402
from importlib import import_module  # noqa: E402

scenarios = import_module("sim-identical").scenarios


def summary(runs):
    """The printed figures of one scenario and build over its seeds."""
    miss, worst, wc, p99 = zip(*runs)
    return (statistics.fmean(miss), max(worst), sum(1 for w in worst if w > 0.02),
            statistics.fmean(wc), statistics.fmean(p99))


def main():
    args = sys.argv[1:]
    count, only = 0, None
    while args[:1] in (["--seeds"], ["--only"]) and len(args) > 1:
        if args[0] == "--seeds":
            count = int(args[1])
        else:
            only = args[1].split(",")
        args = args[2:]
    if not args:
        sys.exit(__doc__.strip())
    seeds = [None] + DEFAULT_SEEDS[:count]
    names = [n for n in scenarios(args[0]) if only is None or n in only]
    if only is not None and len(names) < len(only):
        sys.exit(f"not a shipped simulator scenario: {', '.join(set(only) - set(names))}")
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for build in args:
            for name in names:
                for seed in seeds:
                    jobs[(build, name, seed)] = pool.submit(run, name, seed, build)
    print(f"{len(seeds)} seed(s) each; miss = mean floor-miss, worst = the worst protected "
          "tenant at any seed, >2% = seeds with one above 2 %")
    print(f"{'scenario':<18} {'build':<28} {'miss':>6} {'worst':>6} {'>2%':>4} "
          f"{'WC':>6} {'p99':>6}")
    for name in names:
        first = None
        for build in args:
            row = summary([jobs[(build, name, s)].result() for s in seeds])
            first = first or row
            mark = "*" if build != args[0] and row != first else " "
            miss, worst, above, wc, p99 = row
            print(f"{name:<18} {os.path.basename(build):<28} {miss:6.1%} {worst:6.1%} "
                  f"{above:4} {wc:6.3f} {p99:6.2f} {mark}")


if __name__ == "__main__":
    main()
