"""``trace.json`` in Chrome Trace Event Format (opens in Perfetto / chrome://tracing).

A process per host, a thread per task, a complete ("X") event per step record, counter ("C")
events for each GPU's utilisation and memory and for host CPU, and global instant ("i") events for
each fault, restart and lost connection; checkpoint saves and evaluations (``ddlctl.phase``) as
complete events on their task's thread, and the job's start-up and restart downtimes on a "job"
track. Built from the run directory alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ddlctl.contract.errors import ConfigError
from ddlctl.contract.rundir import OUTCOME_FILE, PLAN_FILE, TASK_PHASES, TASK_STEPS
from ddlctl.contract.runfolder import read_last, read_record, task_dirs
from ddlctl.contract.telemetry import GPU_FIELDS, gpu_reading
from ddlctl.report.clocks import clock_offsets, shift_phases, shift_steps
from ddlctl.report.faults import summarize_restarts
from ddlctl.report.stepfile import parse_json_lines, read_phases, read_steps


def build_trace(run_dir: str | Path) -> dict[str, object]:
    """The trace as a JSON-ready dict ``{"traceEvents": [...], "displayTimeUnit": "ms"}``."""
    run_dir = Path(run_dir)
    try:
        plan = json.loads(read_record(run_dir / PLAN_FILE))
    except (OSError, ValueError, ConfigError):
        plan = {}
    host_of = {t["name"]: t["host"] for t in plan.get("tasks", [])}
    try:
        outcome = json.loads(read_record(run_dir / OUTCOME_FILE))
    except (OSError, ValueError, ConfigError):
        outcome = {}
    offsets = clock_offsets(outcome)  # hosts whose clocks differ: their times on this machine's
    pids: dict[str, int] = {}
    events: list[dict[str, object]] = []

    def pid_for(host: str) -> int:
        if host not in pids:
            pids[host] = len(pids) + 1
            events.append({"ph": "M", "name": "process_name", "pid": pids[host], "tid": 0,
                           "args": {"name": host}})
        return pids[host]

    starts: dict[str, Sequence[int]] = {}  # task -> its step records' starts (epoch us)
    for tid, folder in enumerate(task_dirs(run_dir), start=1):
        steps = read_steps(folder / TASK_STEPS, folder.name.replace("-", ":", 1))
        if not steps.step:
            continue
        shift_steps(steps, offsets.get(host_of.get(steps.name, ""), 0.0))
        starts[steps.name] = steps.start_us
        pid = pid_for(host_of.get(steps.name, "unknown host"))
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": steps.name}})
        phases = shift_phases(read_phases(folder / TASK_PHASES), offsets.get(host_of.get(steps.name, ""), 0.0))
        for name, spans in phases.items():  # checkpoint saves, evaluations
            events.extend({"ph": "X", "name": name, "cat": "phase", "pid": pid, "tid": tid, "ts": int(start * 1e6),
                           "dur": round((end - start) * 1e6, 1)} for start, end in spans)
        for step, start, duration, samples, input_s in zip(steps.step, steps.start_us, steps.duration,
                                                           steps.samples, steps.input_s, strict=True):
            args: dict[str, object] = {"step": step}
            if samples >= 0:
                args["samples"] = samples
            if input_s >= 0:
                args["input_ms"] = round(input_s * 1e3, 3)
            events.append({"ph": "X", "name": "step", "cat": "step", "pid": pid, "tid": tid, "ts": start,
                           "dur": round(duration * 1e6, 1), "args": args})
    for path in sorted((run_dir / "telemetry").glob("*.jsonl")):
        records, _ = parse_json_lines(read_last(path)[0])  # one pass: host name, then counters
        hello = next((r for r in records if isinstance(r, dict) and r.get("type") == "hello"), {})
        pid = pid_for(str(hello.get("host", path.stem)))
        off_us = int(offsets.get(str(hello.get("host", path.stem)), 0.0) * 1e6)
        fields = list(hello.get("gpu_fields") or GPU_FIELDS)
        for raw in records:
            if not isinstance(raw, dict) or raw.get("type") != "sample" or raw.get("t") is None:
                continue
            ts = int(float(raw["t"]) * 1e6) - off_us
            if raw.get("cpu") is not None:
                events.append({"ph": "C", "name": "CPU %", "pid": pid, "ts": ts, "args": {"cpu": raw["cpu"]}})
            for gpu in (gpu_reading(g, fields) for g in raw.get("gpus", ())):
                if gpu.get("util") is not None:
                    events.append({"ph": "C", "name": f"GPU {gpu['index']} util %", "pid": pid, "ts": ts,
                                   "args": {"util": gpu["util"]}})
                if gpu.get("mem_used") is not None:
                    events.append({"ph": "C", "name": f"GPU {gpu['index']} memory GiB", "pid": pid,
                                   "ts": ts, "args": {"used": round(gpu["mem_used"] / 2**30, 3)}})
    for event in outcome.get("restarts", []):  # global instant events: a fault, then its restart
        pid = pid_for(str(event.get("host") or "unknown host"))
        events.append({"ph": "i", "s": "g", "name": f"fault: {event.get('task')} ({event.get('cause')})",
                       "pid": pid, "tid": 0, "ts": int(float(event["time"]) * 1e6),
                       "args": {"detail": event.get("detail"), "action": event.get("action")}})
        if event.get("restarted_at"):
            events.append({"ph": "i", "s": "g", "name": f"restart: {', '.join(event.get('tasks', []))}",
                           "pid": pid, "tid": 0, "ts": int(float(event["restarted_at"]) * 1e6),
                           "args": {"scope": event.get("scope")}})
    events.extend(_job_phases(outcome, starts, pid_for))
    for lost in outcome.get("hosts_lost", []):
        if lost.get("time"):
            events.append({"ph": "i", "s": "g", "name": f"connection lost: {lost.get('host')}",
                           "pid": pid_for(str(lost.get("host"))), "tid": 0, "ts": int(float(lost["time"]) * 1e6),
                           "args": {"reason": lost.get("reason")}})
    for change in outcome.get("membership", []):
        if change.get("time"):
            events.append({"ph": "i", "s": "g", "name": f"membership: {len(change.get('workers', []))} worker(s)",
                           "pid": pid_for(str(change.get("host") or "unknown host")), "tid": 0,
                           "ts": int(float(change["time"]) * 1e6),
                           "args": {"left": change.get("left"), "why": change.get("why")}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _job_phases(outcome: dict, starts: dict[str, Sequence[int]], pid_for) -> list[dict[str, object]]:  # noqa: ANN001
    """The job's own phases on a "job" track: start-up (ddlctl's start to the first step) and each
    restart's downtime (as the report counts it: the fault until a restarted task steps, or listens,
    again)."""
    spans = []
    first = min((s[0] / 1e6 for s in starts.values() if s), default=None)
    if outcome.get("started_at") and first is not None and first > outcome["started_at"]:
        spans.append(("start-up", float(outcome["started_at"]), first))
    for restart in summarize_restarts(outcome.get("restarts", []), (), (), starts):
        if restart.downtime_s is not None:
            spans.append((f"restart downtime: {restart.task} ({restart.cause})", restart.time,
                          restart.time + restart.downtime_s))
    if not spans:
        return []
    pid = pid_for("job (ddlctl)")
    return [{"ph": "X", "name": name, "cat": "job", "pid": pid, "tid": 0, "ts": int(start * 1e6),
             "dur": round((end - start) * 1e6, 1)} for name, start, end in spans]


def write_trace(run_dir: str | Path, path: str | Path) -> Path:
    """Build and write the trace; the path written."""
    path = Path(path)
    with path.open("w") as handle:
        json.dump(build_trace(run_dir), handle, separators=(",", ":"))
    return path
