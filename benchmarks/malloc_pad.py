"""glibc's malloc as ddlctl sets it for tasks (``MALLOC_TOP_PAD_``: 64 MiB of freed memory kept at the
top of each heap) vs glibc's default (free memory over 128 KiB handed back to the kernel), side by
side in one run (by hand; not part of CI).

Each round runs the built-in workload (``python -m ddlctl.workloads``, one process, this machine's
CPU) once per setting, alternating which goes first, for each model. Per run: wall time, CPU time
(user and kernel, the run's own ``wait4`` figures), minor page faults and peak memory (max RSS). Printed:
the medians per model and setting, and the default / ddlctl ratios.

    .venv/bin/python benchmarks/malloc_pad.py --rounds 3 --steps 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddlctl.host.tasks import MALLOC_SETTINGS, keep_freed_memory  # noqa: E402


def environments() -> dict[str, dict[str, str]]:
    """glibc's default (no malloc setting) and what a ddlctl host agent gives a task."""
    plain = {k: v for k, v in os.environ.items() if k not in MALLOC_SETTINGS and k != "GLIBC_TUNABLES"}
    plain["TF_CPP_MIN_LOG_LEVEL"] = "3"
    ddlctl = dict(plain)
    keep_freed_memory(ddlctl)
    return {"glibc default": plain, "ddlctl": ddlctl}


def run(model: str, steps: int, env: dict[str, str]) -> dict[str, float]:
    """One run of the built-in workload: wall s, user s, kernel s, page faults, max RSS MiB."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "ddlctl.workloads", "--workload", model, "--steps", str(steps)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(proc.pid, 0)  # this run's own figures
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"the {model} workload failed: exit code {proc.returncode}")
    return {"wall s": wall, "user s": usage.ru_utime, "kernel s": usage.ru_stime, "page faults": usage.ru_minflt,
            "max RSS MiB": usage.ru_maxrss / 1024}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--models", default="mlp,cnn,deep", help="built-in workloads, comma-separated")
    args = parser.parse_args()
    envs = environments()
    figures: dict[tuple[str, str], list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        order = list(envs) if round_ % 2 == 0 else list(reversed(envs))
        for model in args.models.split(","):
            for name in order:
                figures.setdefault((model, name), []).append(run(model, args.steps, envs[name]))
                print(f"round {round_ + 1} {model:5s} {name:13s} {figures[(model, name)][-1]}", flush=True)
    keys = ("wall s", "user s", "kernel s", "page faults", "max RSS MiB")
    print(f"\nmedians of {args.rounds} round(s), {args.steps} steps each (ratio: glibc default / ddlctl)")
    print(f"{'model':6s} {'setting':14s} " + " ".join(f"{k:>12s}" for k in keys))
    for model in args.models.split(","):
        medians = {name: {k: statistics.median(r[k] for r in figures[(model, name)]) for k in keys} for name in envs}
        for name in envs:
            print(f"{model:6s} {name:14s} " + " ".join(f"{medians[name][k]:12.1f}" for k in keys))
        ratio = {k: medians["glibc default"][k] / medians["ddlctl"][k] if medians["ddlctl"][k] else float("nan")
                 for k in keys}
        print(f"{model:6s} {'ratio':14s} " + " ".join(f"{ratio[k]:11.2f}x" for k in keys))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
