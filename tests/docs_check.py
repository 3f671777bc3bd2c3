#!/usr/bin/env python3
"""tests/docs_check.py [BUILD]: the documentation says only what is true of this tree.

In README.md, CHANGELOG.md and docs/*.md:
- every relative link [text](path#anchor) names a file that exists (and a heading of it, for an anchor);
- every repository path quoted (in `code` or in plain text: tests/x.c, bench/results/run53/...) exists,
  a glob matching something; placeholders (runN, NAME, W, ...) and build outputs are left alone;
- every `make TARGET` quoted in code names a target of the Makefile;
- every `gmlakectl [options] COMMAND` quoted in code names a command of gmlakectl (its --help, else
  tools/gmlakectl.c's table);
- every `man [SECTION] NAME` quoted names a page of man/ (or a function a man 3 page's NAME lists);
- every gml_/gmli_ name quoted in code (a function, a type, a macro; `gmli_plan_rec_*` a prefix) is one
  the source has (a rename leaves no stale name behind);
- README.md is under 300 lines with `make demo` and `make test` in its first 40 lines.
Every problem is listed, file and line, and the exit status is 1. No network, a second or so.
"""
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
# What a path quoted in the docs may start with: the tree's own top-level folders and files.
TOP_DIRS = ["bench", "client", "common", "daemon", "docs", "include", "man", "proto", "python", "scripts",
            "systemd", "tests", "tools", ".ci"]
TOP_FILES = ["README.md", "CHANGELOG.md", "LICENSE", "Makefile"]
# Outputs of a build or a GPU call, not in the tree.
GENERATED = re.compile(r"^(build[\w-]*|\.gpu|\.deb|shared)/")
# A path component that is a placeholder, not a name: runN, NAME, W, TRACE, ... (upper-case letters that
# are not part of a file name the tree has, such as README.md).
PLACEHOLDER = re.compile(r"(^|[\W_])(?!README|LICENSE|CHANGELOG|Makefile)[A-Z][A-Z0-9]*($|[\W_])"
                         r"|[a-z][A-Z]+($|\W)|[<>$%]")
problems = []


def bad(where, msg):
    problems.append("%s: %s" % (where, msg))


def doc_files():
    files = ["README.md", "CHANGELOG.md"] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return [os.path.relpath(os.path.join(ROOT, f), ROOT) for f in files if os.path.exists(os.path.join(ROOT, f))]


def github_slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def headings(path):
    out = set()
    in_code = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            out.add(github_slug(line.lstrip("#").replace("`", "")))
    return out


def make_targets():
    targets = set()
    for line in open(os.path.join(ROOT, "Makefile"), encoding="utf-8"):
        m = re.match(r"^([A-Za-z0-9_.%$()/ -]+?)\s*:(?!=)", line)
        if m and not line.startswith("\t"):
            for t in m.group(1).split():
                if "$" not in t and "%" not in t:
                    targets.add(t)
        m = re.match(r"^\.PHONY\s*:(.*)", line)
        if m:
            targets.update(m.group(1).split())
    return targets


def gmlakectl_commands():
    exe = os.path.join(ROOT, BUILD, "gmlakectl")
    cmds = set()
    if os.access(exe, os.X_OK):
        out = subprocess.run([exe, "--help"], capture_output=True, text=True).stdout
        after = out.split("commands:", 1)[-1] if "commands:" in out else ""
        cmds = set(re.findall(r"^  ([a-z]+)", after, re.M))
    if not cmds:  # no build: the command table of tools/gmlakectl.c
        src = open(os.path.join(ROOT, "tools", "gmlakectl.c"), encoding="utf-8").read()
        table = src.split("commands[] = {", 1)[1].split("};", 1)[0]
        cmds = set(re.findall(r'^\s*\{"([a-z]+)",', table, re.M))
    return cmds


def check_path(where, p):
    p = p.rstrip(".,;:)")
    p = re.sub(r"#.*$", "", p)
    m = re.search(r"\{([^}]*)\}", p)
    if m:  # a{b,c}d: each of abd, acd
        for alt in m.group(1).split(","):
            check_path(where, p[:m.start()] + alt + p[m.end():])
        return
    if not p or GENERATED.match(p) or PLACEHOLDER.search(p):
        return
    full = os.path.join(ROOT, p)
    if "*" in p or "?" in p:
        if not glob.glob(full):
            bad(where, "%s matches no file" % p)
    elif not os.path.exists(full):
        bad(where, "%s does not exist" % p)


PATH_IN_TEXT = re.compile(r"(?<![\w./~$-])((?:%s)/(?:[\w./*+@-]|\{[\w,.-]*\})*|(?:%s)\b)" % (
    "|".join(re.escape(d) for d in TOP_DIRS), "|".join(re.escape(f) for f in TOP_FILES)))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
MAKE = re.compile(r"(?<![\w-])make((?:\s+(?:-\S+|[A-Z_]+=\S*))*)\s+([a-z][\w-]*)")
CTL = re.compile(r"(?<![\w-])gmlakectl((?:\s+\S+)*)")
CTL_VALUE_OPTS = {"--control", "--device"}
MAN = re.compile(r"^\s*(?:\$\s+)?man\s+(?:-\S+\s+)*(?:([1-8])\s+)?([a-z][\w.-]*)")  # a command: man at the start


def man_names():
    """Every name `man` finds in man/: the pages, and the names in each page's NAME section."""
    names = {}
    for page in glob.glob(os.path.join(ROOT, "man", "man*", "*.[1-8]")):
        sec = page.rsplit(".", 1)[1]
        names.setdefault(os.path.basename(page).rsplit(".", 1)[0], set()).add(sec)
        text = open(page, encoding="utf-8").read()
        m = re.search(r"^\.SH NAME\n(.*?)^\.SH", text, re.M | re.S)
        if m:
            for n in re.split(r"[,\s]+", m.group(1).split("\\-")[0].replace("\\-", "-")):
                if n:
                    names.setdefault(n, set()).add(sec)
    return names


MAN_NAMES = None
SOURCE_NAMES = None
GML_NAME = re.compile(r"\b(gmli?_\w*)(\*|\b)")


def source_names():
    names = set()
    for pat in ("include/*.h", "client/*.[ch]", "common/*.[ch]", "daemon/*.[ch]", "tools/*.[ch]", "tests/*.[ch]",
                "python/gmlake/*.py", "python/gmlake/*.cpp"):
        for f in glob.glob(os.path.join(ROOT, pat)):
            names.update(re.findall(r"\bgmli?_\w+", open(f, encoding="utf-8", errors="replace").read()))
    return names


def check_code(where, code, targets, cmds):
    global MAN_NAMES
    if MAN_NAMES is None:
        MAN_NAMES = man_names()
    global SOURCE_NAMES
    if SOURCE_NAMES is None:
        SOURCE_NAMES = source_names()
    for m in GML_NAME.finditer(code):
        name = m.group(1)
        if re.search(r"[A-Z]", name):  # gmli_backend_NAME_open: a placeholder
            continue
        if m.group(2) == "*" or name.endswith("_"):
            if not any(n.startswith(name) for n in SOURCE_NAMES):
                bad(where, "`%s*`: no name of the source begins so" % name)
        elif name not in SOURCE_NAMES:
            bad(where, "`%s`: no such name in the source (renamed?)" % name)
    for m in filter(None, [MAN.match(code)]):
        sec, name = m.group(1), m.group(2).rstrip(".")
        if name not in MAN_NAMES or (sec and sec not in MAN_NAMES[name]):
            bad(where, "`man %s%s`: no such page in man/" % (sec + " " if sec else "", name))
    for m in MAKE.finditer(code):
        if m.group(2) not in targets:
            bad(where, "`make %s`: no such target in the Makefile" % m.group(2))
    for m in CTL.finditer(code):
        toks = m.group(1).split()
        i = 0
        while i < len(toks):
            t = toks[i]
            if t.startswith("-"):
                i += 2 if t in CTL_VALUE_OPTS else 1
                continue
            if re.fullmatch(r"[a-z]+", t) and t not in cmds:
                bad(where, "`gmlakectl ... %s`: not a gmlakectl command (it has %s)" % (t, ", ".join(sorted(cmds))))
            break


def check_file(rel, targets, cmds):
    path = os.path.join(ROOT, rel)
    base = os.path.dirname(path)
    in_code = False
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        where = "%s:%d" % (rel, n)
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            check_code(where, line, targets, cmds)
            for m in PATH_IN_TEXT.finditer(line):
                check_path(where, m.group(1))
            continue
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            tpath = os.path.normpath(os.path.join(base, file_part)) if file_part else path
            if not os.path.exists(tpath):
                bad(where, "link to %s: no such file" % target)
            elif anchor and tpath.endswith(".md") and anchor not in headings(tpath):
                bad(where, "link to %s: %s has no heading #%s" % (target, os.path.relpath(tpath, ROOT), anchor))
        # code spans, then the rest of the line's text
        spans = re.findall(r"`([^`]+)`", line)
        for s in spans:
            check_code(where, s, targets, cmds)
            for m in PATH_IN_TEXT.finditer(s):
                check_path(where, m.group(1))
        text = re.sub(r"`[^`]+`", " ", LINK.sub(" ", line))
        for m in PATH_IN_TEXT.finditer(text):
            check_path(where, m.group(1))


def check_readme():
    lines = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) >= 300:
        bad("README.md", "%d lines: a newcomer's README stays under 300 (the rest goes in docs/)" % len(lines))
    first = "\n".join(lines[:40])
    for cmd in ("make demo", "make test"):
        if cmd not in first:
            bad("README.md", "`%s` is not in the first 40 lines" % cmd)


def main():
    targets, cmds = make_targets(), gmlakectl_commands()
    if len(targets) < 10 or len(cmds) < 8:
        print("docs_check: could not read the Makefile's targets (%d) or gmlakectl's commands (%d)" % (
            len(targets), len(cmds)), file=sys.stderr)
        return 1
    files = doc_files()
    for rel in files:
        check_file(rel, targets, cmds)
    check_readme()
    if problems:
        print("docs_check: %d problem(s) in README.md, CHANGELOG.md, docs/:" % len(problems), file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    print("  %d files: links, quoted paths, `make` targets, gmlakectl commands and man pages exist; README %d lines" % (
        len(files), sum(1 for _ in open(os.path.join(ROOT, "README.md"), encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
