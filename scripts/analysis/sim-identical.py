#!/usr/bin/env python3
"""Shows that a change left the simulator's figures alone: runs every
shipped simulator scenario under every policy with two iofloor binaries and
compares their `iofloor sim NAME --json` summaries, wall-clock decision
times aside (the simulator is deterministic; its decision times are not).

    scripts/analysis/sim-identical.py OLD_IOFLOOR NEW_IOFLOOR

For example, with the binary of the commit before a refactor kept aside:

    git worktree add /tmp/before HEAD~1 && (cd /tmp/before && cargo build --release -p iofloor)
    scripts/analysis/sim-identical.py /tmp/before/target/release/iofloor target/release/iofloor

Prints each scenario's verdict and the first differing fields; exits 1 if any
scenario differs.
"""

import json
import subprocess
import sys


def scenarios(iofloor):
    """The shipped scenarios the simulator runs (those not made for a rig, bed or guest)."""
    out = subprocess.run([iofloor, "scenarios"], stdout=subprocess.PIPE, text=True, check=True)
    names = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    return [n for n in names if not n.endswith(("-rig", "-real", "-bed", "-guest")) and n != "cut"]


def summary(iofloor, name):
    out = subprocess.run([iofloor, "sim", name, "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    if out.returncode != 0:
        return None
    return without_wall_clock(json.loads(out.stdout))


def without_wall_clock(x):
    if isinstance(x, dict):
        return {k: without_wall_clock(v) for k, v in x.items() if "decision_time" not in k}
    if isinstance(x, list):
        return [without_wall_clock(v) for v in x]
    return x


def differences(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            yield from differences(a.get(k), b.get(k), f"{path}/{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from differences(x, y, f"{path}[{i}]")
    elif a != b:
        yield f"{path}: {a!r} -> {b!r}"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old, new = sys.argv[1:]
    differ = 0
    names = scenarios(new)
    for name in names:
        a, b = summary(old, name), summary(new, name)
        if a is None or b is None:
            print(f"{name}: did not run under {'the old' if a is None else 'the new'} binary")
            differ += 1
            continue
        diffs = list(differences(a, b))
        print(f"{name}: {'identical' if not diffs else f'{len(diffs)} fields differ'}")
        for d in diffs[:5]:
            print(f"    {d}")
        differ += bool(diffs)
    print(f"{len(names)} scenarios, {differ} differ beyond decision time")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
