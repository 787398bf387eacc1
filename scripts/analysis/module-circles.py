#!/usr/bin/env python3
"""Lists pairs of modules in one crate that import each other (issue 33's
"no two-file circles"): module A names `crate::B` (or `super::B`) and B
names A, outside `#[cfg(test)]` and comments. A pair means one of them holds
what both need; move that to a module of its own, or to the one that owns it.

It also keeps the rooms of a crate apart (issue 61): each module under a
room (the host crate's `backends`) is one backend, and none of them names
another backend, nor the room itself, which re-exports them all; only the
room's router, the one module meant to know them all, may.

    scripts/analysis/module-circles.py      # exits 1 if there is a pair
                                            # or a room's wall is crossed
"""

import glob
import os
import re
import sys


def modules(src_dir):
    """Each module path of a crate (`a::b`) and its file."""
    files = {}
    for root, _, names in os.walk(src_dir):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(root, name)
                parts = os.path.relpath(path, src_dir)[:-3].split("/")
                if parts[-1] in ("mod", "lib", "main"):
                    parts = parts[:-1]
                files["::".join(parts)] = path
    return files


def imports(module, path, files):
    """The crate's modules that `module` names outside tests and comments."""
    text = open(path).read().split("#[cfg(test)]")[0]
    text = re.sub(r"//.*", "", text)
    found = set()
    for named in re.findall(r"crate::([a-z_]+(?:::[a-z_]+)*)", text):
        parts = named.split("::")
        for k in range(len(parts), 0, -1):
            candidate = "::".join(parts[:k])
            if candidate in files:
                found.add(candidate)
                break
    parent = module.split("::")[:-1] if module else []
    for named in re.findall(r"super::([a-z_]+)", text):
        candidate = "::".join(parent + [named])
        if candidate in files:
            found.add(candidate)
    found.discard(module)
    return found


# A crate's source directory -> (the room, its router).
ROOMS = {"crates/host/src": ("backends", "backends::route")}


def crossings(src_dir, deps):
    """(module, named) where one room's occupant names another, or the room."""
    if src_dir not in ROOMS:
        return []
    room, router = ROOMS[src_dir]
    occupant = lambda m: m.split("::")[1] if m.startswith(room + "::") else None
    found = []
    for module, named in deps.items():
        own = occupant(module)
        if own is None or module == router:
            continue
        found += [(module, n) for n in sorted(named) if n == room or occupant(n) not in (None, own)]
    return found


def main():
    pairs, crossed = [], []
    for src_dir in sorted(glob.glob("crates/*/src")):
        files = modules(src_dir)
        deps = {m: imports(m, p, files) for m, p in files.items()}
        pairs += [(src_dir, a, b) for a in deps for b in deps[a] if a < b and a in deps[b]]
        crossed += [(src_dir, a, b) for a, b in crossings(src_dir, deps)]
    for src_dir, a, b in pairs:
        print(f"{src_dir}: {a} <-> {b}")
    for src_dir, a, b in crossed:
        print(f"{src_dir}: {a} names {b}, another backend's room")
    print(f"{len(pairs)} pairs of modules that import each other")
    print(f"{len(crossed)} backends naming another backend")
    return 1 if pairs or crossed else 0


if __name__ == "__main__":
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    sys.exit(main())
