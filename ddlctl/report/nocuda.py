"""Tasks whose TensorFlow found no CUDA on a host that has GPUs: why those GPUs sat idle.

A TensorFlow without its CUDA libraries (``pip install tensorflow`` where the GPU build is
``tensorflow[and-cuda]``) prints "Could not find cuda drivers on your machine, GPU will not be used"
at start-up (or "Cannot dlopen some GPU libraries ... Skipping registering GPU devices" once it
sets up its devices) and trains on the CPU. On a CPU host that line is noise, and the console leaves it out
(:mod:`ddlctl.diagnose.tfnoise`); on a host whose GPUs NVML counted, or that declares ``gpus=``, it is
the reason they sat idle, and the report says so. Pure but for reading the head of each task's log.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddlctl.cluster.model import host_label

#: TensorFlow's words (TF 2.21, verbatim in its library): the CUDA runtime not found, at import (on
#: this project's CPU hosts too); GPU libraries not loaded when its devices are set up.
NO_CUDA = re.compile(rb"Could not find cuda drivers on your machine, GPU will not be used"
                     rb"|Cannot dlopen some GPU libraries")
#: How much of a log's head is read: the line comes while TensorFlow is imported.
HEAD_BYTES = 256 * 1024


def said_no_cuda(log: Path) -> str | None:
    """TensorFlow's no-CUDA words in the head of ``log`` (a task's output.log), or None."""
    try:
        with open(log, "rb") as handle:
            found = NO_CUDA.search(handle.read(HEAD_BYTES))
    except OSError:
        return None
    return found.group(0).decode() if found else None


def no_cuda_line(without: Sequence[tuple[str, str, str]], host_gpus: Mapping[str, int]) -> str | None:
    """The report's line for the tasks of ``without`` (task, host, TensorFlow's words) on hosts
    with GPUs (``host_gpus``: host -> GPUs NVML counted there, else those its hosts-file line
    declares), or None when none of them is on such a host."""
    idle = [(task, host, words) for task, host, words in without if host_gpus.get(host, 0) > 0]
    if not idle:
        return None
    hosts = sorted({host for _, host, _ in idle})
    gpus = ", ".join(f"{host}: {host_gpus[host]}" for host in hosts)
    tasks = ", ".join(f"{task} on {host}" for task, host, _ in idle)
    return (f"TensorFlow found no CUDA and trained on the CPU in {tasks} (\"{idle[0][2]}\"), though "
            f"{'its host has' if len(hosts) == 1 else 'their hosts have'} "
            f"GPUs ({gpus}): that TensorFlow lacks its CUDA libraries: `pip install 'tensorflow[and-cuda]'` into the "
            "tasks' Python there (`nvidia-smi` shows the driver; `python -c \"import tensorflow as tf; "
            "print(tf.config.list_physical_devices('GPU'))\"` what TensorFlow sees)")


def run_no_cuda_line(run_dir: Path, plan: dict, nvml_gpus: Mapping[str, int]) -> str | None:
    """:func:`no_cuda_line` for a run: its tasks' logs, the GPUs NVML counted per host
    (``nvml_gpus``), else those the plan's hosts declare."""
    declared = {host_label(str(h.get("name")), h.get("user"), h.get("port", 22)): int(h.get("gpus") or 0)
                for h in plan.get("cluster", {}).get("hosts", [])}
    counts = {**declared, **{host: n for host, n in nvml_gpus.items() if n}}
    said = {t["name"]: (t.get("host", ""), said_no_cuda(run_dir / "tasks" / t["name"].replace(":", "-") / "output.log"))
            for t in plan.get("tasks", [])}
    return no_cuda_line([(task, host, words) for task, (host, words) in said.items() if words], counts)

