#!/usr/bin/env python3
"""What capping alone could reach in shipped scenarios, with hindsight.

An upper reference for any policy that acts by capping tenants' rates (as
iofloor does): the noisy tenants' load is replaced by fio-like rate-limited
jobs whose rates are chosen knowing the whole scenario in advance, and the
result is simulated with no policy at all (`iofloor sim FILE --policy none`).

  stolen  For each phase of the other host's load, the highest rate of the
          noisy tenant at which no protected tenant misses a floor in that
          phase (bisection, 12 rounds). Prints the work conservation this
          reaches against `none` on the unmodified scenario.
  phases NAME
          The same for scenario NAME, whose phases are those of its
          unmanaged load and its declared device changes (`sawing`,
          `backup`): what capping could reach knowing every change before
          it happens.
  churn   The capacity left by the protected tenants in each stretch
          between arrivals and departures, known exactly; the noisy tenants
          together get U times it, split evenly (the ceiling of `capped`
          honoured). Prints floor-miss, work conservation and protected p99
          ratio for each U given.

  paced NAME
          The noisy tenants of scenario NAME paced exactly at what `floor`
          gave them (each one's mean over every 10 s of `iofloor sim NAME
          --policy floor`), U times that, from a deep queue that never runs
          dry (one job of the tenant's first job's I/O shape): the same
          work as `floor`, with no burst and no decision late. Prints floor-miss, work conservation and protected p99
          ratio for each U given: the p99 the device's own queueing at that
          load gives, which no policy acting by caps goes below.

Usage (from the repository, after `cargo build --release`):
  scripts/analysis/cap-oracle.py stolen
  scripts/analysis/cap-oracle.py phases sawing
  scripts/analysis/cap-oracle.py churn 0.9 0.95 0.97 1.0
  scripts/analysis/cap-oracle.py paced tree 0.9 1.0
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IOFLOOR = os.environ.get("IOFLOOR", os.path.join(ROOT, "target", "release", "iofloor"))
MISS = 0.95  # a window is missed below 95 % of the entitlement (docs/metrics.md)


def simulate(toml_text, work, policy="none"):
    """Runs `toml_text` under `policy`; returns its run record and every
    policy's summary by name (`none`, the reference, is always run too)."""
    path = os.path.join(work, "variant.toml")
    out = os.path.join(work, "out")
    with open(path, "w") as f:
        f.write(toml_text)
    subprocess.run(["rm", "-rf", out], check=True)
    r = subprocess.run([IOFLOOR, "sim", path, "--policy", policy, "--out", out],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("iofloor sim failed:\n" + r.stderr)
    with open(os.path.join(out, "runs", policy + ".json")) as f:
        run = json.load(f)
    with open(os.path.join(out, "summary.json")) as f:
        summaries = json.load(f)["policies"]
    return run, summaries


def blocks(text):
    """The scenario split before each `[[...]]` table, with the tenant each belongs to."""
    tenant = None
    for block in re.split(r"(?m)^(?=\[\[)", text):
        if block.startswith("[[tenant]]"):
            tenant = re.search(r'(?m)^name = "([^"]+)"', block).group(1)
        elif not block.startswith("[[tenant.job]]"):
            tenant = None
        yield tenant, block


def job_between(job, start, stop, rate_per_process):
    """`job` rate-limited and running only from `start` to `stop` (seconds)."""
    job = re.sub(r"(?m)^(start|stop|rate) = .*\n", "", job).rstrip("\n")
    job += '\nrate = "%dB/s"\n' % max(1, int(rate_per_process))
    if start > 0:
        job += 'start = "%ds"\n' % start
    return job + 'stop = "%ds"\n\n' % stop


def missed_per_phase(run, phases):
    misses = [0] * len(phases)
    for w in run["windows"]:
        if w["t"] < run["warmup_s"]:
            continue
        k = next(i for i, (a, b) in enumerate(phases) if a <= w["t"] < b)
        for spec, tw in zip(run["tenants"], w["tenants"]):
            if spec["noisy"] or not spec["floor"]:
                continue
            floor = spec["floor"]["value"]
            unit = "iops" if spec["floor"]["unit"] == "iops" else "bytes_per_s"
            asked = tw["demand"][unit] if tw["demand"] else floor
            entitled = min(floor, asked)
            if entitled > 0 and tw["got"][unit] < MISS * entitled:
                misses[k] += 1
    return misses


def seconds(text):
    """A scenario duration this script reads: whole seconds ("20s")."""
    m = re.fullmatch(r"(\d+)s", text)
    if not m:
        sys.exit("cap-oracle: duration %r is not whole seconds" % text)
    return int(m.group(1))


def megabytes(text):
    """A scenario rate this script reads, in MB/s ("6MB/s")."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)MB/s", text)
    if not m:
        sys.exit("cap-oracle: rate %r is not in MB/s" % text)
    return float(m.group(1))


def phases(work, name):
    text = open(os.path.join(ROOT, "scenarios", name + ".toml")).read()
    scenario = tomllib.loads(text)
    none = simulate(text, work)[1]["none"]
    # The load beside ours changes at its phases, the device at its declared
    # changes; the noisy tenant's processes share each phase's rate.
    steps = {seconds(p["at"]) for u in scenario.get("unmanaged", []) for j in u["job"]
             for p in j.get("phase", [])}
    steps |= {seconds(c["at"]) for c in scenario["device"].get("change", [])}
    edges = sorted({0, seconds(scenario["duration"])} | steps)
    phases = list(zip(edges, edges[1:]))
    noisy = next(t for t in scenario["tenant"] if t.get("noisy"))
    processes = noisy["job"][0].get("numjobs", 1)

    def variant(rates):
        out = []
        for tenant, block in blocks(text):
            if tenant == noisy["name"] and block.startswith("[[tenant.job]]"):
                for (a, b), r in zip(phases, rates):
                    out.append(job_between(block, a, b, r / processes))
            else:
                out.append(block)
        return "".join(out)

    most = 48e6  # bytes/s: above what the shipped devices serve the noisy tenant
    low, high = [0.0] * len(phases), [most] * len(phases)
    for _ in range(12):
        mid = [(a + b) / 2 for a, b in zip(low, high)]
        run, _ = simulate(variant(mid), work)
        for k, m in enumerate(missed_per_phase(run, phases)):
            if m == 0:
                low[k] = mid[k]
            else:
                high[k] = mid[k]
    if any(r >= 0.99 * most for r in low):
        print("warning: a phase's rate reached the search's top (%.0f MB/s): raise it" % (most / 1e6))
    run, summaries = simulate(variant(low), work)
    summary = summaries["none"]
    print("noisy rate per phase (MB/s):", " ".join("%.1f" % (r / 1e6) for r in low))
    print("protected windows missed per phase:", missed_per_phase(run, phases))
    print("floor-miss %.1f %%, work conservation %.3f, protected p99 ratio %.2f" % (
        100 * summary["floor_miss_rate"],
        summary["aggregate_cost"] / none["aggregate_cost"],
        summary["protected_p99_ratio"]))


def churn(work, shares):
    text = open(os.path.join(ROOT, "scenarios", "churn.toml")).read()
    scenario = tomllib.loads(text)
    end = seconds(scenario["duration"])
    # Each tenant's one job: when it runs, with how many processes, and a
    # protected tenant's rate or a noisy tenant's ceiling (MB/s).
    noisy, protected = {}, {}
    for tenant in scenario["tenant"]:
        job = tenant["job"][0]
        span = (seconds(job.get("start", "0s")), seconds(job.get("stop", "%ds" % end)))
        if tenant.get("noisy"):
            ceiling = tenant.get("ceiling")
            noisy[tenant["name"]] = span + (job.get("numjobs", 1),
                                           megabytes(ceiling) if ceiling else None)
        else:
            protected[tenant["name"]] = span + (megabytes(job["rate"]),)
    none_run, summaries = simulate(text, work)
    none = summaries["none"]
    # What `none` serves with the device saturated (64 KiB random writes,
    # whoever sends them): the typical window among the fullest.
    totals = sorted(sum(t["got"]["bytes_per_s"] for t in w["tenants"]) / 1e6
                    for w in none_run["windows"] if w["t"] >= none_run["warmup_s"])
    full = [x for x in totals if x >= 0.98 * totals[-1]]
    capacity = full[len(full) // 2]
    edges = sorted({0, end} | {t for s in noisy.values() for t in s[:2]}
                   | {t for s in protected.values() for t in s[:2]})
    stretches = list(zip(edges, edges[1:]))

    def variant(share):
        out = []
        for tenant, block in blocks(text):
            if tenant in noisy and block.startswith("[[tenant.job]]"):
                start, stop, processes, _ = noisy[tenant]
                for a, b in stretches:
                    if a < start or b > stop:
                        continue
                    left = capacity - sum(r for s, e, r in protected.values() if s <= a and b <= e)
                    active = [n for n, (s, e, _, _) in noisy.items() if s <= a and b <= e]
                    each = {n: share * left / len(active) for n in active}
                    for n in active:
                        ceiling = noisy[n][3]
                        if ceiling is not None and each[n] > ceiling:
                            rest = [m for m in active if m != n]
                            for m in rest:
                                each[m] += (each[n] - ceiling) / len(rest)
                            each[n] = ceiling
                    out.append(job_between(block, a, b, each[tenant] * 1e6 / processes))
            else:
                out.append(block)
        return "".join(out)

    print("capacity while saturated: %.2f MB/s" % capacity)
    for share in shares:
        s = simulate(variant(share), work)[1]["none"]
        print("U %.2f: floor-miss %.1f %%, work conservation %.3f, protected p99 ratio %.2f" % (
            share, 100 * s["floor_miss_rate"], s["aggregate_cost"] / none["aggregate_cost"],
            s["protected_p99_ratio"]))


def paced(work, name, shares, stretch=10):
    path = os.path.join(ROOT, "scenarios", name + ".toml")
    if not os.path.exists(path):
        sys.exit("cap-oracle: no shipped scenario %r (%s)" % (name, path))
    text = open(path).read()
    floor_run, summaries = simulate(text, work, "floor")
    floor, none = summaries["floor"], summaries["none"]
    noisy = [i for i, t in enumerate(floor_run["tenants"]) if t["noisy"]]
    if not noisy:
        sys.exit("cap-oracle: %s has no noisy tenant to pace" % name)
    end = seconds(tomllib.loads(text)["duration"])
    edges = list(range(0, end, stretch)) + [end]
    stretches = list(zip(edges, edges[1:]))
    # Each noisy tenant's mean rate under `floor` over each stretch (B/s).
    rates = {}
    for i in noisy:
        got = [(w["t"], w["tenants"][i]["got"]["bytes_per_s"]) for w in floor_run["windows"]]
        rates[floor_run["tenants"][i]["name"]] = [
            sum(g for t, g in got if a <= t < b) / max(1, sum(1 for t, _ in got if a <= t < b))
            for a, b in stretches]

    def variant(share):
        out, done = [], set()
        for tenant, block in blocks(text):
            if tenant in rates and block.startswith("[[tenant.job]]"):
                # One deep job per tenant carries its whole rate.
                if tenant in done:
                    continue
                done.add(tenant)
                job = re.sub(r"(?ms)^phase = \[.*?\]\s*?\n", "", block)
                job = re.sub(r"(?m)^(ramp|numjobs|iodepth) = .*\n", "", job)
                job = job.rstrip("\n") + "\niodepth = 32\n"
                for (a, b), rate in zip(stretches, rates[tenant]):
                    if share * rate >= 1:
                        out.append(job_between(job, a, b, share * rate))
            else:
                out.append(block)
        return "".join(out)

    print("floor: floor-miss %.1f %%, work conservation %.3f, protected p99 ratio %.2f" % (
        100 * floor["floor_miss_rate"], floor["aggregate_cost"] / none["aggregate_cost"],
        floor["protected_p99_ratio"]))
    for share in shares:
        s = simulate(variant(share), work)[1]["none"]
        print("paced at U %.2f of it: floor-miss %.1f %%, work conservation %.3f, "
              "protected p99 ratio %.2f" % (
                  share, 100 * s["floor_miss_rate"], s["aggregate_cost"] / none["aggregate_cost"],
                  s["protected_p99_ratio"]))


def shares_of(args):
    """The shares U given on the command line: positive numbers."""
    try:
        shares = [float(x) for x in args]
    except ValueError:
        sys.exit("cap-oracle: shares must be numbers, got %s" % " ".join(args))
    if any(not u > 0 for u in shares):
        sys.exit("cap-oracle: shares must be above 0, got %s" % " ".join(args))
    return shares


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("stolen", "phases", "churn", "paced"):
        sys.exit(__doc__)
    if not os.access(IOFLOOR, os.X_OK):
        sys.exit("no iofloor binary at %s: run `cargo build --release` or set IOFLOOR" % IOFLOOR)
    with tempfile.TemporaryDirectory() as work:
        if sys.argv[1] == "stolen":
            phases(work, "stolen")
        elif sys.argv[1] == "phases":
            if len(sys.argv) < 3:
                sys.exit(__doc__)
            phases(work, sys.argv[2])
        elif sys.argv[1] == "paced":
            if len(sys.argv) < 3:
                sys.exit(__doc__)
            paced(work, sys.argv[2], shares_of(sys.argv[3:]) or [0.9, 1.0])
        else:
            churn(work, shares_of(sys.argv[2:]) or [0.9, 0.95, 0.97, 1.0])


if __name__ == "__main__":
    main()
