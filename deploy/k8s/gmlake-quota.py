#!/usr/bin/env python3
"""gmlake-quota: the DaemonSet's second container (deploy/k8s/daemonset.yaml): gives each pod of this node
that asks for it its share of the node's GPU memory lakes, and takes it back when the pod goes.

A pod asks with an annotation, per GPU:   metadata.annotations["gmlake.io/memory"]: "16GiB"
The share becomes a named quota (docs/cluster.md) on the pod's cgroup, the one the kubelet made for the
pod (every container of the pod is below it, and no process of the pod can leave it), on the lake of
every GPU of the node:
    gmlakectl --control ipc:///run/gmlake/gmlake-<UUID>.ctl quota cgroup:<pod cgroup> 16GiB --group k8s-<ns>.<pod>
(which GPUs the pod was given is the kubelet's PodResources API's to say, which this does not read: a quota
on a lake the pod never uses binds nothing). The pod's cgroup is found under the node's cgroup hierarchy
(hostPath /sys/fs/cgroup) by the pod's UID, as the systemd driver (kubepods-...-pod<UID_>.slice) and the
cgroupfs driver (pod<UID>) name it. The quota is removed when the pod is deleted or has ended, and at start
every k8s-* quota whose pod is no longer on this node is removed (the controller was down meanwhile).

Only the reconcile step talks to the API server and the daemons; what it decides (desired_quotas, plan)
is pure and tested offline by tests/k8s.py."""
import json
import os
import re
import subprocess
import sys
import time

ANNOTATION = "gmlake.io/memory"
SIZE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?\s*([KMGT]i?B?|B)?$", re.IGNORECASE)


def group_name(namespace, name):
    """The quota's name: k8s-<namespace>.<name>, in what a quota name may hold (63 of [A-Za-z0-9._-])."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"k8s-{namespace}.{name}")[:63]


def pod_cgroup(root, uid):
    """The pod's cgroup as /proc/PID/cgroup names it ("/kubepods.slice/.../kubepods-besteffort-pod<UID_>.slice"),
    found under root (the node's cgroup v2 mount) by its UID; None when there is none (yet)."""
    wanted = {f"pod{uid}", f"pod{uid.replace('-', '_')}"}
    for top in ("kubepods.slice", "kubepods"):
        base = os.path.join(root, top)
        for d, subdirs, _ in os.walk(base):
            for s in subdirs:
                stem = s[: -len(".slice")] if s.endswith(".slice") else s
                if any(stem.endswith(w) for w in wanted):
                    return "/" + os.path.relpath(os.path.join(d, s), root)
            if os.path.relpath(d, base).count(os.sep) >= 2:  # pods sit at most two levels below kubepods
                subdirs[:] = []
    return None


def desired_quotas(pods, cgroup_of):
    """{group: (cgroup, size)} for the running pods that ask (cgroup_of(uid): their cgroup or None)."""
    want = {}
    for p in pods:
        size = (p.get("annotations") or {}).get(ANNOTATION, "").strip()
        if not size or not SIZE_RE.match(size) or p.get("phase") not in ("Pending", "Running"):
            continue
        cg = cgroup_of(p["uid"])
        if cg:
            want[group_name(p["namespace"], p["name"])] = (cg, size)
    return want


def plan(want, have):
    """The gmlakectl arguments that take one lake from have ({group: (holder, bytes)}, its k8s-* quotas) to
    want: a quota set (again, when its holder or size changed) for each wanted one, cleared for each other."""
    cmds = []
    for g, (cg, size) in sorted(want.items()):
        if g not in have or have[g][0] != f"cgroup:{cg}":
            cmds.append(["quota", f"cgroup:{cg}", size, "--group", g])
    for g in sorted(set(have) - set(want)):
        cmds.append(["quota", f"group:{g}", "0"])
    return cmds


def lakes(rundir):
    """The node's lakes: the control endpoints named by a GPU's UUID (the gmlake-N.ctl links name them again)."""
    return sorted(f for f in os.listdir(rundir) if f.startswith("gmlake-") and f.endswith(".ctl") and not f[7:-4].isdigit())


def ctl(rundir, lake, args):
    return subprocess.run(["gmlakectl", "--control", f"ipc://{rundir}/{lake}", *args], capture_output=True, text=True,
                          timeout=30)


def reconcile(v1, node, rundir, cgroot):
    pods = v1.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    view = [{"uid": p.metadata.uid, "namespace": p.metadata.namespace, "name": p.metadata.name,
             "annotations": p.metadata.annotations, "phase": p.status.phase} for p in pods]
    want = desired_quotas(view, lambda uid: pod_cgroup(cgroot, uid))
    for lake in lakes(rundir):
        r = ctl(rundir, lake, ["--json", "quotas"])
        if r.returncode:
            print(f"gmlake-quota: {lake}: {r.stderr.strip()}", file=sys.stderr)
            continue
        have = {q["group"]: (q["holder"], q["bytes"]) for q in json.loads(r.stdout) if q.get("group", "").startswith("k8s-")}
        for args in plan(want, have):
            r = ctl(rundir, lake, args)
            print(f"gmlake-quota: {lake}: {' '.join(args)}: {(r.stdout or r.stderr).strip()}", flush=True)


def main():
    from kubernetes import client, config, watch  # the controller's only dependency (python3-kubernetes)

    node = os.environ["NODE_NAME"]  # the downward API's spec.nodeName
    rundir = os.environ.get("GMLAKE_RUN_DIR", "/run/gmlake")
    cgroot = os.environ.get("GMLAKE_CGROUP_ROOT", "/host/sys/fs/cgroup")
    config.load_incluster_config()
    v1 = client.CoreV1Api()
    while True:
        try:
            reconcile(v1, node, rundir, cgroot)
            # any change of a pod of this node reconciles again; a quiet minute too (a pod's cgroup made late)
            for _ in watch.Watch().stream(v1.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}",
                                          timeout_seconds=60):
                reconcile(v1, node, rundir, cgroot)
        except Exception as e:  # the API server or a daemon away for a while: try again
            print(f"gmlake-quota: {e}", file=sys.stderr, flush=True)
            time.sleep(5)


if __name__ == "__main__":
    main()
