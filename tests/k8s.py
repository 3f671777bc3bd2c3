#!/usr/bin/env python3
"""tests/k8s.py [BUILD]: deploy/k8s checked offline, with Debian's python3-kubernetes (its models are the
Kubernetes API's types, 1.22 in bookworm's 22.6.0) and python3-yaml:
  1. every object of deploy/k8s/*.yaml is a known kind whose every field is a field of its model, of the
     model's type, down to the leaves, with every required field (the models' own validation);
  2. the DaemonSet's gmlaked command line is systemd/gmlaked@.service's ExecStart (%i: the GPU, which
     gmlake-pod replaces by its UUID), and the unit's hardening is the pod's (no capability, no new
     privileges, a read-only root, seccomp, not root, the node's pids), its metrics port announced;
  3. gmlake-pod starts one daemon per GPU that a (fake) nvidia-smi lists, with that command line, and
     stops them all when one exits or when it is told to;
  4. gmlake-quota's decisions: a pod's quota name, its cgroup under both cgroup drivers' layouts, what
     is set and cleared for the pods of a node; with BUILD, as root with a writable cgroup2 hierarchy, its
     reconcile against a real daemon (host backend) and a pod's cgroup made as the kubelet makes it.
Run by tests/run.sh with /usr/bin/python3 (where Debian's python3-kubernetes is)."""
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

import kubernetes.client as k8s
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(ROOT, "deploy", "k8s")
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


PRIMITIVE = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object, "datetime": str, "date": str}


def check(data, typ, path):
    """data against the model type name typ (as openapi_types writes it): every key known, every value typed."""
    m = re.match(r"list\[(.*)\]$", typ)
    if m:
        if not isinstance(data, list):
            return fail(f"{path}: a list wanted, {type(data).__name__} given")
        for i, v in enumerate(data):
            check(v, m.group(1), f"{path}[{i}]")
        return
    m = re.match(r"dict\(str, (.*)\)$", typ)
    if m:
        if not isinstance(data, dict):
            return fail(f"{path}: a map wanted")
        for k, v in data.items():
            check(v, m.group(1), f"{path}.{k}")
        return
    if typ in PRIMITIVE:
        if not isinstance(data, PRIMITIVE[typ]) or (typ == "int" and isinstance(data, bool)):
            fail(f"{path}: {typ} wanted, {data!r} given")
        return
    cls = getattr(k8s, typ)
    if not isinstance(data, dict):
        return fail(f"{path}: an object ({typ}) wanted")
    by_json = {j: a for a, j in cls.attribute_map.items()}
    for k, v in data.items():
        if k not in by_json:
            fail(f"{path}: {k} is no field of {typ} (fields: {', '.join(sorted(by_json))})")
        else:
            check(v, cls.openapi_types[by_json[k]], f"{path}.{k}")


def model_name(obj):
    group_version = obj["apiVersion"].split("/")
    version = group_version[-1]
    return f"{version[0].upper()}{version[1:]}{obj['kind']}"


def validate_objects():
    objs = []
    api = k8s.ApiClient()
    for f in sorted(os.listdir(DEPLOY)):
        if not f.endswith(".yaml"):
            continue
        for i, obj in enumerate(yaml.safe_load_all(open(os.path.join(DEPLOY, f)))):
            if obj is None:
                continue
            where = f"{f}#{i} {obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
            name = model_name(obj)
            if not hasattr(k8s, name):
                fail(f"{where}: no model {name} (apiVersion {obj['apiVersion']}, kind {obj['kind']})")
                continue
            check(obj, name, where)
            try:  # the models' own checks: required fields, enums
                api._ApiClient__deserialize(obj, name)
            except (ValueError, TypeError) as e:
                fail(f"{where}: {e}")
            objs.append(obj)
    print(f"  {len(objs)} objects of deploy/k8s/*.yaml valid against the Kubernetes {k8s.__name__} models "
          f"(python3-kubernetes {__import__('kubernetes').__version__})")
    return objs


def unit_execstart():
    for line in open(os.path.join(ROOT, "systemd", "gmlaked@.service")):
        if line.startswith("ExecStart="):
            return shlex.split(line[len("ExecStart="):])
    raise SystemExit("no ExecStart in systemd/gmlaked@.service")


def check_daemonset(objs):
    ds = [o for o in objs if o["kind"] == "DaemonSet"]
    if len(ds) != 1:
        return fail(f"{len(ds)} DaemonSets in deploy/k8s (one wanted)")
    pod = ds[0]["spec"]["template"]
    spec = pod["spec"]
    c = {x["name"]: x for x in spec["containers"]}
    d = c.get("gmlaked")
    if not d:
        return fail("no container gmlaked")
    exec_start = unit_execstart()
    if d["args"] != exec_start:
        fail(f"the DaemonSet's gmlaked command is not the unit's ExecStart:\n  pod:  {d['args']}\n  unit: {exec_start}")
    else:
        print(f"  the DaemonSet's gmlaked command is the unit's ExecStart: {' '.join(exec_start)}")
    psc, sc = spec.get("securityContext", {}), d.get("securityContext", {})
    want = [(sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation: false (NoNewPrivileges=yes)"),
            (sc.get("capabilities", {}).get("drop") == ["ALL"] and not sc.get("capabilities", {}).get("add"),
             "capabilities: drop ALL, add none (CapabilityBoundingSet=)"),
            (sc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem (ProtectSystem=strict)"),
            (sc.get("privileged") is False, "not privileged"),
            (psc.get("runAsNonRoot") is True and psc.get("runAsUser", 0) != 0, "runs as a user, not root (User=gmlaked)"),
            (psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "seccomp RuntimeDefault (SystemCallFilter=)"),
            (spec.get("hostPID") is True, "the node's pids (SO_PEERCRED and /proc/PID/cgroup of clients)")]
    for ok, what in want:
        if not ok:
            fail(f"the gmlaked container lacks the unit's hardening: {what}")
    vols = {v["name"]: v for v in spec["volumes"]}
    runs = [m for m in d["volumeMounts"] if m["mountPath"] == "/run/gmlake"]
    if not runs or vols.get(runs[0]["name"], {}).get("hostPath", {}).get("path") != "/run/gmlake":
        fail("/run/gmlake is not the node's (a hostPath): pods would not reach the sockets")
    ann = pod["metadata"].get("annotations", {})
    ports = [p["containerPort"] for p in d.get("ports", [])]
    if ann.get("prometheus.io/scrape") != "true" or int(ann.get("prometheus.io/port", 0)) not in ports:
        fail(f"no Prometheus scrape annotation naming a declared port: {ann}, ports {ports}")
    if not failures:
        print("  the unit's hardening is the pod's; /run/gmlake the node's; metrics announced on", ann["prometheus.io/port"])


def check_gmlake_pod():
    pods = []  # each in a process group of its own: whatever happens, none of its daemons outlives the test
    try:
        check_gmlake_pod_in(pods)
    finally:
        for p in pods:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def check_gmlake_pod_in(pods):
    with tempfile.TemporaryDirectory() as t:
        smi = os.path.join(t, "nvidia-smi")
        with open(smi, "w") as f:
            f.write("#!/bin/sh\necho '0, GPU-11111111-2222-3333-4444-555555555555'\necho '1, GPU-66666666-7777-8888-9999-000000000000'\n")
        fake = os.path.join(t, "gmlaked")
        with open(fake, "w") as f:  # records its arguments, then lives until told to stop (or until $T/die-<UUID>)
            f.write("#!/bin/sh\necho \"$*\" > \"$FAKE_DIR/args.$2\"\n"
                    "while [ ! -e \"$FAKE_DIR/die.$2\" ]; do sleep 0.05; done\nexit 3\n")
        os.chmod(smi, 0o755), os.chmod(fake, 0o755)
        args = unit_execstart()
        args[0] = fake
        env = dict(os.environ, GMLAKE_NVIDIA_SMI=smi, FAKE_DIR=t)
        p = pods.append(subprocess.Popen([os.path.join(DEPLOY, "gmlake-pod"), *args], env=env, stdout=subprocess.PIPE,
                                         text=True, start_new_session=True)) or pods[-1]
        uuids = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"]
        deadline = time.time() + 30
        while time.time() < deadline and not all(os.path.exists(os.path.join(t, "args." + u)) for u in uuids):
            time.sleep(0.05)
        for n, u in enumerate(uuids):
            path = os.path.join(t, "args." + u)
            got = open(path).read().split() if os.path.exists(path) else None
            want = [a.replace("%i", u) for a in unit_execstart()[1:]] + ["--metrics-listen", f"0.0.0.0:{9464 + n}"]
            if got != want:
                fail(f"gmlake-pod ran GPU {n}'s daemon as {got}, not {want}")
        open(os.path.join(t, "die." + uuids[1]), "w").close()  # one daemon exits: the pod ends, the other stopped
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            return fail("gmlake-pod did not end when one of its daemons exited")
        if rc == 0:
            fail("gmlake-pod exited 0 after a daemon died (the kubelet would not see it)")
        for u in uuids:
            for f in ("args.", "die."):
                if os.path.exists(os.path.join(t, f + u)):
                    os.unlink(os.path.join(t, f + u))
        p = pods.append(subprocess.Popen([os.path.join(DEPLOY, "gmlake-pod"), *args], env=env, stdout=subprocess.PIPE,
                                         text=True, start_new_session=True)) or pods[-1]
        deadline = time.time() + 30
        while time.time() < deadline and not all(os.path.exists(os.path.join(t, "args." + u)) for u in uuids):
            time.sleep(0.05)
        if p.poll() is not None:
            return fail("gmlake-pod ended with its daemons running")
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            return fail("gmlake-pod did not stop on SIGTERM")
        if rc != 0:
            fail(f"gmlake-pod exited {rc} on SIGTERM (0 wanted: told to stop)")
        print("  gmlake-pod: one daemon per GPU with the unit's command (%i its UUID), metrics 9464+N; "
              "a daemon's exit ends the pod (non-zero), SIGTERM stops them all (0)")


def check_quota_controller():
    spec = importlib.util.spec_from_file_location("gmlake_quota", os.path.join(DEPLOY, "gmlake-quota.py"))
    q = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(q)
    if q.group_name("ml", "trainer-0") != "k8s-ml.trainer-0" or len(q.group_name("a" * 40, "b" * 40)) != 63:
        fail("gmlake-quota's quota names")
    uid = "0b1c2d3e-aaaa-bbbb-cccc-123456789abc"
    with tempfile.TemporaryDirectory() as t:  # the systemd driver's layout, then cgroupfs's
        os.makedirs(os.path.join(t, "kubepods.slice", "kubepods-burstable.slice",
                                 f"kubepods-burstable-pod{uid.replace('-', '_')}.slice", "cri-containerd-1.scope"))
        got = q.pod_cgroup(t, uid)
        if got != f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice":
            fail(f"pod cgroup (systemd driver): {got}")
        if q.pod_cgroup(t, "ffffffff-0000-0000-0000-000000000000") is not None:
            fail("a pod with no cgroup was given one")
    with tempfile.TemporaryDirectory() as t:
        os.makedirs(os.path.join(t, "kubepods", "besteffort", f"pod{uid}", "abc"))
        if q.pod_cgroup(t, uid) != f"/kubepods/besteffort/pod{uid}":
            fail(f"pod cgroup (cgroupfs driver): {q.pod_cgroup(t, uid)}")
    pods = [{"uid": "u1", "namespace": "ml", "name": "a", "annotations": {q.ANNOTATION: "16GiB"}, "phase": "Running"},
            {"uid": "u2", "namespace": "ml", "name": "b", "annotations": {}, "phase": "Running"},
            {"uid": "u3", "namespace": "ml", "name": "c", "annotations": {q.ANNOTATION: "8GiB"}, "phase": "Succeeded"},
            {"uid": "u4", "namespace": "ml", "name": "d", "annotations": {q.ANNOTATION: "lots"}, "phase": "Running"}]
    want = q.desired_quotas(pods, lambda u: f"/kubepods/pod{u}")
    if want != {"k8s-ml.a": ("/kubepods/podu1", "16GiB")}:
        fail(f"desired quotas: {want}")
    have = {"k8s-ml.c": ("cgroup:/kubepods/podu3", 8 << 30), "k8s-ml.a": ("cgroup:/kubepods/podu1", 16 << 30)}
    if q.plan(want, have) != [["quota", "group:k8s-ml.c", "0"]]:
        fail(f"plan (pod c ended, a set): {q.plan(want, have)}")
    if q.plan(want, {}) != [["quota", "cgroup:/kubepods/podu1", "16GiB", "--group", "k8s-ml.a"]]:
        fail(f"plan (a new): {q.plan(want, {})}")
    print("  gmlake-quota: names, pod cgroups (systemd and cgroupfs drivers), what it sets and clears")


def cgroup2_mount():
    for line in open("/proc/self/mountinfo"):
        f = line.split()
        if " - cgroup2 " in line:
            return f[4]
    return None


class FakeApi:
    """What reconcile asks of the API server: the pods of the node."""
    def __init__(self):
        self.pods = []

    def list_pod_for_all_namespaces(self, field_selector=None):
        from types import SimpleNamespace as NS
        return NS(items=[NS(metadata=NS(uid=p["uid"], namespace=p["namespace"], name=p["name"],
                                        annotations=p["annotations"]), status=NS(phase=p["phase"])) for p in self.pods])


def check_quota_controller_live(build):
    """gmlake-quota's reconcile against a real daemon (host backend) and a real cgroup v2 directory laid out as the
    kubelet's cgroupfs driver lays a pod out: the pod's annotation becomes a quota on its cgroup that binds a client
    in it, and the quota goes when the pod does. Root and a writable cgroup2 hierarchy only."""
    mnt = cgroup2_mount()
    if os.getuid() != 0 or not mnt or not os.access(mnt, os.W_OK):
        print("  (gmlake-quota against a daemon: not run: needs root and a writable cgroup2 hierarchy)")
        return
    spec = importlib.util.spec_from_file_location("gmlake_quota", os.path.join(DEPLOY, "gmlake-quota.py"))
    q = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(q)
    uid = "7a1b2c3d-0000-4000-8000-%012d" % os.getpid()
    top = os.path.join(mnt, "kubepods")
    made_top = not os.path.exists(top)
    pod = os.path.join(top, "besteffort", f"pod{uid}")
    os.makedirs(os.path.join(pod, "ctr"), exist_ok=True)
    rundir = tempfile.mkdtemp(prefix="gmlk8s.")
    d = c = None
    try:
        d = subprocess.Popen([os.path.join(build, "gmlaked"), "--device", "0", "--backend", "host", "--socket",
                              f"{rundir}/gmlake-host-0.sock", "--control", f"ipc://{rundir}/gmlake-host-0.ctl",
                              "--limit", "64MiB", "--prefetch", "0"], stderr=subprocess.DEVNULL)
        os.environ["PATH"] = os.path.abspath(build) + os.pathsep + os.environ["PATH"]  # the controller's gmlakectl
        deadline = time.time() + 30
        while time.time() < deadline and q.ctl(rundir, "gmlake-host-0.ctl", ["stats"]).returncode:
            time.sleep(0.05)
        api = FakeApi()
        api.pods = [{"uid": uid, "namespace": "ml", "name": "trainer", "annotations": {q.ANNOTATION: "6MiB"},
                     "phase": "Running"}]
        q.reconcile(api, "node", rundir, mnt)
        rows = json.loads(q.ctl(rundir, "gmlake-host-0.ctl", ["--json", "quotas"]).stdout)
        want_cg = f"cgroup:/kubepods/besteffort/pod{uid}"
        if [(r["group"], r["holder"], r["bytes"]) for r in rows] != [("k8s-ml.trainer", want_cg, 6 << 20)]:
            fail(f"gmlake-quota set {rows}, not k8s-ml.trainer on {want_cg}")
        # a process of the pod (in one of its containers' cgroups) is held to it
        c = subprocess.Popen(["sh", "-c", f"echo $$ > {pod}/ctr/cgroup.procs && exec {build}/gml-testclient default"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, GMLAKE_SOCKET=f"{rundir}/gmlake-host-0.sock", GMLAKE_MODE="daemon"))
        out, _ = c.communicate("alloc 4194304\nalloc 4194304\nexit\n", timeout=60)
        if "ok 0" not in out or not re.search(r"err .*quota of 6.00 MiB reached \(k8s-ml.trainer of cgroup ", out):
            fail(f"a client in the pod's cgroup was not held to its 6 MiB: {out}")
        api.pods = []  # the pod is gone
        q.reconcile(api, "node", rundir, mnt)
        rows = json.loads(q.ctl(rundir, "gmlake-host-0.ctl", ["--json", "quotas"]).stdout)
        if rows:
            fail(f"the quota stays after its pod: {rows}")
        print("  gmlake-quota against a daemon: the pod's annotation a quota on its cgroup, holding a client in it; "
              "gone with the pod")
    finally:
        if c and c.poll() is None:
            c.kill()
        if d:
            d.terminate()
            d.wait(timeout=30)
        for p in (os.path.join(pod, "ctr"), pod, os.path.dirname(pod)) + ((top,) if made_top else ()):
            try:
                os.rmdir(p)
            except OSError:
                pass
        subprocess.run(["rm", "-rf", rundir])


def main():
    objs = validate_objects()
    check_daemonset(objs)
    check_gmlake_pod()
    check_quota_controller()
    if len(sys.argv) > 1:
        check_quota_controller_live(sys.argv[1])
    for f in ("gmlake-pod", "gmlake-quota.py"):
        if f not in open(os.path.join(DEPLOY, "Containerfile")).read():
            fail(f"the Containerfile does not install {f}")
    if failures:
        sys.exit(f"tests/k8s.py: {len(failures)} failure(s)")
    print("PASS: tests/k8s.py")


if __name__ == "__main__":
    main()
