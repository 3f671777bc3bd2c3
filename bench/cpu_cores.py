"""bench/cpu_cores.py: how fast each core of this machine runs torch_bench's CPU probe (a fixed
pure-Python loop), pinned to that core, ROUNDS rounds over all cores; prints each core's median
and spread. The trainings of `accept:W` are bound by Python's kernel launches, and their runs
differ by up to 1.7x in this probe: this tells whether the slow runs are slow cores (then
GMLAKE_BENCH_CPUS=LO-HI on the fast ones makes runs comparable) or slow moments.
  python3 bench/cpu_cores.py [ROUNDS]"""
import os, statistics, sys

from torch_bench import core_speeds


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    cores = sorted(os.sched_getaffinity(0))
    res = {c: [] for c in cores}
    for _ in range(rounds):
        for c, v in core_speeds(60, skip=10).items():
            res[c].append(v)
    for c in cores:
        r = res[c]
        print("core %3d: probe median %7.1f us  (rounds %s)" % (c, statistics.median(r), " ".join("%.0f" % x for x in r)))
    meds = [statistics.median(res[c]) for c in cores]
    print("cores: %d, probe %.0f-%.0f us (fastest/slowest %.2fx)" % (len(cores), min(meds), max(meds), max(meds) / min(meds)))


if __name__ == "__main__":
    main()
