#!/usr/bin/env python3
"""Lists production functions longer than a limit (default 80 lines) in the
workspace's crates, outside `#[cfg(test)]` modules and test directories, and
counts `Result<_, String>` in library crates: the habits of issue 33.

    scripts/analysis/long-functions.py [--limit N] [--strict]

With --strict it exits 1 if a function over the limit gives no reason or a
library crate returns `Result<_, String>` (scripts/test.sh runs it so, at
80 lines, issue 61).

A function whose body must be longer says why in a comment containing
"longer than" on the lines just above it; such functions are listed apart.
The brace matching skips strings, chars and comments well enough for this
codebase's style (rustfmt-formatted; raw strings with a backslash before
their closing quote would confuse it); it is a census, not a parser.
"""

import argparse
import glob
import re
import sys

FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")
STRING_RESULT = re.compile(r"Result<[^;{]*,\s*String>")


def strip_line(line, in_block):
    """The line without strings, chars and comments; and whether a block
    comment is still open at its end."""
    out, i = [], 0
    while i < len(line):
        if in_block:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out), True
            i, in_block = end + 2, False
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            in_block, i = True, i + 2
            continue
        if c == '"':
            i += 1
            while i < len(line) and line[i] != '"':
                i += 2 if line[i] == "\\" else 1
            i += 1
            continue
        if c == "'" and re.match(r"'(\\.|[^\\'])'", line[i:]):
            i += len(re.match(r"'(\\.|[^\\'])'", line[i:]).group(0))
            continue
        out.append(c)
        i += 1
    return "".join(out), in_block


def functions(path):
    """(name, first line, length, justified) of each non-test function."""
    lines = open(path, encoding="utf-8").read().split("\n")
    code, in_block = [], False
    for line in lines:
        stripped, in_block = strip_line(line, in_block)
        code.append(stripped)
    test_from = None
    for i, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]" and i + 1 < len(lines) and "mod " in lines[i + 1]:
            test_from = i
            break
    found = []
    for i, line in enumerate(code):
        if test_from is not None and i >= test_from:
            break
        m = FN.match(line)
        if not m:
            continue
        depth, started, end = 0, False, None
        for j in range(i, len(code)):
            if not started and ";" in code[j] and "{" not in code[j]:
                break  # a declaration without a body
            for ch in code[j]:
                if ch == "{":
                    depth += 1
                    started = True
                elif ch == "}":
                    depth -= 1
            if started and depth == 0:
                end = j
                break
        if end is None:
            continue
        above = " ".join(lines[max(0, i - 6):i])
        found.append((m.group(6), i + 1, end - i + 1, "longer than" in above))
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--strict", action="store_true")
    args = ap.parse_args()
    files = sorted(f for f in glob.glob("crates/*/src/**/*.rs", recursive=True))
    long, justified = [], []
    for f in files:
        for name, line, length, why in functions(f):
            if length > args.limit:
                (justified if why else long).append((length, f"{f}:{line} {name}"))
    for title, rows in [(f"over {args.limit} lines", long), ("longer, with a reason", justified)]:
        print(f"{len(rows)} functions {title}")
        for length, where in sorted(rows, reverse=True):
            print(f"{length:6}  {where}")
    string_results = []
    for f in files + sorted(glob.glob("fuzz/src/**/*.rs", recursive=True)):
        if f.startswith("crates/iofloor/"):
            continue  # the binary: anyhow is its error type
        text = open(f, encoding="utf-8").read()
        cut = text.find("#[cfg(test)]\nmod ")
        head = text if cut < 0 else text[:cut]
        for n, line in enumerate(head.split("\n"), 1):
            if STRING_RESULT.search(line):
                string_results.append(f"{f}:{n}")
    print(f"{len(string_results)} Result<_, String> in library crates (outside tests)")
    for where in string_results:
        print(f"        {where}")
    return 1 if args.strict and (long or string_results) else 0


if __name__ == "__main__":
    sys.exit(main())
