#!/usr/bin/env python3
"""tests/layers.py BUILD: the layering rules of the product code, checked from the object files'
symbols (what each file defines and what it uses), so a call through a header counts.

1. Folders call only down: common/ (and the generated protobuf code) uses nothing of client/,
   daemon/ or tools/; client/ and daemon/ use common/ and never each other; tools/ may use all.
2. No circle among the files of one folder: file A using a function of file B while B (through any
   chain inside the folder) uses one of A's. A circle that is argued for is listed in ALLOWED with
   the header that argues it.
3. Names: a function or object the library's files (client/, common/) define for other files is
   either the public API (GML_API in include/gmlake.h) or internal, prefixed `gmli_` (as libuv's
   `uv__`, nng's `nni_`); no file of any folder defines a `gml_` name the header does not export,
   and no header's `static inline` function takes the public prefix.
Prints each violation with the symbols that make it; exit 1 when there is one."""
import os
import re
import subprocess
import sys

FOLDERS = ("common", "gen", "client", "daemon", "tools")
MAY_USE = {
    "common": {"common", "gen"},
    "gen": {"gen"},
    "client": {"client", "common", "gen"},
    "daemon": {"daemon", "common", "gen"},
    "tools": {"tools", "client", "common", "gen"},
}
# circles argued for: a frozenset of files -> where the argument is written
ALLOWED = {}


def symbols(paths):
    """{path: (defined, used)} for every object, from two nm runs over all of them (not two per object)."""
    out = {p: (set(), set()) for p in paths}
    if not paths:
        return out
    for flags, which in ((["--defined-only", "-g"], 0), (["-u"], 1)):
        text = subprocess.run(["nm", "-A"] + flags + list(paths), capture_output=True, text=True, check=True).stdout
        for line in text.splitlines():
            path, _, rest = line.partition(":")
            f = rest.split()
            if which == 0 and len(f) == 3 and f[1] in "TDBRVWC":
                out[path][0].add(f[2])
            elif which == 1 and f:
                out[path][1].add(f[-1])
    return out


def public_names():
    text = open("include/gmlake.h").read()
    return {m.group(1) for m in re.finditer(r"\bGML_API\b[^;{]*?\b((?:gml|gmlake)_\w+)\s*\(", text)}


def names(files):
    public, bad = public_names(), 0
    if len(public) < 20:  # the header's GML_API lines not found: the check would pass by seeing nothing
        print(f"names: only {len(public)} GML_API functions found in include/gmlake.h")
        return 1
    for f, (defs, _) in sorted(files.items()):
        folder = f.split("/")[0]
        for s in sorted(defs):
            if s in public or s.startswith("__"):  # the compiler's and sanitizers' own (__odr_asan.X)
                continue
            if s.startswith("gml_") or (folder in ("client", "common") and not s.startswith("gmli_")):
                bad += 1
                print(f"name: {f} defines {s}: internal names take the prefix gmli_ (gml_ is the public API's)")
    for folder in ("common", "client", "daemon", "tools"):
        for h in sorted(os.listdir(folder)):
            if h.endswith(".h"):
                for m in re.finditer(r"static\s+inline\b[^;{(]*?\b(gml_\w+)\s*\(", open(f"{folder}/{h}").read()):
                    if m.group(1) not in public:
                        bad += 1
                        print(f"name: {folder}/{h}: static inline {m.group(1)}: internal names take the prefix gmli_")
    return bad


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    objdir = os.path.join(build, "obj")
    objects = {}
    for folder in FOLDERS:
        d = os.path.join(objdir, folder)
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            src = f"{folder}/{name[:-2]}.c"
            # an object whose source is gone (a file moved since BUILD was made) is no part of the tree
            if name.endswith(".o") and (folder == "gen" or os.path.exists(src)):
                objects[os.path.join(d, name)] = src
    syms = symbols(sorted(objects))
    files = {src: syms[path] for path, src in objects.items()}
    owner = {}
    for f, (defs, _) in files.items():
        for s in defs:
            owner[s] = f
    edges = {}  # file -> {file: [symbols]}
    for f, (_, uses) in files.items():
        for s in uses:
            g = owner.get(s)
            if g and g != f:
                edges.setdefault(f, {}).setdefault(g, []).append(s)
    bad = 0
    for f, targets in sorted(edges.items()):
        for g, syms in sorted(targets.items()):
            a, b = f.split("/")[0], g.split("/")[0]
            if b not in MAY_USE[a]:
                bad += 1
                print(f"layer: {f} ({a}/) uses {g} ({b}/), which {a}/ may not: {', '.join(sorted(syms)[:5])}")
    # circles: strongly connected components (Tarjan) within each folder
    for folder in FOLDERS:
        nodes = [f for f in files if f.startswith(folder + "/")]
        index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]

        def visit(v):
            index[v] = low[v] = n[0]
            n[0] += 1
            stack.append(v)
            on.add(v)
            for w in edges.get(v, {}):
                if not w.startswith(folder + "/"):
                    continue
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))

        sys.setrecursionlimit(10000)
        for v in nodes:
            if v not in index:
                visit(v)
        for comp in comps:
            if frozenset(comp) in ALLOWED:
                print(f"circle allowed ({ALLOWED[frozenset(comp)]}): {', '.join(comp)}")
                continue
            bad += 1
            print(f"circle: {len(comp)} files of {folder}/: {', '.join(comp)}")
            for f in comp:
                for g, syms in sorted(edges.get(f, {}).items()):
                    if g in comp:
                        print(f"  {f} -> {g}: {', '.join(sorted(syms)[:6])}")
    bad += names(files)
    print(f"layers: {len(files)} files, {bad} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
