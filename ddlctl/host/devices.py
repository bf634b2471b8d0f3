"""GPU numbering shared by the host agent (which sets each task's ``CUDA_VISIBLE_DEVICES``) and
the supervisor (which reads what each task's GPUs did): stdlib only, as the host agent is."""

from __future__ import annotations


def visible_devices(planned: str, given: str | None) -> str:
    """A task's ``CUDA_VISIBLE_DEVICES``: the plan numbers the GPUs the host gives ddlctl 0..N-1;
    where the agent itself was given a list (a Slurm step holding GPUs 2 and 3 of its node sets
    ``2,3``), plan index i is the i-th of that list, so a task never uses a GPU of another job."""
    if not planned or not given:
        return planned
    offered = [d.strip() for d in given.split(",") if d.strip()]
    try:
        return ",".join(offered[int(i)] for i in planned.split(","))
    except (ValueError, IndexError):
        return planned  # not plain indexes within the list: leave the plan's value
