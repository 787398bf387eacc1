#!/usr/bin/env python3
"""Runs every test binary of the workspace and prints how long each took,
its slowest tests and the total, so that a slow suite shows where its time
goes (issue 33).

    scripts/timed-tests.py            # build, then run every binary
    scripts/timed-tests.py sim daemon # only the binaries whose name contains one of these
    scripts/timed-tests.py --one-at-a-time  # no two binaries side by side

The long real-device binaries run in two lanes side by side (`LANES`): most
of their tests wait on a device of their own at a few per cent of a core
(the rig's bench used 6 % of the machine, measured) and judge only what they
made, so two of them do not disturb each other. The tests that need the
machine to themselves (`ALONE`: a TCG guest takes a core, the cluster bed
runs three daemons, etcd and NBD, a browser, timing and CPU measurements)
are skipped in the lanes and run one at a time after them, with every other
binary. (Run beside a light test, a TCG guest cost a QD-1 tenant on the rig
its floor in 2 of 37 windows, and the cluster bed's floor fell to 40 %.)

`cargo test` itself cannot time tests on stable Rust: libtest's
`--report-time` and JSON output need nightly. So the binaries are built with
`cargo test --no-run`, then run here as cargo would run them (from their
package's directory), every binary even after one fails, and a test's time
is read as the time between its result line and the one before it: exact
where a binary runs its tests one at a time (the real-device binaries hold a
lock so that they do), an upper bound where tests run side by side. Doc
tests run last, through cargo. Exits 1 if anything failed.
"""

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time

SLOW_TEST_SECONDS = 20.0
# Binaries run side by side, in this order within a lane, the daemon's and
# the bench's without their ALONE tests; balanced by their times (the
# bench's light tests 5.0 min since a dead or killed bench's fio no longer
# runs out its time, etcd's 0.2; the daemon's 3.4, the demo 1.1, the light
# real binaries under a minute together).
LANES = [
    ["iofloor::daemon", "iofloor::demo", "host::real", "iofloor::package", "iofloor::records",
     "host::qmp"],
    ["iofloor::bench", "cluster::etcd"],
]
# The simulator's binary (69 s, both cores) stays out of the lanes, even at
# the lowest priority: run beside them at `nice -n 19` (2026-12-02), the
# daemon's capacity-cut test met its floors in 89 % of windows (111/111
# twice alone the same hour): a QD-1 tenant asking 1,050 IOPS has under a
# millisecond an I/O, and a core given back to it a little late costs it
# the window.
# The tests of the lanes' binaries that need the machine to themselves (name
# filters; each must match a test, or the suite fails and says so).
ALONE = {
    "iofloor::daemon": [
        "a_real_guest_and_a_container",
        "cluster::",
        "dashboard_shows",
        "libvirt::",
        "load::",
        "overhead_of_the_daemon",
        # Beside the bench's rig tests on a slow day (2026-12-01: the build
        # twice as long as two days before) these missed windows they hold
        # alone: noisy-4 96 % against 100 %, podman's db 5 of 8 against 7.
        "podman::labelled_podman_containers",
        "run_keeps_noisy4_floors",
    ],
    "iofloor::bench": ["hybrid_real_vm"],
}
RESULT = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)")
SUMMARY = re.compile(r"^test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored")


def build():
    """Builds the test binaries; returns (name, executable, cwd) for each,
    or None when the build failed (cargo has said why)."""
    cmd = ["cargo", "test", "--workspace", "--all-targets", "--locked", "--no-run",
           "--message-format=json-render-diagnostics"]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        return None
    out = done.stdout
    binaries = []
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("profile", {}).get("test"):
            continue
        if not msg.get("executable"):
            continue
        cwd = os.path.dirname(msg["manifest_path"])
        crate_dir = os.path.basename(cwd)
        target = msg["target"]
        kind = target["kind"][0]
        if kind in ("bench", "example"):
            continue  # built (and linted, under test.sh), not run as tests
        name = f"{crate_dir}::{target['name']}" if kind == "test" else f"{crate_dir} ({kind})"
        binaries.append((name, msg["executable"], cwd))
    return binaries


def stamped_lines(stream, lines):
    """Puts each line of `stream` on `lines` with the time it arrived."""
    for line in stream:
        lines.put((time.monotonic(), line))


def run(name, cmd, cwd, log_dir):
    """Runs one binary, its output to a log as it comes; returns its figures.
    The output is read on a thread and the binary's exit ends the run: a
    process a test left behind that still holds the pipe must not hang the
    suite (cargo test moves on too)."""
    log_path = os.path.join(log_dir, re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".log")
    started = last = time.monotonic()
    tests, passed, failed, ignored = [], 0, 0, 0
    lines = queue.Queue()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
        reader = threading.Thread(target=stamped_lines, args=(proc.stdout, lines), daemon=True)
        reader.start()
        while True:
            try:
                now, line = lines.get(timeout=0.5)
            except queue.Empty:
                if proc.poll() is not None and (not reader.is_alive() or lines.empty()):
                    reader.join(timeout=2)
                    if lines.empty():
                        break
                continue
            log.write(line)
            log.flush()
            m = RESULT.match(line)
            if m and m.group(2) != "ignored":
                tests.append((now - last, m.group(1), m.group(2)))
                last = now
            m = SUMMARY.match(line)
            if m:
                passed += int(m.group(2))
                failed += int(m.group(3))
                ignored += int(m.group(4))
        code = proc.wait()
    if code != 0 and failed == 0:
        failed = 1  # crashed or killed before its summary: counts as a failure
    return {
        "name": name, "seconds": time.monotonic() - started, "code": code,
        "passed": passed, "failed": failed, "ignored": ignored,
        "tests": tests, "log": log_path,
    }


def failure_report(log_path):
    """The part of a failed binary's log that says why: libtest's failures
    block, or the log's end when it has none (a crash)."""
    with open(log_path) as f:
        text = f.readlines()
    starts = [i for i, line in enumerate(text) if line.startswith("failures:")]
    return "".join(text[starts[0]:] if starts else text[-40:])


def schedule(binaries):
    """The lanes (the LANES binaries without their ALONE tests) and what
    runs after them, one at a time: the ALONE tests, then every other
    binary. Each entry is (name, command, cwd)."""
    by_name = {name: (exe, cwd) for name, exe, cwd in binaries}
    lanes = []
    for lane in LANES:
        entries = []
        for name in lane:
            if name in by_name:
                exe, cwd = by_name[name]
                skips = [a for f in ALONE.get(name, []) for a in ("--skip", f)]
                entries.append((name, [exe] + skips, cwd))
        lanes.append(entries)
    after = [(f"{name} (alone)", [by_name[name][0]] + filters, by_name[name][1])
             for name, filters in ALONE.items() if name in by_name]
    in_lanes = {name for lane in LANES for name in lane}
    after += [(name, [exe], cwd) for name, exe, cwd in binaries if name not in in_lanes]
    return lanes, after


def missing_alone_tests(results):
    """A failed result for each ALONE filter that matched no test (a test
    renamed without this file: it would run in a lane, beside another)."""
    missing = []
    for name, filters in ALONE.items():
        ran = [t for r in results if r["name"] == f"{name} (alone)" for _, t, _ in r["tests"]]
        if not any(r["name"] == f"{name} (alone)" for r in results):
            continue
        for f in filters:
            if not any(f in t for t in ran):
                print(f"{name}: no test matches the ALONE filter `{f}`; "
                      "update ALONE in scripts/timed-tests.py")
                missing.append({"name": f"{name} ALONE `{f}`", "seconds": 0.0, "code": 1,
                                "passed": 0, "failed": 1, "ignored": 0, "tests": [],
                                "log": ""})
    return missing


def report(r):
    """Prints one binary's line as it finishes, and why it failed."""
    status = "ok" if r["code"] == 0 else f"FAILED (exit {r['code']})"
    print(f"{r['seconds']:8.1f} s  {r['name']:<36} {r['passed']:4} passed  {status}", flush=True)
    if r["code"] != 0:
        sys.stdout.write(failure_report(r["log"]))


def main():
    args = sys.argv[1:]
    one_at_a_time = "--one-at-a-time" in args
    wanted = [a for a in args if a != "--one-at-a-time"]
    suite_started = time.monotonic()
    t0 = time.monotonic()
    binaries = build()
    if binaries is None:
        print("the test binaries did not build, or clippy found warnings (cargo's errors above)")
        return 1
    build_seconds = time.monotonic() - t0
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    log_dir = os.path.abspath(os.path.join(target, "test-logs"))
    os.makedirs(log_dir, exist_ok=True)
    chosen = [b for b in binaries if not wanted or any(w in b[0] for w in wanted)]
    results = []
    printing = threading.Lock()

    def run_lane(lane):
        for name, cmd, cwd in lane:
            r = run(name, cmd, cwd, log_dir)
            with printing:
                report(r)
                results.append(r)

    if one_at_a_time:
        run_lane([(name, [exe], cwd) for name, exe, cwd in chosen])
    else:
        lanes, after = schedule(chosen)
        threads = [threading.Thread(target=run_lane, args=(lane,)) for lane in lanes if lane]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        run_lane(after)
        results.extend(missing_alone_tests(results))
    if not wanted:
        r = run("doc tests", ["cargo", "test", "--workspace", "--locked", "--doc", "-q"],
                os.getcwd(), log_dir)
        report(r)
        results.append(r)

    print(f"\ntest binaries built in {build_seconds:.0f} s; slowest binaries:")
    for r in sorted(results, key=lambda r: -r["seconds"])[:8]:
        print(f"{r['seconds']:8.1f} s  {r['name']}")
    slow = sorted(((s, f"{r['name']}: {t}") for r in results for s, t, _ in r["tests"]
                   if s >= SLOW_TEST_SECONDS), reverse=True)
    if slow:
        print(f"tests over {SLOW_TEST_SECONDS:.0f} s:")
        for s, t in slow:
            print(f"{s:8.1f} s  {t}")
    failed = [r["name"] for r in results if r["code"] != 0]
    total = time.monotonic() - suite_started
    print(f"tests: {len(results)} binaries, {sum(r['passed'] for r in results)} passed, "
          f"{sum(r['failed'] for r in results)} failed in {total / 60:.1f} min, build "
          f"included; the binaries' own times add up to "
          f"{sum(r['seconds'] for r in results) / 60:.1f} min (logs in {os.path.relpath(log_dir)})")
    if failed:
        print("failed: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
