"""Helpers of the torch suite: each check runs in a child Python (gmlake.enable()
must come before CUDA is initialized, and a daemon's limit or a memory fraction
must not leak into the next check), embedded or through a gmlaked this module
starts. The child prints one JSON line "RESULT {...}" that the check asserts on."""
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(REPO, os.environ.get("BUILD", "build"))
MODES = ("embedded", "daemon")
sys.path.insert(0, os.path.join(REPO, "python"))


def torch_gpu():
    """None when torch and a GPU are here, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no GPU"
    try:
        import gmlake._C  # noqa: F401
    except ImportError as e:
        return "gmlake._C is not built (pip install --no-build-isolation ./python): %s" % e
    return None


class Skip(Exception):
    """A check that cannot run here (e.g. it needs two GPUs)."""


def skip(why):
    """pytest's skip under pytest; Skip under tests/torch/run.py, which catches it (run56: pytest's
    Skipped, an exception run.py did not know, stopped its table at the two-GPU checks)."""
    if os.environ.get("PYTEST_CURRENT_TEST"):
        import pytest
        pytest.skip(why)
    raise Skip(why)


def gpu_count():
    import torch
    return torch.cuda.device_count()


class Daemon:
    def __init__(self, *extra, dir=None, name="lake"):
        self.own_dir = dir is None
        self.dir = dir or tempfile.mkdtemp(prefix="gmlake-torch-")
        self.sock = os.path.join(self.dir, name + ".sock")
        self.ctl = "ipc://" + os.path.join(self.dir, name + ".ctl")
        self.log = open(os.path.join(self.dir, name + ".log"), "w")
        self.proc = subprocess.Popen(
            [os.path.join(BUILD, "gmlaked"), "--backend", "cuda", "--socket", self.sock, "--control", self.ctl,
             "--log-level", "warn"] + list(extra), stdout=self.log, stderr=subprocess.STDOUT)
        t0, self.last_ctl = time.time(), None
        while time.time() - t0 < 30:
            if os.path.exists(self.sock) and self.ctlstats() is not None:
                if time.time() - t0 > 2:
                    print("gmlaked came up after %.1f s" % (time.time() - t0), file=sys.stderr, flush=True)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        # say what was seen: run53 (H100) failed here with an empty log and nothing more to go on
        r, status = self.last_ctl, self.proc.poll()
        if status is None:
            self.proc.kill()
            self.proc.wait()
        raise RuntimeError("gmlaked did not come up in %.1f s: exit status %s, socket %s, last `gmlakectl stats --json`: %s; "
                           "its log: %s" % (time.time() - t0, "running (killed now)" if status is None else status,
                                           "exists" if os.path.exists(self.sock) else "missing",
                                           "not run" if r is None else "rc %d, stdout %r, stderr %r" % (
                                               r.returncode, r.stdout[:200], r.stderr[-500:]),
                                           open(self.log.name).read()[-3000:]))

    def ctlstats(self):
        r = subprocess.run([os.path.join(BUILD, "gmlakectl"), "--control", self.ctl, "stats", "--json"],
                           capture_output=True, text=True)
        self.last_ctl = r
        return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        self.log.close()
        if self.own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


class Daemons:
    """One gmlaked per GPU, sockets gmlake-N.sock in one directory: .sock is
    the GMLAKE_SOCKET pattern (%d stands for the device)."""

    def __init__(self, n, *extra):
        self.dir = tempfile.mkdtemp(prefix="gmlake-torch-")
        self.all = []
        try:
            for d in range(n):
                self.all.append(Daemon("--device", str(d), *extra, dir=self.dir, name="gmlake-%d" % d))
        except Exception:
            self.stop()
            raise
        self.sock = os.path.join(self.dir, "gmlake-%d.sock")

    def stop(self):
        for d in self.all:
            d.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


_shared = None


def shared_daemon():
    global _shared
    if _shared is None:
        _shared = Daemon()
        atexit.register(_shared.stop)
    return _shared


PRELUDE = """
import faulthandler, json, os, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)  # run() asks for the stacks of a check that timed out
import torch, gmlake
if os.environ["GMLAKE_TEST_MODE"] != "torch":  # "torch": PyTorch's own allocator (a control)
    gmlake.enable(mode=os.environ["GMLAKE_TEST_MODE"])
def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
"""


_sessions = set()  # the process groups of checks running now


def _on_term(signum, frame):
    """SIGTERM (bench/gpu.sh's `timeout` ends the suite so): the checks' sessions are not in the group
    that timeout signals, so they are killed here before this process goes."""
    for pg in list(_sessions):
        try:
            os.killpg(pg, signal.SIGKILL)
        except OSError:
            pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _stop_group(p):
    """A check that ran past its time: every Python process of its session (the check, its
    torch.multiprocessing children, a fork server) prints its threads' stacks (SIGUSR1, PRELUDE's
    faulthandler), then the session is killed; what they wrote until then."""
    out, err = "", ""
    for sig, wait in ((signal.SIGUSR1, 3), (signal.SIGKILL, 10)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            out, err = p.communicate(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    else:  # a descendant that left the session still holds the pipes
        for f in (p.stdout, p.stderr):
            f.close()
        p.wait()
    return out or "", err or ""


def run(mode, code, daemon=None, env=None, timeout=300, args=()):
    """Run code (after PRELUDE) in a child on the lake; its RESULT dict. The child runs in a session
    of its own: past timeout it and every process it started (receivers of torch.multiprocessing)
    print their stacks and are killed, and the failure carries what they wrote (a check that waits
    for ever cannot hold the suite, nor leave processes behind on the GPU)."""
    e = dict(os.environ)
    e["GMLAKE_TEST_MODE"] = mode
    e["PYTHONUNBUFFERED"] = "1"
    e["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("GMLAKE_LOG", "warn")
    if mode == "daemon":
        e["GMLAKE_SOCKET"] = (daemon or shared_daemon()).sock
    e.update(env or {})
    src = PRELUDE + textwrap.dedent(code)
    fd, path = tempfile.mkstemp(prefix="gmlake_check_", suffix=".py")  # a file: spawned children import it
    with os.fdopen(fd, "w") as f:
        f.write(src)
    try:
        if (threading.current_thread() is threading.main_thread() and
                signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
            signal.signal(signal.SIGTERM, _on_term)
        p = subprocess.Popen([sys.executable, "-X", "faulthandler", path] + list(args), env=e, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        _sessions.add(p.pid)
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = p.poll()
            stdout, stderr = _stop_group(p)
            raise AssertionError("child timed out after %d s (%s); the stacks of its processes, then killed:\n%s\n%s" % (
                timeout, "it was still running" if rc is None else
                "it had exited with %d, but a process it started held its output open" % rc,
                stdout[-3000:], stderr[-12000:]))
        except BaseException:
            _stop_group(p)
            raise
        finally:
            _sessions.discard(p.pid)
    finally:
        os.unlink(path)
    lines = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise AssertionError("child failed (rc %d):\n%s\n%s" % (p.returncode, stdout[-3000:], stderr[-6000:]))
    return json.loads(lines[-1][7:])
