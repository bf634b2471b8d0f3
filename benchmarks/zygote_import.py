"""A zygote's import of TensorFlow with the cyclic garbage collector on (as before) and as
``ddlctl.task.zygote.preload`` does it now (collector off during the import, then what is left
frozen), side by side in one run (by hand; not part of CI).

Rounds alternate the two ways, each in a fresh interpreter (interleaved, so that both see the
machine alike). Per round and way:

* import: the CPU-seconds of the import itself (``time.process_time`` around it, the collection
  and freeze after it included) and of the whole interpreter (``RUSAGE_CHILDREN``: start and exit
  too);
* forked task: a child forked after the import that makes 200,000 objects of its own and runs a
  full collection, as a task's collector eventually does: that collection's CPU time and the pages
  the child then has to itself (``Private_Dirty`` of ``/proc/self/smaps_rollup``, grown since the
  fork: each page of the zygote's it wrote was copied);
* a forked task that runs one TensorFlow op and ends as a program does, through Python's shutdown
  (whose collections went over everything the import made): its CPU-seconds.

(``process_s`` includes both forked tasks: they are the interpreter's children, waited for.)

Printed: each figure's median per way and the ratio before / now.

    .venv/bin/python benchmarks/zygote_import.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import gc, json, os, sys, time
sys.path.insert(0, sys.argv[2])
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
os.environ["TF_USE_LEGACY_KERAS"] = "1"

def private_dirty():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Private_Dirty:"):
            return int(line.split()[1]) * 1024
    return 0

start = time.process_time()
if sys.argv[1] == "before":
    import tensorflow
    import tf_keras
else:
    from ddlctl.task.zygote import preload
    preload()
imported = time.process_time() - start
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    before = private_dirty()
    kept = [{"i": i} for i in range(200_000)]  # a task's own objects
    t = time.process_time()
    gc.collect()
    collect = time.process_time() - t
    os.write(write, json.dumps({"collect_s": collect, "copied_bytes": private_dirty() - before}).encode())
    os._exit(0)
os.waitpid(pid, 0)
os.close(write)
child = json.loads(os.read(read, 1 << 16))
import resource
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
pid = os.fork()
if pid == 0:  # a task that does a little and ends as a program does: Python's own shutdown
    import tensorflow as tf
    tf.reduce_sum(tf.ones((3, 3))).numpy()
    sys.exit(0)
os.waitpid(pid, 0)
after = resource.getrusage(resource.RUSAGE_CHILDREN)
exit_s = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
print(json.dumps({"import_s": imported, **child, "task_exit_s": exit_s}), flush=True)
os._exit(0)  # (a zygote ends so)
"""


def one(way: str) -> dict[str, float]:
    """One fresh interpreter importing ``way`` ("before" or "now"): its figures."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", CHILD, way, str(ROOT)], capture_output=True, text=True,
                          check=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["process_s"] = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    found: dict[str, list[dict[str, float]]] = {"before": [], "now": []}
    for r in range(args.rounds):
        for way in ("before", "now") if r % 2 == 0 else ("now", "before"):
            found[way].append(one(way))
            print(f"round {r + 1} {way:6} " + " ".join(f"{k} {v:.3g}" for k, v in found[way][-1].items()), flush=True)
    print(f"\nmedians over {args.rounds} rounds (before: collector on; now: zygote.preload)")
    for key, unit in (("import_s", "CPU-s"), ("process_s", "CPU-s"), ("collect_s", "CPU-s"), ("copied_bytes", "MiB"),
                      ("task_exit_s", "CPU-s")):
        before = statistics.median(f[key] for f in found["before"])
        now = statistics.median(f[key] for f in found["now"])
        scale = 2**20 if unit == "MiB" else 1
        ratio = f"{before / now:.2f}" if now else "inf"
        print(f"  {key:13} before {before / scale:8.3f} {unit}   now {now / scale:8.3f} {unit}   before/now {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
