"""TensorBoard scalars of a run (``--tensorboard``): ``python -m ddlctl.report.tensorboard RUN_DIR``.

Written from the run folder at the end of a job (what the controller received: every task's step
records, every host's telemetry, the built-in workload's result), with TensorFlow's own summary
writer (run in a process of its own, so ddlctl never imports TensorFlow), under
``runs/<id>/profile/`` beside the profiler captures: ``tensorboard --logdir runs/<id>/profile``
shows both. One TensorBoard run per task (``worker-0``: ``step_time_s``, ``samples_per_s`` by
step; ``loss``, ``accuracy`` at its last step) and per host (``host-<label>``: ``cpu_util`` and,
per GPU, ``gpu<N>/util`` and ``gpu<N>/memory_used_bytes``, by sample, at the sample's time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from ddlctl.contract.rundir import PROFILE_DIR, TASK_RESULT, TASK_STEPS, TASKS_DIR, TELEMETRY_DIR
from ddlctl.report.hosts import read_telemetry
from ddlctl.report.stepfile import read_steps

#: The most points a series gets (TensorBoard keeps 1,000 scalars a series by default anyway).
MAX_POINTS = 10_000


def _thin(count: int) -> range:
    """Indices of at most :data:`MAX_POINTS` of ``count`` points, evenly spread."""
    return range(0, count, max(1, -(-count // MAX_POINTS)))


def write(run_dir: Path) -> list[str]:
    """Write the event files; the TensorBoard runs written."""
    import tensorflow as tf

    # what TensorBoard's own tf.summary.scalar writes (plugin "scalars", a scalar's data class),
    # through TensorFlow's summary op: the tensorboard package need not be installed
    scalars = tf.compat.v1.SummaryMetadata()
    scalars.plugin_data.plugin_name = "scalars"
    scalars.data_class = 1  # DATA_CLASS_SCALAR

    def scalar(tag: str, value: float, step: int) -> None:
        tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step, metadata=scalars)

    out = run_dir / PROFILE_DIR
    written = []
    for folder in sorted((run_dir / TASKS_DIR).glob("*")):
        steps = read_steps(folder / TASK_STEPS, folder.name.replace("-", ":", 1))
        if not steps.step:
            continue
        writer = tf.summary.create_file_writer(str(out / folder.name))
        with writer.as_default():
            for i in _thin(len(steps.step)):
                step, duration = int(steps.step[i]), float(steps.duration[i])
                scalar("step_time_s", duration / steps.block, step=step)
                if steps.samples[i] >= 0 and duration > 0:
                    scalar("samples_per_s", steps.samples[i] / duration, step=step)
            try:
                result = json.loads((folder / TASK_RESULT).read_text())
            except (OSError, ValueError):
                result = {}
            for key in ("loss", "accuracy"):
                if isinstance(result, dict) and isinstance(result.get(key), (int, float)):
                    scalar(key, float(result[key]), step=int(steps.step[-1]))
        writer.close()
        written.append(folder.name)
    for path in sorted((run_dir / TELEMETRY_DIR).glob("*.jsonl")):
        series = read_telemetry(path)
        if not len(series.cpu_t) and not series.gpus:
            continue
        writer = tf.summary.create_file_writer(str(out / f"host-{path.stem}"))
        with writer.as_default():
            for i in _thin(len(series.cpu_t)):
                scalar("cpu_util", float(series.cpu[i]) / 100, step=i)
            for index, gpu in sorted(series.gpus.items()):
                for name, key in (("util", "util"), ("memory_used_bytes", "mem_used")):
                    column = gpu.column(key)
                    for i in _thin(len(column)):
                        if not np.isnan(column[i]):
                            scalar(f"gpu{index}/{name}", float(column[i]) * (0.01 if key == "util" else 1),
                                              step=i)
        writer.close()
        written.append(f"host-{path.stem}")
    return written


def write_in_child(run_dir: Path, timeout_s: float = 300.0) -> str:
    """:func:`write` in a process of this interpreter's (TensorFlow imported there, not here); a
    sentence that says where the scalars are, or why there are none."""
    try:
        done = subprocess.run([sys.executable, "-m", "ddlctl.report.tensorboard", str(run_dir)], capture_output=True,
                              text=True, timeout=timeout_s, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no TensorBoard scalars: writing them failed ({exc})"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"no TensorBoard scalars: writing them failed ({last[:300]})"
    runs = json.loads(done.stdout.strip().splitlines()[-1]).get("runs", []) if done.stdout.strip() else []
    return (f"TensorBoard scalars of {len(runs)} task(s) and host(s): tensorboard --logdir {run_dir / PROFILE_DIR}"
            if runs else "no TensorBoard scalars: the run recorded no steps and no telemetry")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: python -m ddlctl.report.tensorboard RUN_DIR", file=sys.stderr)
        return 2
    written = write(Path(args[0]))
    print(json.dumps({"runs": written}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
