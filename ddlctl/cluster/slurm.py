"""The cluster of a Slurm allocation: its nodes, their addresses, tasks, CPUs and GPUs.

Read from the job's environment (``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``, ``SLURM_TASKS_PER_NODE``,
``SLURM_JOB_CPUS_PER_NODE``) and two ``scontrol`` calls (``show job -d`` for the GPUs each node
holds, ``show node -o`` for each node's ``NodeAddr``). The parsing is pure and tested on its own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ddlctl.cluster.model import Cluster, Host
from ddlctl.contract.errors import ConfigError, LaunchError

_RANGE = re.compile(r"^(\d+)-(\d+)$")
_REPEAT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
_GPUS = re.compile(r"(?:^|,)gpu(?::[^:(,]+)?:(\d+)")


@dataclass(frozen=True)
class Node:
    """One node of the allocation as the job holds it."""

    name: str
    address: str  # NodeAddr (what the cluster spec uses; may differ from the name)
    tasks: int  # tasks of the job on this node (worker slots)
    cpus: int  # CPUs of the job on this node
    gpus: int  # GPUs of the job on this node


@dataclass(frozen=True)
class Allocation:
    """A Slurm job that ddlctl runs inside."""

    job_id: str
    nodes: tuple[Node, ...]

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets: ``"a[1-2,4],b"`` -> ``["a[1-2,4]", "b"]``."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (s.strip() for s in parts) if p]


def expand_hostlist(expression: str) -> list[str]:
    """Slurm's compact host list, expanded in order: ``"n[01-03,7],gpu1"`` -> ``["n01", "n02", "n03",
    "n7", "gpu1"]`` (zero padding kept; several bracket groups in one name expand as a product)."""
    names: list[str] = []
    for part in _split_top(expression):
        open_at = part.find("[")
        if open_at < 0:
            names.append(part)
            continue
        close_at = part.find("]", open_at)
        if close_at < 0:
            raise ValueError(f"unbalanced '[' in host list {expression!r}")
        prefix, inner, rest = part[:open_at], part[open_at + 1:close_at], part[close_at + 1:]
        tails = expand_hostlist(rest) if rest else [""]
        for item in inner.split(","):
            match = _RANGE.match(item.strip())
            if match:
                low, high = match.groups()
                width = len(low) if low.startswith("0") else 0
                values = [str(v).zfill(width) for v in range(int(low), int(high) + 1)]
            elif item.strip().isdigit():
                values = [item.strip()]
            else:
                raise ValueError(f"cannot read {item!r} in host list {expression!r}")
            names.extend(prefix + value + tail for value in values for tail in tails)
    return names


def expand_counts(text: str) -> list[int]:
    """Slurm's per-node counts: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in _split_top(text):
        match = _REPEAT.match(item)
        if not match:
            raise ValueError(f"cannot read {item!r} in {text!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def parse_node_addresses(scontrol_nodes: str) -> dict[str, str]:
    """``scontrol show node -o`` output -> node name -> NodeAddr."""
    addresses: dict[str, str] = {}
    for line in scontrol_nodes.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "NodeName" in fields:
            addresses[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return addresses


def parse_job_gpus(scontrol_job: str) -> dict[str, int]:
    """``scontrol show job -d`` output -> node name -> GPUs the job holds there (the per-node
    ``Nodes=... GRES=gpu:2(IDX:0-1)`` lines; nodes without GPUs are left out)."""
    gpus: dict[str, int] = {}
    for line in scontrol_job.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "Nodes" not in fields or "CPU_IDs" not in fields:
            continue
        count = sum(int(m.group(1)) for m in _GPUS.finditer(fields.get("GRES", "")))
        for name in expand_hostlist(fields["Nodes"]):
            if count:
                gpus[name] = count
    return gpus


def allocation_from(env: Mapping[str, str], scontrol_job: str, scontrol_nodes: str) -> Allocation:
    """The allocation described by a job's environment and its ``scontrol`` output (pure)."""
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        raise ConfigError("--slurm: not inside a Slurm allocation (SLURM_JOB_ID is not set)",
                          "run ddlctl inside salloc or an sbatch script, or let ddlctl submit the job: ddlctl submit")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    try:
        names = expand_hostlist(nodelist)
        tasks = expand_counts(env["SLURM_TASKS_PER_NODE"]) if env.get("SLURM_TASKS_PER_NODE") else []
        cpus = expand_counts(env["SLURM_JOB_CPUS_PER_NODE"]) if env.get("SLURM_JOB_CPUS_PER_NODE") else []
    except ValueError as exc:
        raise ConfigError(f"--slurm: cannot read job {job_id}'s environment: {exc}") from None
    if not names:
        raise ConfigError(f"--slurm: job {job_id} has no node list (SLURM_JOB_NODELIST is empty)")
    addresses = parse_node_addresses(scontrol_nodes)
    gpus = parse_job_gpus(scontrol_job)
    nodes = tuple(Node(name=name, address=addresses.get(name, name),
                       tasks=tasks[i] if i < len(tasks) else 1,
                       cpus=cpus[i] if i < len(cpus) else 1,
                       gpus=gpus.get(name, 0)) for i, name in enumerate(names))
    return Allocation(job_id=str(job_id), nodes=nodes)


Runner = Callable[[Sequence[str]], str]


def scontrol(argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 30.0) -> str:
    """Run ``scontrol ARGS``; its output, or a :class:`LaunchError` that says what failed."""
    try:
        done = subprocess.run(["scontrol", *argv], capture_output=True, text=True, timeout=timeout,
                              env=dict(env) if env is not None else None)
    except FileNotFoundError:
        raise LaunchError("--slurm: scontrol is not on PATH (is this a Slurm node?)",
                          "run ddlctl where the Slurm client commands are installed") from None
    except subprocess.TimeoutExpired:
        raise LaunchError(f"--slurm: scontrol {' '.join(argv)} did not answer within {timeout:g}s "
                          "(is slurmctld reachable?)") from None
    if done.returncode != 0:
        raise LaunchError(f"--slurm: scontrol {' '.join(argv)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def job_state(job_id: str, env: Mapping[str, str] | None = None, timeout: float = 30.0) -> tuple[str, str, str]:
    """(JobState, Reason, ExitCode) of a job; ``("GONE", "", "")`` once Slurm has forgotten it."""
    try:
        text = scontrol(["show", "job", job_id], env, timeout)
    except LaunchError as exc:
        if "Invalid job id" in exc.message:
            return "GONE", "", ""
        raise
    fields = dict(f.split("=", 1) for f in text.split() if "=" in f)
    return fields.get("JobState", "UNKNOWN"), fields.get("Reason", ""), fields.get("ExitCode", "")


def describe_job_end(job_id: str, state: str) -> str:
    """``"Slurm job 12 is CANCELLED (scancel)"`` for a job that has ended."""
    why = {"CANCELLED": " (scancel)", "TIMEOUT": " (its --time limit was reached)", "GONE": " (Slurm forgot it)",
           "NODE_FAIL": " (a node failed)", "PREEMPTED": " (preempted by another job)"}.get(state, "")
    return f"Slurm job {job_id} is {state}{why}"


def read_allocation(env: Mapping[str, str] | None = None, run: Runner | None = None) -> Allocation:
    """The allocation ddlctl runs inside (``salloc`` / ``sbatch``), asked of Slurm."""
    env = os.environ if env is None else env
    run = run or (lambda argv: scontrol(argv, env))
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        allocation_from(env, "", "")  # raises the "not inside an allocation" error
    job = run(["show", "job", "-d", str(job_id)])
    if "JobState=RUNNING" not in job:
        state = re.search(r"JobState=(\S+)", job)
        raise LaunchError(f"--slurm: job {job_id} is not running ({state.group(1) if state else 'unknown state'})",
                          "start ddlctl inside a running allocation (salloc, sbatch)")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    nodes = run(["show", "node", "-o", nodelist]) if nodelist else ""
    return allocation_from(env, job, nodes)


def allocation_cluster(allocation: Allocation, python: str | None = None) -> Cluster:
    """The allocation as a ddlctl cluster: one host per node (its NodeAddr in the cluster spec, its
    job tasks as worker slots, its job GPUs). Tasks run ``python`` (default: the interpreter that
    runs ddlctl, which Slurm clusters usually share between nodes)."""
    hosts = tuple(Host(name=n.name, address=n.address if n.address != n.name else None, slots=max(1, n.tasks),
                       gpus=n.gpus, python=python or sys.executable,
                       source=f"Slurm job {allocation.job_id}, node {n.name}") for n in allocation.nodes)
    return Cluster(hosts=hosts, source=f"Slurm job {allocation.job_id}")
