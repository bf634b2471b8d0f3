"""TensorFlow's import with the ml_dtypes ddlctl installs (held below 0.7 in ``pyproject.toml``) and
with ml_dtypes 0.7.0, side by side in one run (by hand; not part of CI).

ml_dtypes 0.7.0's extension module spends most of a second of CPU in its own import (0.6.0 a few
hundredths): a quarter of every TensorFlow import, so of every zygote, every task started without
one and every restart. Rounds alternate the two, each a fresh interpreter that imports TensorFlow
and leaves at once (``os._exit``, as ddlctl's tasks do); 0.7.0 is fetched with ``pip download``
(a package index must be reachable) and put first on ``PYTHONPATH``.

Printed: the median wall and CPU seconds of each and their ratio.

    .venv/bin/python benchmarks/ml_dtypes_import.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

IMPORT = "import os, tensorflow, ml_dtypes; print(ml_dtypes.__version__, flush=True); os._exit(0)"


def fetch(version: str, into: Path) -> Path:
    """ml_dtypes ``version`` unpacked in a folder of ``into`` (to put on ``PYTHONPATH``)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    f"ml_dtypes=={version}", "-d", str(into)], check=True)
    wheel = next(into.glob(f"ml_dtypes-{version}-*.whl"))
    folder = into / version
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(folder)
    return folder


def one_import(path: Path | None) -> tuple[str, float, float]:
    """(ml_dtypes version, wall s, CPU s) of one interpreter importing TensorFlow."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if path is not None:
        env["PYTHONPATH"] = str(path)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", IMPORT], env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return done.stdout.split()[-1], wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--other", default="0.7.0", help="the ml_dtypes version to compare with")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        other = fetch(args.other, Path(tmp))
        figures: dict[str, list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            for path in (None, other):
                version, wall, cpu = one_import(path)
                figures.setdefault(version, []).append((wall, cpu))
    medians = {v: (statistics.median(w for w, _ in f), statistics.median(c for _, c in f)) for v, f in figures.items()}
    for version, (wall, cpu) in medians.items():
        print(f"ml_dtypes {version}: import tensorflow {wall:.2f} s wall, {cpu:.2f} CPU-s (median of {args.rounds})")
    if len(medians) == 2:
        (held, (wall_a, cpu_a)), (_, (wall_b, cpu_b)) = medians.items()
        print(f"{args.other} / {held}: wall {wall_b / wall_a:.2f}x, CPU {cpu_b / cpu_a:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
