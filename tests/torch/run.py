"""Runs tests/torch without pytest and prints one line per issue point:
    python3 tests/torch/run.py [name-substring...]
Exit status 0 only if every check that ran passed."""
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lake  # noqa: E402
import test_torch as T  # noqa: E402

POINTS = [("1 stats", "test_stats"), ("2 snapshot", "test_snapshot"), ("3 record_stream race", "test_record_stream_race"),
          ("3 (control: race seen w/o it)", "test_record_stream_race_control"),
          ("4 OOM", "test_oom"), ("5 empty_cache", "test_empty_cache"), ("6 torch.cuda.graph", "test_cuda_graph"),
          ("7 multiprocessing IPC", "test_multiprocessing_ipc"), ("8 memory fraction", "test_memory_fraction"),
          ("HF Trainer memory metrics", "test_hf_trainer"), ("6 compile reduce-overhead", "test_compile_reduce_overhead"),
          ("6 cudagraph trees checkpoint", "test_compile_checkpoint"),
          ("8 two GPUs in one process", "test_two_devices"), ("8 DDP, one process per GPU", "test_ddp"),
          ("32 IPC lake->torch spawn", "test_ipc_lake_to_torch_spawn"),
          ("32 IPC lake->torch forkserver", "test_ipc_lake_to_torch_forkserver"),
          ("32 IPC torch->lake spawn", "test_ipc_torch_to_lake_spawn"),
          ("32 IPC torch->lake forkserver", "test_ipc_torch_to_lake_forkserver"),
          ("32 IPC torch expandable->lake", "test_ipc_torch_expandable_to_lake"),
          ("32 IPC receiver dies", "test_ipc_receiver_dies"),
          ("32 IPC lake->lake forkserver", "test_ipc_lake_to_lake_forkserver"),
          ("32 mem_get_info (2 at once)", "test_mem_get_info"),
          ("29 planned placement (GMLAKE_PLAN)", "test_plan_training")]


def main():
    why = lake.torch_gpu()
    if why:
        print("tests/torch skipped:", why)
        return 0
    want = sys.argv[1:]
    rows, bad = [], 0
    for label, name in POINTS:
        if want and not any(w in name for w in want):
            continue
        cells = []
        for mode in lake.MODES:
            t0 = time.time()
            try:
                getattr(T, name)(mode)
                cells.append("pass (%.0fs)" % (time.time() - t0))
            except lake.Skip as e:
                cells.append("skip")
                print("---- %s [%s] skipped: %s" % (name, mode, e), flush=True)
            except Exception as e:  # noqa: BLE001
                bad += 1
                cells.append("FAIL")
                print("---- %s [%s] failed:\n%s" % (name, mode, "".join(traceback.format_exception_only(type(e), e))[-4000:]),
                      flush=True)
        rows.append((label, cells))
        print("%-28s %-14s %-14s" % (label, cells[0], cells[1]), flush=True)
    print("\n==== torch on the lake (issue 11)\n%-28s %-14s %-14s" % ("point", "embedded", "daemon"))
    for label, cells in rows:
        print("%-28s %-14s %-14s" % (label, cells[0], cells[1]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
