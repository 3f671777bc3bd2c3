#!/usr/bin/env python3
"""Every Prometheus family gmlaked exports, value by value, against `gmlakectl --json stats` and
`--json clients`, units included (issue 26, point 4).

usage: tests/metrics_values.py BUILD_DIR

A daemon on the host backend (2 MiB chunks) gets real activity: clients of two users leasing,
allocating and freeing, a growable range and a share, a lease refused by a quota, a connection
refused over --max-clients-per-uid, a protocol error, a trim and chunks of a uid that left reused by
another. Once the lake is quiescent (waited for: every client's own numbers reported to the daemon,
no chunk being created, two snapshots of stats and clients the same), GET /metrics is parsed with
prometheus_client and each family is compared with the JSON field(s) it exports, converted
explicitly: bytes from chunks times chunk_size, seconds from the JSON's microseconds / 1e6, the
histogram's bounds in seconds from common/wire.h's GML_LEASE_LAT_BOUNDS_US / 1e6, its _sum and
_count from the JSON's and its buckets against the JSON's p50/p99 (the same leases: fewer than the
daemon's ring of 4096), counters typed counter and gauges gauge. A family this script has no check
for fails the test (add its check to FAMILIES), and so does a LakeStats field of the JSON that no
check uses and NOT_EXPORTED does not list.

Needs a python with prometheus_client (Debian's python3-prometheus-client: /usr/bin/python3). As
root the second user's clients run as uid 65534 (nobody); as another user they run as its own uid.
The build's gmlaked, gmlakectl and gml-testclient are run, never loaded: a sanitized build works too.
METRICS_VALUES_SHOW=1 prints the stats, clients and metrics compared."""
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CS = 2 << 20  # GMLAKE_CHUNK_SIZE below
MIB = 1 << 20
# clients of a second uid (root only: as another user the test runs them as its own uid, and no
# chunk of another uid's is reused: chunks_scrubbed and chunks_remade stay 0, compared all the same)
OTHER = 65534 if os.geteuid() == 0 else None
MINE = 4 if OTHER is not None else 6  # connections of the test's uid at once: a fifth (seventh) is refused
errors = []


def fail(msg):
    raise SystemExit("metrics_values: FAILED: " + msg)


def wait_for(what, fn, timeout=30.0, done=bool):
    """fn() until done(its value) (polled every 20 ms); after timeout s, a failure naming what and the last value."""
    end, last = time.monotonic() + timeout, None
    while time.monotonic() < end:
        last = fn()
        if done(last):
            return last
        time.sleep(0.02)
    fail("waited %.0f s for %s (last: %r)" % (timeout, what, last))


# ---------- the daemon, gmlakectl, clients ----------

class Lake:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="gmlake-metrics.")
        os.chmod(self.dir, 0o755)  # the other uid's clients reach the socket
        self.sock = os.path.join(self.dir, "lake.sock")
        self.url = "ipc://" + os.path.join(self.dir, "lake.ctl")
        self.log = os.path.join(self.dir, "daemon.log")
        self.env = dict(os.environ, GMLAKE_CHUNK_SIZE="2MiB", GMLAKE_LOG="error")
        self.env.pop("GMLAKE_HEADROOM", None)
        for attempt in range(5):  # the port is free when chosen; another process may take it before the bind
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
            s.close()
            with open(self.log, "w") as log:
                self.proc = subprocess.Popen(
                    [os.path.join(BUILD, "gmlaked"), "--backend", "host", "--socket", self.sock, "--control", self.url,
                     "--limit", "2MiB", "--prefetch", "0", "--socket-mode", "0666", "--max-clients-per-uid", str(MINE),
                     "--metrics-listen", "127.0.0.1:%d" % self.port, "--log-level", "info"],
                    stdout=subprocess.DEVNULL, stderr=log, env=self.env)
            wait_for("the daemon to answer stats", lambda: self.proc.poll() is not None or self.try_stats())
            if self.proc.poll() is None:
                return
            if "metrics-listen" not in open(self.log).read() or attempt == 4:
                fail("gmlaked exited %s: %s" % (self.proc.returncode, open(self.log).read()))

    def ctl(self, *args):
        r = subprocess.run([os.path.join(BUILD, "gmlakectl"), "--control", self.url] + list(args),
                           capture_output=True, text=True, timeout=30)
        if r.returncode:
            fail("gmlakectl %s: exit %d: %s%s" % (" ".join(args), r.returncode, r.stdout, r.stderr))
        return r.stdout

    def try_stats(self):
        r = subprocess.run([os.path.join(BUILD, "gmlakectl"), "--control", self.url, "--json", "stats"],
                           capture_output=True, text=True, timeout=30)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def stats(self):
        return json.loads(self.ctl("--json", "stats"))

    def clients(self):
        return json.loads(self.ctl("--json", "clients"))

    def http_metrics(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port, timeout=30) as r:
            if r.status != 200:
                fail("GET /metrics: HTTP %d" % r.status)
            return r.read().decode()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=30)
        log = open(self.log).read()
        subprocess.run(["rm", "-rf", self.dir])
        if rc:
            fail("gmlaked exited %d: %s" % (rc, log))


class Client:
    """gml-testclient, one command a line (tests/testclient.c)."""

    growable, paused = False, 0

    def __init__(self, lake, uid=None, expect_ready=True, env=None):
        kw = dict(user=uid, group=uid, extra_groups=[]) if uid is not None else {}
        if not expect_ready:  # its error is what is expected: kept out of the test's output
            kw["stderr"] = subprocess.DEVNULL
        self.p = subprocess.Popen([os.path.join(BUILD, "gml-testclient"), lake.sock], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, bufsize=1, env=dict(lake.env, **(env or {})), **kw)
        self.first = self.p.stdout.readline().strip()
        if expect_ready and not self.first.startswith("ready "):
            fail("a client%s said %r" % (" as uid %d" % uid if uid is not None else "", self.first))
        self.pid = int(self.first.split()[1]) if self.first.startswith("ready ") else None

    def cmd(self, line, want="ok"):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline().strip()
        if want is not None and not out.startswith(want):
            fail("client %s: %r answered %r, not %r" % (self.pid, line, out, want))
        return out

    def own(self):
        """What it reports to the daemon: (allocated, cached, growable mapped, growable unmapped, paused)."""
        self.cmd("flush")
        _, allocated, _reserved, cached, _mode = self.cmd("stats", "stats").split()
        mapped = unmapped = 0
        if self.growable:
            g = self.cmd("ginfo", "ginfo").split()
            mapped, unmapped = int(g[7]), int(g[8])
        return int(allocated), int(cached), mapped, unmapped, self.paused

    def close(self):
        try:
            self.p.stdin.write("close\n")
            self.p.stdin.close()
        except BrokenPipeError:
            pass
        self.p.stdout.read()
        return self.p.wait(timeout=30)


# ---------- the activity ----------

def activity(lake):
    """Returns the clients left connected, each with what the daemon should show of it."""
    st = lake.stats
    # a uid that leaves: its chunk, given back (trim) and left free, is the one A (the test's uid) gets
    # under --limit 2MiB (zeroed or made anew: chunks_scrubbed or chunks_remade); then the limit is 64 MiB
    if OTHER is not None:
        n1 = Client(lake, OTHER)
        n1.cmd("alloc %d" % CS, "ok 0")
        n1.cmd("free 0")
        n1.cmd("trim")
        if n1.close():
            fail("the first client of uid %d did not exit 0" % OTHER)
        wait_for("uid %d's chunk free in the lake, its client gone" % OTHER,
                 lambda: (lambda s: s["clients"] == 0 and s["chunks_free"] == 1 and s["chunks_leased"] == 0)(st()))
    a = Client(lake)
    a.cmd("alloc %d" % MIB, "ok 0")
    if OTHER is not None:
        wait_for("uid %d's chunk scrubbed or remade for A" % OTHER,
                 lambda: (lambda s: s["chunks_scrubbed"] + s["chunks_remade"] >= 1)(st()))
    lake.ctl("limit", "64MiB")
    # A: 3 MiB live in two chunks (1 MiB free inside: fragment), and 4 MiB freed at the end
    a.cmd("alloc %d" % (2 * MIB), "ok 1")
    a.cmd("alloc %d" % (4 * MIB), "ok 2")
    # B, with a headroom of 100%: blocks stitched from chunks apart (stitched); a chunk cached but
    # mapped elsewhere makes it ask an optional lease, which the lake declines, nothing free in it
    # (--prefetch 0); then a growable range, 4 MiB of 16 mapped
    b = Client(lake, env={"GMLAKE_HEADROOM": "100"})
    for line, want in (("alloc 4194304", "ok 0"), ("alloc 2097152", "ok 1"), ("free 0", "ok"), ("alloc 1048576", "ok 0"),
                       ("alloc 6291456", "ok 2"), ("free 1", "ok"), ("alloc 3145728", "ok 1")):
        b.cmd(line, want)
    wait_for("B's optional lease declined", lambda: st()["optional_declined"] == 1)
    b.cmd("grow %d" % (16 * MIB))
    b.growable = True
    b.cmd("gmap 0 %d" % (4 * MIB))
    # a client of the other uid's that stays (a second uid in the per-user families), with a share of 2 MiB
    n2 = Client(lake, OTHER)
    n2.cmd("alloc %d" % (2 * MIB), "ok 0")
    n2.cmd("alloc %d" % MIB, "ok 1")
    n2.cmd("grow %d" % (8 * MIB))
    n2.cmd("gmap 0 %d" % (4 * MIB))
    n2.cmd("share metrics-values %d any" % CS)
    n2.growable = True
    # another of the other uid's, paused: 3 MiB of tagged blocks saved, their chunks back in the lake
    n3 = Client(lake, OTHER)
    for line, want in (("settag 7", "ok"), ("alloc 2097152", "ok 0"), ("alloc 1048576", "ok 1"), ("settag 0", "ok"),
                       ("alloc 1048576", "ok 2"), ("pause 0 7", "ok")):
        n3.cmd(line, want)
    n3.paused = 3 * MIB
    # C: a quota of 4 MiB; 2 MiB served, 4 MiB more refused (leases_refused)
    c = Client(lake)
    lake.ctl("quota", str(c.pid), "4MiB", "--group", "metrics-c")  # named: gmlake_quota_bytes
    c.cmd("alloc %d" % (2 * MIB), "ok 0")
    c.cmd("alloc %d" % (4 * MIB), "err")
    # a protocol error: a frame longer than any (its length prefix all ones)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(lake.sock)
    s.sendall(b"\xff" * 16)
    s.settimeout(30)
    while s.recv(4096):
        pass
    s.close()
    wait_for("the protocol error counted", lambda: st()["protocol_errors"] == 1)
    # a trim: D's chunks and N3's given back, released to the driver; then one more given back and left free
    d = Client(lake)
    d.cmd("alloc %d" % (4 * MIB), "ok 0")
    d.cmd("free 0")
    d.cmd("trim")
    wait_for("D's chunks free", lambda: st()["chunks_free"] >= 2)
    free_before = st()["chunks_free"]  # only a lease takes free chunks, and none is under way
    trimmed = json.loads(lake.ctl("--json", "trim"))["trimmed_chunks"]
    if trimmed < free_before:
        fail("gmlakectl trim released %d chunks of %d free" % (trimmed, free_before))
    d.cmd("alloc %d" % (2 * MIB), "ok 0")
    d.cmd("free 0")
    d.cmd("trim")
    # one connection more of the test's uid: refused over --max-clients-per-uid
    e = Client(lake, expect_ready=False)
    if not e.first.startswith("err "):
        fail("a client over --max-clients-per-uid %d said %r" % (MINE, e.first))
    e.close()
    wait_for("the refused connection counted", lambda: st()["connections_refused"] == 1)
    # A's 4 MiB freed: two whole chunks idle in its cache (freed before, a lease of another client
    # of its uid could have the daemon ask A for them)
    a.cmd("free 2")
    return [a, b, n2, n3, c, d]


def quiescent(lake, clients):
    """Waits until the daemon has every client's last report and makes no chunk; returns
    (stats, clients, metrics text), taken between two equal snapshots of stats and clients."""
    keys = ("allocated", "cached", "growable_mapped", "growable_unmapped", "paused")

    def reported():  # each time asked anew: a client may still be giving the daemon idle cache it asked for
        own = {c.pid: c.own() for c in clients}
        rows = {r["pid"]: tuple(r[k] for k in keys) for r in lake.clients()}
        s = lake.stats()
        return s["chunks_creating"] == 0 and s["chunks_parked"] == 0 and rows == own or (own, rows, s)
    wait_for("every client's own numbers %s in clients --json, no chunk parked or being made" % (keys,),
             reported, done=lambda v: v is True)
    for _ in range(20):
        s1, c1 = lake.stats(), lake.clients()
        text, ctl_text = lake.http_metrics(), lake.ctl("metrics")
        s2, c2 = lake.stats(), lake.clients()
        if (s1, c1) == (s2, c2):
            if ctl_text != text:
                fail("gmlakectl metrics and GET /metrics differ on a quiescent lake:\n%s\n----\n%s" % (ctl_text, text))
            return s1, c1, text
    fail("the lake never stood still: stats %s then %s" % (s1, s2))


# ---------- the checks, family by family ----------

used = set()  # LakeStats fields some check compares


def J(stats, field):
    used.add(field)
    return stats[field]


def values(fam, name=None):
    """{frozenset of labels other than device/gpu_uuid: value} of fam's samples named name."""
    out = {}
    for s in fam.samples:
        if name is None or s.name == name:
            key = frozenset((k, v) for k, v in s.labels.items() if k not in ("device", "gpu_uuid"))
            if key in out:
                errors.append("%s: sample %s twice" % (fam.name, dict(key)))
            out[key] = s.value
    return out


def expect(fam, got, want, unit, tol=0.0):
    """One sample: got (the metric) against want (the JSON, converted to the metric's unit)."""
    if got is None or want is None or not abs(got - want) <= tol:
        errors.append("%s = %r, but the JSON says %r %s" % (fam, got, want, unit))


def scalar(field, unit="bytes", factor=1, tol=0.0):
    """A family of one unlabelled sample: JSON field * factor."""
    def check(fam, st, cl):
        v = values(fam, fam.name + ("_total" if fam.type == "counter" else ""))
        if list(v) != [frozenset()]:
            errors.append("%s: samples %s, not one unlabelled" % (fam.name, [dict(k) for k in v]))
            return
        expect(fam.name, v[frozenset()], J(st, field) * factor, "(%s, %s)" % (field, unit), tol)
    return check


def lake_bytes(fam, st, cl):
    v = values(fam)
    cs = J(st, "chunk_size")
    states = {"free": "chunks_free", "leased": "chunks_leased", "parked": "chunks_parked", "creating": "chunks_creating",
              "shared": "chunks_shared"}
    if set(v) != {frozenset({("state", k)}) for k in states}:
        errors.append("%s: states %s, not %s" % (fam.name, [dict(k) for k in v], sorted(states)))
        return
    for k, field in states.items():
        expect('%s{state="%s"}' % (fam.name, k), v[frozenset({("state", k)})], J(st, field) * cs,
               "(%s * chunk_size %d, bytes)" % (field, cs))
    # chunks being made are not the lake's yet (in no other state either)
    expect("sum of %s" % fam.name, sum(v.values()), (J(st, "chunks_total") + st["chunks_creating"]) * cs,
           "((chunks_total + chunks_creating) * chunk_size, bytes)")


def build_info(fam, st, cl):
    v = values(fam)
    want = frozenset({("version", J(st, "version")), ("backend", J(st, "backend"))})
    if v != {want: 1.0}:
        errors.append("%s: %s, not %s = 1" % (fam.name, {str(dict(k)): x for k, x in v.items()}, dict(want)))


def latency_quantiles(fam, st, cl):
    v = values(fam)
    want = {"0.5": "lease_p50_us", "0.99": "lease_p99_us"}
    if set(v) != {frozenset({("quantile", q)}) for q in want}:
        errors.append("%s: quantiles %s, not %s" % (fam.name, [dict(k) for k in v], sorted(want)))
        return
    for q, field in want.items():
        # the JSON prints microseconds with one decimal: 0.05 us off at most
        expect('%s{quantile="%s"}' % (fam.name, q), v[frozenset({("quantile", q)})], J(st, field) / 1e6,
               "(%s / 1e6, seconds)" % field, 0.05e-6 + 1e-12)


def lat_bounds_us():
    text = open(os.path.join(REPO, "common", "wire.h")).read()
    m = re.search(r"#define GML_LEASE_LAT_BOUNDS_US[\s\\]*\{([0-9, ]+)\}", text)  # clang-format may break the line
    if not m:
        fail("could not read GML_LEASE_LAT_BOUNDS_US from common/wire.h")
    return [int(x) for x in m.group(1).split(",")]


def latency_histogram(fam, st, cl):
    n = fam.name
    buckets = values(fam, n + "_bucket")
    les = sorted((float(dict(k)["le"]), x) for k, x in buckets.items())
    bounds_s = [b / 1e6 for b in lat_bounds_us()]
    if [le for le, _ in les] != bounds_s + [math.inf]:
        errors.append("%s: bucket bounds %s, not GML_LEASE_LAT_BOUNDS_US / 1e6 (seconds) %s and +Inf"
                      % (n, [le for le, _ in les], bounds_s))
        return
    counts = [x for _, x in les]
    count = J(st, "lease_latency_count")
    expect(n + "_count", values(fam, n + "_count").get(frozenset()), count, "(lease_latency_count)")
    expect(n + '_bucket{le="+Inf"}', counts[-1], count, "(lease_latency_count)")
    # the JSON prints seconds with 6 decimals
    total = values(fam, n + "_sum").get(frozenset())
    expect(n + "_sum", total, J(st, "lease_latency_sum_s"), "(lease_latency_sum_s, seconds)", 0.5e-6 + 1e-12)
    if counts != sorted(counts):
        errors.append("%s: buckets not cumulative: %s" % (n, counts))
    # every lease counted once, as leases served
    expect(n + "_count", count, J(st, "lease_count"), "(lease_count: every lease served has its latency)")
    if count < 10:
        errors.append("%s: %d leases: too few to check units with" % (n, count))
    # the sum lies between what the buckets' bounds allow (a sum in other units than the bounds does not)
    edges, lo, hi = [0.0] + bounds_s + [math.inf], 0.0, 0.0
    for i, c in enumerate(counts):
        inside = c - (counts[i - 1] if i else 0)
        lo += inside * edges[i]
        hi += inside * edges[i + 1] if inside else 0.0
    if total is not None and not (lo - 1e-9 <= total <= hi + 1e-9):
        errors.append("%s_sum = %r s, outside what its buckets allow (%r to %r s)" % (n, total, lo, hi))
    # all leases are in the daemon's ring of 4096, so p50/p99 are quantiles of the same leases: with
    # rank i = round(q * (n - 1)), the bucket of a bound >= the quantile holds > i leases, one below it <= i
    if count > 4096:
        errors.append("%s: %d leases, more than the daemon's p50/p99 ring holds" % (n, count))
    for q, field in ((0.5, "lease_p50_us"), (0.99, "lease_p99_us")):
        rank, us = int(q * (count - 1) + 0.5), J(st, field)
        for b, c in zip(lat_bounds_us(), counts):
            if abs(b - us) <= 0.05:
                continue  # the JSON's rounding hides which side of the bound it is
            if b > us and not c > rank:
                errors.append('%s_bucket{le="%g"} = %d, but %s = %s us (rank %d of %d) is below that bound'
                              % (n, b / 1e6, c, field, us, rank, count))
            if b < us and not c <= rank:
                errors.append('%s_bucket{le="%g"} = %d, but %s = %s us (rank %d of %d) is above that bound'
                              % (n, b / 1e6, c, field, us, rank, count))


def per_user(cl):
    users = {}
    for r in cl:
        u = users.setdefault(str(r["uid"]), {"leased": 0, "allocated": 0, "cached": 0, "stitched": 0, "clients": 0})
        for kind, field in (("leased", "leased_bytes"), ("allocated", "allocated"), ("cached", "cached"), ("stitched", "stitched")):
            u[kind] += r[field]
        u["clients"] += 1
    return users


def user_bytes(fam, st, cl):
    v = values(fam)
    want = {frozenset({("uid", uid), ("kind", k)}): x for uid, u in per_user(cl).items() for k, x in u.items() if k != "clients"}
    if set(v) != set(want):
        errors.append("%s: series %s, not %s" % (fam.name, sorted(map(str, map(dict, v))), sorted(map(str, map(dict, want)))))
        return
    for k, x in want.items():
        expect("%s%s" % (fam.name, dict(k)), v[k], x, "(clients --json of that uid summed, bytes)")
    for kind, field in (("allocated", "allocated"), ("cached", "cached"), ("stitched", "stitched")):
        expect('sum of %s{kind="%s"}' % (fam.name, kind), sum(x for k, x in v.items() if ("kind", kind) in k),
               J(st, field), "(stats --json %s, bytes)" % field)


def user_clients(fam, st, cl):
    v = values(fam)
    want = {frozenset({("uid", uid)}): u["clients"] for uid, u in per_user(cl).items()}
    if v != want:
        errors.append("%s: %s, but clients --json has %s" % (fam.name, {str(dict(k)): x for k, x in v.items()},
                                                              {str(dict(k)): x for k, x in want.items()}))
    expect("sum of " + fam.name, sum(v.values()), J(st, "clients"), "(stats --json clients)")


def cgroup_bytes(fam, st, cl):
    v = values(fam)
    want = {}
    for r in cl:  # root reads every client (and another user only its own): none is "(other users)"
        for kind, field in (("leased", "leased_bytes"), ("allocated", "allocated"), ("paused", "paused")):
            k = frozenset({("cgroup", r["cgroup"] or "unknown"), ("kind", kind)})
            want[k] = want.get(k, 0) + r[field]
    if set(v) != set(want):
        errors.append("%s: series %s, not %s" % (fam.name, sorted(map(str, map(dict, v))), sorted(map(str, map(dict, want)))))
        return
    for k, x in want.items():
        expect("%s%s" % (fam.name, dict(k)), v[k], x, "(clients --json of that cgroup summed, bytes)")


QUOTAS = []  # gmlakectl --json quotas, read with the metrics (main)


def quota_bytes(fam, st, cl):
    """Each named quota's bytes, held and peak, as gmlakectl --json quotas says them."""
    v = values(fam)
    want = {}
    for q in QUOTAS:
        if q.get("group"):
            for kind, field in (("quota", "bytes"), ("held", "held_bytes"), ("peak", "peak_bytes")):
                want[frozenset({("group", q["group"]), ("kind", kind)})] = q.get(field, 0)
    if set(v) != set(want) or not want:
        errors.append("%s: series %s, not %s" % (fam.name, sorted(map(str, map(dict, v))), sorted(map(str, map(dict, want)))))
        return
    for k, x in want.items():
        expect("%s%s" % (fam.name, dict(k)), v[k], x, "(quotas --json, bytes)")


def usage_report_fields():
    """The fields of UsageReport in proto/gmlake.proto: what a client reports."""
    proto = open(os.path.join(REPO, "proto", "gmlake.proto")).read()
    body = re.search(r"^message UsageReport \{(.*?)^\}", proto, re.S | re.M).group(1)
    return re.findall(r"^\s*\w+ (\w+) = \d+;", body, re.M)


def user_reported(fam, st, cl):
    """Every UsageReport field per user: the sum of clients --json's field of that name over the user's clients."""
    v = values(fam)
    want = {}
    for r in cl:
        for field in usage_report_fields():
            if field not in r:
                errors.append("clients --json lacks %s, a field of UsageReport" % field)
                continue
            k = frozenset({("uid", str(r["uid"])), ("field", field)})
            want[k] = want.get(k, 0) + r[field]
    if set(v) != set(want):
        errors.append("%s: series %s, not %s" % (fam.name, sorted(map(str, map(dict, v))), sorted(map(str, map(dict, want)))))
        return
    for k, x in want.items():
        expect("%s%s" % (fam.name, dict(k)), v[k], x, "(clients --json of that uid summed)")


# family (as the parser names it: a counter without _total) -> (type, check)
FAMILIES = {
    "gmlake_build_info": ("gauge", build_info),
    "gmlake_lake_bytes": ("gauge", lake_bytes),
    "gmlake_lake_limit_bytes": ("gauge", scalar("limit_bytes")),
    "gmlake_allocated_bytes": ("gauge", scalar("allocated")),
    "gmlake_cached_bytes": ("gauge", scalar("cached")),
    "gmlake_fragmentation_ratio": ("gauge", scalar("fragmentation", "ratio", 1, 0.5e-6)),
    "gmlake_clients": ("gauge", scalar("clients", "count")),
    "gmlake_leases": ("counter", scalar("lease_count", "count")),
    "gmlake_leases_refused": ("counter", scalar("leases_refused", "count")),
    "gmlake_optional_leases_declined": ("counter", scalar("optional_declined", "count")),
    "gmlake_protocol_errors": ("counter", scalar("protocol_errors", "count")),
    "gmlake_lease_latency_seconds": ("gauge", latency_quantiles),
    "gmlake_idle_cache_bytes": ("gauge", scalar("idle_cache_bytes")),
    "gmlake_fragment_bytes": ("gauge", scalar("fragment_bytes")),
    "gmlake_uncounted_bytes": ("gauge", scalar("uncounted")),
    "gmlake_shares": ("gauge", scalar("shares", "count")),
    "gmlake_chunks_shared": ("gauge", scalar("chunks_shared", "chunks")),
    "gmlake_growable_mapped_bytes": ("gauge", scalar("growable_mapped")),
    "gmlake_growable_unmapped_bytes": ("gauge", scalar("growable_unmapped")),
    "gmlake_connections_refused": ("counter", scalar("connections_refused", "count")),
    "gmlake_chunks_scrubbed": ("counter", scalar("chunks_scrubbed", "chunks")),
    "gmlake_chunks_remade": ("counter", scalar("chunks_remade", "chunks")),
    "gmlake_chunks_released_idle": ("counter", scalar("chunks_released_idle", "chunks")),
    "gmlake_cgroup_bytes": ("gauge", cgroup_bytes),
    "gmlake_quota_bytes": ("gauge", quota_bytes),
    "gmlake_lease_duration_seconds": ("histogram", latency_histogram),
    "gmlake_user_bytes": ("gauge", user_bytes),
    "gmlake_user_clients": ("gauge", user_clients),
    "gmlake_user_reported": ("gauge", user_reported),
}
# LakeStats fields in stats --json that no family exports, and why
NOT_EXPORTED = {
    "device": "every sample's device label (checked on every sample)",
    "gpu_uuid": "every sample's gpu_uuid label (checked on every sample)",
    "device_total_bytes": "the device's size, for limits in percent",
    "device_model": "the device's name, for people (gmlakectl's node view): a label would split every family",
}
# numbers this activity must make non-zero: a unit wrong by a factor cannot show on a zero
NONZERO = ["chunks_free", "chunks_leased", "limit_bytes", "allocated", "cached", "stitched", "fragmentation", "clients",
           "lease_count", "leases_refused", "optional_declined", "protocol_errors", "lease_p50_us", "lease_p99_us",
           "idle_cache_bytes", "fragment_bytes", "shares", "chunks_shared", "growable_mapped", "growable_unmapped",
           "connections_refused", "lease_latency_sum_s", "lease_latency_count"]


def check(st, cl, text):
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name, f in list(fams.items()):  # the parser names a counter's family without _total, another with it
        if name not in FAMILIES and name.endswith("_total") and name[:-6] in FAMILIES:
            fams[name[:-6]] = f  # checked as that family: its type is wrong
    unchecked = sorted(set(fams) - set(FAMILIES) - {n + "_total" for n in FAMILIES})
    if unchecked:
        errors.append("families with no check in tests/metrics_values.py (add each to FAMILIES, its JSON field and unit): %s"
                      % unchecked)
    missing = sorted(set(FAMILIES) - set(fams))
    if missing:
        errors.append("families no longer exported: %s" % missing)
    for name, f in sorted(fams.items()):
        for s in f.samples:
            if s.labels.get("device") != str(J(st, "device")) or s.labels.get("gpu_uuid") != J(st, "gpu_uuid"):
                errors.append("%s%s: device/gpu_uuid labels, not device=%s gpu_uuid=%s" % (s.name, s.labels, st["device"],
                                                                                           st["gpu_uuid"]))
        if name not in FAMILIES:
            continue
        typ, fn = FAMILIES[name]
        if f.type != typ:
            errors.append("%s is typed %s, not %s" % (name, f.type, typ))
        fn(f, st, cl)
    for field in NONZERO:
        if not st[field]:
            errors.append("the activity left %s at 0 (its family's unit goes unchecked)" % field)
    uncovered = sorted(set(st) - used - set(NOT_EXPORTED))
    if uncovered and not errors:  # (a check that found its family wrong may have stopped before its fields)
        errors.append("stats --json fields no family's check compares (a check in FAMILIES, or NOT_EXPORTED): %s" % uncovered)
    return fams


def main():
    def timed_out(*_):
        fail("not done after 300 s (a client or the daemon hung?)")
    signal.signal(signal.SIGALRM, timed_out)
    signal.alarm(300)  # a hung client or daemon: fail (and clean up) rather than hang the suite
    t0 = time.monotonic()
    lake = Lake()
    clients, done = [], False
    try:
        clients = activity(lake)
        st, cl, text = quiescent(lake, clients)
        QUOTAS[:] = json.loads(lake.ctl("--json", "quotas"))
        fams = check(st, cl, text)
        done = True
        if os.environ.get("METRICS_VALUES_SHOW"):
            print(json.dumps(st), json.dumps(cl), text, sep="\n")
    finally:
        for c in clients:
            c.close()
        if errors or not done:
            sys.stderr.write("daemon.log:\n" + open(lake.log).read()[-4000:])
            lake.proc.kill()
            lake.proc.wait()
            subprocess.run(["rm", "-rf", lake.dir])
    if errors:
        print("metrics_values: FAILED: /metrics disagrees with gmlakectl --json stats/clients:", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        print(text, file=sys.stderr)
        sys.exit(1)
    lake.stop()
    print("  %d families, each against stats/clients --json, units converted (%d leases, %d clients, %.1f s)"
          % (len(fams), st["lease_count"], st["clients"], time.monotonic() - t0))


if __name__ == "__main__":
    main()
