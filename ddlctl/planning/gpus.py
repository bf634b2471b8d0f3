"""Which tasks share a GPU with another task of the job on their host.

TensorFlow maps nearly all of a GPU's memory into the first process that initialises it (unless
memory growth is on: ``TF_FORCE_GPU_ALLOW_GROWTH=true``), so a second TensorFlow process on the
same GPU finds almost none left (tensorflow#3644). A plan gives workers disjoint
``CUDA_VISIBLE_DEVICES`` where it can, but a ps chief, a model chief and an evaluator see every GPU
of their host, workers outnumbering a host's GPUs share them round-robin, and on a host whose GPUs
are not declared (``gpus=`` absent) every task sees whatever GPUs there
are. Those tasks grow their GPU memory as they need it instead. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The environment variable that turns on TensorFlow's GPU memory growth in every process.
GROWTH_VAR = "TF_FORCE_GPU_ALLOW_GROWTH"


def visible(host_gpus: int, gpus: tuple[int, ...] | None) -> frozenset[int] | None:
    """The GPU ids a task sees: its own (``CUDA_VISIBLE_DEVICES``), or all of its host's; None
    when that is every GPU of a host whose GPUs are not counted."""
    if gpus is not None:
        return frozenset(gpus)
    return frozenset(range(host_gpus)) if host_gpus else None


def sharing_a_gpu(tasks: Iterable[tuple[str, str, int, tuple[int, ...] | None]]) -> set[str]:
    """The names of the tasks that may see a GPU another task on their host sees. ``tasks``:
    (name, host, the host's GPU count (0: not declared), the task's GPU ids or None: all)."""
    by_host: dict[str, list[tuple[str, frozenset[int] | None]]] = {}
    for name, host, host_gpus, gpus in tasks:
        by_host.setdefault(host, []).append((name, visible(host_gpus, gpus)))
    shared: set[str] = set()
    for seen in by_host.values():
        for i, (name, mine) in enumerate(seen):
            for other, theirs in seen[:i] + seen[i + 1:]:
                if _overlap(mine, theirs):
                    shared.update((name, other))
    return shared


def _overlap(a: frozenset[int] | None, b: frozenset[int] | None) -> bool:
    if a is None or b is None:  # (every GPU, if any, against a task that sees at least one)
        return (a is None or bool(a)) and (b is None or bool(b))
    return bool(a & b)
