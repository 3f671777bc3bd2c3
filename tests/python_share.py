"""gmlake.share / attach / dedup across processes, on a host-backend daemon
(run by tests/run.sh where python has torch; a CPU build is enough).

  python_share.py BUILD        starts gmlaked, then the roles below as processes
  python_share.py ROLE SOCKET  one process: publish | attach | dedup
Each role builds the same small model (publish and dedup from seed 0, attach from
seed 1: its own weights are replaced), prints the checksum of its output on a
fixed input, and waits for a line on stdin before it exits."""
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def role(name, sock):
    os.environ["GMLAKE_SOCKET"] = sock
    os.environ["GMLAKE_MODE"] = "daemon"
    import torch
    import gmlake
    torch.manual_seed(1 if name == "attach" else 0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 1000), torch.nn.GELU(), torch.nn.Linear(1000, 640))
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(7))
    if name == "publish":
        gmlake.share(m, "tiny-model")
    elif name == "attach":
        gmlake.attach(m, "tiny-model")
    else:
        print("deduped", gmlake.dedup(m), flush=True)
    with torch.no_grad():
        y = m(x)
    print("out %.6f" % y.double().sum().item(), flush=True)
    # a write to a parameter, from a child: the mapping is read-only
    pid = os.fork()
    if pid == 0:
        with torch.no_grad():
            m[0].weight[0, 0] = 1.0
        os._exit(0)
    _, st = os.waitpid(pid, 0)
    print("write", "fault" if os.WIFSIGNALED(st) and os.WTERMSIG(st) in (signal.SIGSEGV, signal.SIGBUS) else "wrote",
          flush=True)
    sys.stdin.readline()
    with torch.no_grad():  # still readable until the end
        print("out %.6f" % m(x).double().sum().item(), flush=True)


def main(build):
    d = tempfile.mkdtemp(prefix="gmlake-pyshare.")
    sock, ctl = os.path.join(d, "s"), "ipc://" + os.path.join(d, "c")
    daemon = subprocess.Popen([os.path.join(build, "gmlaked"), "--backend", "host", "--socket", sock, "--control", ctl,
                               "--limit", "256MiB", "--prefetch", "0", "--log-level", "warn"])

    def stats():
        out = subprocess.run([os.path.join(build, "gmlakectl"), "--control", ctl, "stats", "--json"],
                             capture_output=True, text=True).stdout
        import json
        return json.loads(out) if out.strip() else None

    for _ in range(100):
        if stats():
            break
        time.sleep(0.05)
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(HERE), "python"))

    def start(r):
        p = subprocess.Popen([sys.executable, __file__, r, sock], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=env)
        return p

    try:
        pub = start("publish")
        out_pub = pub.stdout.readline().split()
        assert out_pub[0] == "out", out_pub
        assert pub.stdout.readline().split() == ["write", "fault"], "the publisher could write its shared weights"
        st = stats()
        assert st["shares"] == 1 and st["chunks_shared"] >= 2, st
        att = start("attach")
        out_att = att.stdout.readline().split()
        assert out_att == out_pub, ("attached weights give another output", out_att, out_pub)
        assert att.stdout.readline().split() == ["write", "fault"]
        ded = start("dedup")
        assert ded.stdout.readline().split() == ["deduped", "True"]
        assert ded.stdout.readline().split() == out_pub
        assert ded.stdout.readline().split() == ["write", "fault"]
        shared = stats()["chunks_shared"]
        assert shared == st["chunks_shared"], ("dedup or attach made another copy", shared, st)
        leased = stats()["chunks_leased"]
        pub.kill()  # SIGKILL: the others still map the chunks
        pub.wait()
        time.sleep(0.2)
        assert stats()["chunks_shared"] == shared
        for p in (att, ded):
            p.stdin.write("\n")
            p.stdin.flush()
            assert p.stdout.readline().split() == out_pub
            p.stdin.close()
            assert p.wait() == 0
        for _ in range(100):
            if stats()["chunks_shared"] == 0:
                break
            time.sleep(0.05)
        assert stats()["chunks_shared"] == 0 and stats()["shares"] == 0, stats()
        print("  share/attach/dedup (torch %s, cpu, host daemon): one copy for 3 processes (%d chunks, %d leased), "
              "same outputs, writes fault, freed after the last exits: ok" % (__import__("torch").__version__, shared, leased))
    finally:
        daemon.terminate()
        daemon.wait()
        subprocess.run(["rm", "-rf", d])


if __name__ == "__main__":
    if len(sys.argv) == 3:
        role(sys.argv[1], sys.argv[2])
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "build")
