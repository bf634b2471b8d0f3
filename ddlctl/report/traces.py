"""TensorFlow Profiler captures read back (``--trace``): each task's capture gathered into one
logdir for XProf / TensorBoard, and its captured time split by what the task did (pure functions of
the run directory).

Layout: ``runs/<id>/profile/plugins/profile/steps-A-B/<task>.xplane.pb``, one session per capture
and one file per task, named by the task (``worker-1``), so ``xprof --logdir runs/<id>/profile``
shows every task's trace side by side. The files are hard links to (or copies of) what each task
kept in its folder (``tasks/<task>/capture.xplane.pb``), which came back with the task folders.
``--trace auto``'s captures are sessions ``auto-N-steps-A-B`` (``capture-auto-N.*`` in the task
folders, each record saying why ddlctl asked for it).

Decoding uses the XPlane protobuf TensorFlow ships (``tsl/profiler/protobuf/xplane_pb2.py``),
loaded from its file without importing TensorFlow; XProf's copy where TensorFlow is not installed.

The split of a task's captured wall time, each instant counted once, in this order: *compute* (a
TensorFlow op running on a compute thread or a device), *collective* (all-reduce and its kin, not
hidden behind compute), *ps rpc* (remote calls, tensors sent and received across tasks), *copies*
(host <-> device), *input* (the training loop waiting in ``IteratorGetNext`` for its batch), and
*idle* (nothing of the above: Python, dispatch, waiting on nothing TensorFlow names).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddlctl.contract.causes import Interval, clip, length, minus, union
from ddlctl.contract.faults import Cause
from ddlctl.contract.rundir import PROFILE_DIR, TASK_CAPTURE, TASKS_DIR

#: The parts of a captured step, in the order they claim time.
PARTS = ("compute", "collective", "ps_rpc", "copies", "input", "idle")
_COLLECTIVE = ("Collective", "AllReduce", "NcclAll", "AllGather", "ReduceScatter")
_RPC = ("_Recv", "_Send", "RemoteCall", "RecvTensor", "RunComponentFunction", "GrpcRemote")
_COPIES = ("Memcpy", "CopyToDevice", "CopyFromDevice", "_HostSend", "_HostRecv")
_INPUT = ("IteratorGetNext", "GetNextFromShard", "MultiDeviceIteratorGetNextFromShard")


@dataclass
class TaskTrace:
    """One task's capture, split."""

    task: str
    steps: tuple[int, int]
    wall_s: float
    parts: dict[str, float]  # part -> seconds of the capture's wall time
    top_ops: list[tuple[str, float]] = field(default_factory=list)  # op type -> seconds (compute threads)
    file: str = ""
    asked: tuple[int, int] | None = None  # the steps --trace asked for (``steps``: those it covered)
    session: str = ""  # the capture's session folder (``steps-30-40``, ``auto-1-steps-41-50``)
    rpc_peers: dict[str, float] = field(default_factory=dict)  # ps rpc seconds by the task at the other end

    def share(self, part: str) -> float:
        return self.parts.get(part, 0.0) / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {"task": self.task, "steps": list(self.steps), "asked": list(self.asked or self.steps),
                "wall_s": round(self.wall_s, 6),
                "parts": {k: round(v, 6) for k, v in self.parts.items()},
                "top_ops": [[name, round(s, 6)] for name, s in self.top_ops], "file": self.file,
                "session": self.session, "rpc_peers": {k: round(v, 6) for k, v in self.rpc_peers.items()}}


@functools.cache
def xplane_module():  # noqa: ANN201 - the generated protobuf module
    """TensorFlow's (else XProf's) ``xplane_pb2``, loaded without importing either; None if neither."""
    for package, relative in (("tensorflow", "tsl/profiler/protobuf/xplane_pb2.py"),
                              ("xprof", "protobuf/xplane_pb2.py")):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        path = Path(next(iter(spec.submodule_search_locations))) / relative
        if path.is_file():
            loader = importlib.util.spec_from_file_location(f"_ddlctl_xplane_{package}", path)
            module = importlib.util.module_from_spec(loader)  # type: ignore[arg-type]
            loader.loader.exec_module(module)  # type: ignore[union-attr]
            return module
    return None


def capture_records(folder: Path) -> list[dict]:
    """A task folder's capture records: ``--trace A-B``'s, then ``--trace auto``'s in order."""
    autos = sorted(folder.glob("capture-auto-*.json"), key=lambda p: (len(p.name), p.name))
    records = []
    for path in [folder / TASK_CAPTURE, *autos]:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and (path.name == TASK_CAPTURE or _plain_name(str(record.get("session")))):
            records.append(record)
    return records


def _plain_name(name: str) -> bool:
    return bool(name) and len(name) <= 100 and "/" not in name and not name.startswith(".")


def session_of(capture: dict) -> str | None:
    """The session folder of a capture record (None: a record without its steps)."""
    steps = capture.get("asked") or capture.get("steps") or [0, 0]
    try:
        named = f"steps-{int(steps[0])}-{int(steps[1])}"
    except (TypeError, ValueError, IndexError):
        return None
    return f"{capture['session']}-{named}" if capture.get("session") else named


def gather(run_dir: Path) -> list[tuple[str, dict, Path]]:
    """Link every task's captures into ``profile/plugins/profile/<session>/<task>.xplane.pb`` (a ps
    chief's folder also holds its servers' traces: ``servers``); (task, its capture record, the
    linked file) for each capture that has a trace file."""
    found = []
    for folder, capture in [(f, c) for f in sorted((run_dir / TASKS_DIR).glob("*")) for c in capture_records(f)]:
        session = session_of(capture)
        if session is None:
            continue
        target = run_dir / PROFILE_DIR / "plugins" / "profile" / session
        captures = [(folder.name, capture.get("file"), capture)]
        servers = capture.get("servers")
        if isinstance(servers, dict):  # (the servers' traces span the chief's remote trace)
            window = {"start_s": capture.get("servers_start_s"), "end_s": capture.get("servers_end_s"),
                      "steps": capture.get("asked")}  # (traced for as long as the asked steps take)
            captures += [(str(task).replace(":", "-"), name, {**capture, **window}) for task, name in servers.items()]
        for name, file, record in captures:
            if not isinstance(file, str) or "/" in file or not file.endswith(".xplane.pb") \
                    or not (folder / file).is_file() or "/" in name or name.startswith("."):
                continue
            target.mkdir(parents=True, exist_ok=True)
            linked = target / f"{name}.xplane.pb"
            if not linked.exists():
                try:
                    os.link(folder / file, linked)
                except OSError:
                    shutil.copyfile(folder / file, linked)
            found.append((name.replace("-", ":", 1), record, linked))
    return found


def split(task: str, capture: dict, space: object) -> TaskTrace:
    """The capture's wall time split into :data:`PARTS` (``space``: a decoded XSpace)."""
    spans: dict[str, list[Interval]] = {part: [] for part in PARTS[:-1]}
    ops: dict[str, float] = {}
    peers: dict[str, float] = {}
    first, last = float("inf"), float("-inf")
    for plane in space.planes:  # type: ignore[attr-defined]
        device = plane.name.startswith("/device:")
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        for line in plane.lines:
            compute_line = device or line.name.startswith(("tf_Compute", "tf_XLA", "collective_ops"))
            base = line.timestamp_ns / 1e9
            for event in line.events:
                name = names.get(event.metadata_id, "")
                start = base + event.offset_ps / 1e12
                end = start + event.duration_ps / 1e12
                first, last = min(first, start), max(last, end)
                part = _part_of(name, compute_line)
                if part is None:
                    continue
                spans[part].append((start, end))
                if part == "ps_rpc":  # (a tensor sent or received: its rendezvous key names both ends)
                    peer = _rpc_peer(task, event, stat_names)
                    if peer:
                        peers[peer] = peers.get(peer, 0.0) + end - start
                if part == "compute":
                    kind = name.rpartition(":")[2]  # (the op's type: "scope/name:Type")
                    ops[kind] = ops.get(kind, 0.0) + end - start
    start_s, end_s = capture.get("start_s"), capture.get("end_s")
    if isinstance(start_s, (int, float)) and isinstance(end_s, (int, float)) and end_s > start_s:
        # times in the file count from the profiler's start (epoch nanoseconds in older files)
        window = (start_s, end_s) if first > 1e9 else (0.0, end_s - start_s)
    else:
        window = (first, last) if last > first else (0.0, 0.0)
    claimed: list[Interval] = []
    parts: dict[str, float] = {}
    for part in PARTS[:-1]:
        mine = minus(union(clip(spans[part], window)), claimed)
        claimed = union([*claimed, *mine])
        parts[part] = length(mine)
    wall = window[1] - window[0]
    parts["idle"] = max(0.0, wall - sum(parts.values()))
    steps = capture.get("steps") or capture.get("asked") or [0, 0]
    asked = capture.get("asked") or steps
    top = sorted(ops.items(), key=lambda kv: -kv[1])[:5]
    return TaskTrace(task, (int(steps[0]), int(steps[1])), wall, parts, top, asked=(int(asked[0]), int(asked[1])),
                     rpc_peers=dict(sorted(peers.items(), key=lambda kv: -kv[1])))


def _rpc_peer(task: str, event: object, stat_names: dict[int, str]) -> str | None:
    """The task at the other end of a ``_Send``/``_Recv`` (``worker:1``), from its ``key`` stat
    (``/job:worker/replica:0/task:1/device:CPU:0;<incarnation>;/job:ps/...;edge...``); None if unsaid."""
    for stat in event.stats:  # type: ignore[attr-defined]
        if stat_names.get(stat.metadata_id) != "key":
            continue
        text = stat_names.get(stat.ref_value, "") if stat.ref_value else stat.str_value
        ends = [_task_of(device) for device in text.split(";")[:3:2]]
        others = [end for end in ends if end and end != task]
        return others[0] if others else None
    return None


def _task_of(device: str) -> str | None:
    """``/job:ps/replica:0/task:1/device:CPU:0`` -> ``ps:1``."""
    fields = dict(part.split(":", 1) for part in device.split("/") if ":" in part)
    return f"{fields['job']}:{fields['task']}" if "job" in fields and "task" in fields else None


def _part_of(name: str, compute_line: bool) -> str | None:
    """Which part an event is (None: none: a framework event, or an op off the compute threads)."""
    if any(marker in name for marker in _INPUT):
        return "input"
    if "::" in name and not name.startswith("Iterator"):  # (framework TraceMe: ExecutorState::Process ...)
        return None
    if any(marker in name for marker in _COLLECTIVE):
        return "collective"
    if any(marker in name for marker in _RPC):
        return "ps_rpc"
    if any(marker in name for marker in _COPIES):
        return "copies"
    if compute_line and ":" in name:  # an op: "scope/name:Type"
        return "compute"
    return None


def capture_problems(run_dir: Path, asked: Sequence[int] | None, programs: Sequence[str]) -> list[str]:
    """What went wrong with ``--trace`` (``asked``: its steps; ``programs``: the training tasks), a
    sentence each: a capture TensorFlow refused, a ps chief that could not reach its servers'
    profilers, a trace that did not come back, a task that never reached the steps."""
    problems = []
    for task in programs:
        folder = run_dir / TASKS_DIR / task.replace(":", "-")
        records = capture_records(folder)
        if asked and not any(not r.get("session") for r in records) and (folder / "steps.jsonl").exists():
            problems.append(f"{task}: nothing captured (it recorded no step {asked[0] - 1} while tracing was "
                            f"asked for steps {asked[0]}-{asked[1]}: fewer steps, or steps it does not record)")
        for capture in records:
            who = f"{task} ({capture['session']})" if capture.get("session") else task
            if capture.get("error"):
                problems.append(f"{who}: nothing captured ({str(capture['error'])[:300]})")
            elif isinstance(capture.get("file"), str) and not (folder / capture["file"]).is_file():
                problems.append(f"{who}: its trace did not come back ({capture['file']} is not in {folder})")
            if capture.get("servers_error"):
                problems.append(f"{who} could not trace the servers' profilers ({str(capture['servers_error'])[:300]}):"
                                " their traces are missing (a profiler port taken by another process?)")
    return problems


def read_traces(run_dir: Path) -> tuple[list[TaskTrace], list[str]]:
    """Every task's capture split (gathered first), and what could not be read, a sentence each."""
    gathered = gather(run_dir)
    if not gathered:
        return [], []
    module = xplane_module()
    if module is None:
        return [], ["the traces cannot be read here: install TensorFlow (or 'ddlctl[profile]') to decode them"]
    traces, notes = [], []
    for task, capture, path in gathered:
        space = module.XSpace()
        try:
            space.ParseFromString(path.read_bytes())
        except Exception:  # noqa: BLE001 - (google.protobuf.message.DecodeError: a damaged file)
            notes.append(f"{task}: its trace {path.relative_to(run_dir)} cannot be decoded (damaged)")
            continue
        trace = split(task, capture, space)
        trace.file, trace.session = str(path.relative_to(run_dir)), path.parent.name
        traces.append(trace)
    return traces, notes


#: A task whose captured time waits for input this much (and twice a typical peer's) is input-bound.
INPUT_BOUND_SHARE = 0.2


def compare(traces: Sequence[TaskTrace]) -> str | None:
    """What sets one worker's capture apart from a typical peer's (workers with workers; without
    two of them, tasks of one role): input-bound (its share waiting for
    input at least :data:`INPUT_BOUND_SHARE` and twice the peer's), else clearly slower steps (1.2x:
    the part it spends most more on)."""
    workers = [t for t in traces if t.task.startswith("worker:")]  # (peers: tasks of one role)
    traces = workers if len(workers) >= 2 else traces
    if len(traces) < 2 or len({t.task.partition(":")[0] for t in traces}) > 1:
        return None
    hungry = max(traces, key=lambda t: t.share("input"))
    peers = sorted((t for t in traces if t is not hungry), key=lambda t: t.share("input"))
    peer = peers[(len(peers) - 1) // 2]
    if hungry.share("input") >= INPUT_BOUND_SHARE and hungry.share("input") >= 2 * peer.share("input"):
        waits = max(("collective", "ps_rpc"), key=peer.share)
        why = f" (which waits in {waits.replace('_', ' ')} {peer.share(waits):.0%}: for it)" \
            if peer.share(waits) >= INPUT_BOUND_SHARE else ""
        return (f"{hungry.task} is input-bound in its capture: {hungry.share('input'):.0%} of its time waits for "
                f"input, against {peer.share('input'):.0%} on {peer.task}{why}")

    def per_step(trace: TaskTrace) -> float:
        return trace.wall_s / max(1, trace.steps[1] - trace.steps[0] + 1)

    ranked = sorted(traces, key=per_step)
    slow, typical = ranked[-1], ranked[(len(ranked) - 1) // 2]
    ratio = per_step(slow) / max(1e-9, per_step(typical))
    if ratio < 1.2:  # in lockstep every step lasts as long: who computes while the others wait for it
        busy = max(traces, key=lambda t: t.share("compute"))
        peers = sorted((t for t in traces if t is not busy), key=lambda t: t.share("compute"))
        peer = peers[(len(peers) - 1) // 2]
        waits = max(("collective", "ps_rpc"), key=peer.share)
        if busy.share("compute") < 1.5 * peer.share("compute") or peer.share(waits) < INPUT_BOUND_SHARE:
            return None
        return (f"{busy.task} holds the others up in its capture: it computes {busy.share('compute'):.0%} of its "
                f"time against {peer.share('compute'):.0%} on {peer.task}, which waits in "
                f"{waits.replace('_', ' ')} {peer.share(waits):.0%}: for it (a slower or busier machine)")
    part = max(PARTS, key=lambda p: slow.share(p) - typical.share(p))
    return (f"{slow.task}'s captured steps are {ratio:.1f}x longer than {typical.task}'s: {slow.share(part):.0%} of "
            f"its time is {part.replace('_', ' ')} against {typical.share(part):.0%} on {typical.task}")


def traces_section(run_dir: Path, plan: dict, outcome: dict | None = None) -> dict | None:
    """``summary.json``'s ``traces``: the captures gathered under ``profile/`` and split, each
    session's comparison (``captures``; ``comparison``: ``--trace A-B``'s), and what went wrong
    (None: nothing was asked and nothing captured)."""
    asked = (plan.get("request") or {}).get("trace")
    asked = asked if isinstance(asked, list) and len(asked) == 2 else None
    programs = [str(t.get("name")) for t in plan.get("tasks", []) if t.get("kind") == "program" and t.get("name")]
    traces, notes = read_traces(run_dir)
    crashed = [e for e in (outcome or {}).get("restarts") or [] if isinstance(e, dict)
               and e.get("cause") == Cause.PROFILER_CRASH]
    crashes = {str(t) for e in crashed for t in [e.get("task"), *(e.get("tasks") or [])]}  # (untraced since)
    notes = [*(f"{e.get('task')}: TensorFlow's profiler crashed it ({e.get('detail')}): ddlctl started "
               f"{', '.join(map(str, e.get('tasks') or []))} again with tracing off; the capture is lost"
               for e in crashed),
             *capture_problems(run_dir, asked, [t for t in programs if t not in crashes]), *notes]
    autos = [e for e in (outcome or {}).get("auto_traces") or [] if isinstance(e, dict)]
    captures = []
    for session in dict.fromkeys(t.session for t in traces):
        mine = [t for t in traces if t.session == session]
        event = next((e for e in autos if session.startswith(f"{e.get('session')}-steps-")), None)
        captures.append({"session": session, "why": event.get("why") if event else None,
                         "reason": event.get("reason") if event else None, "task": event.get("task") if event else None,
                         "tasks": [t.task for t in mine], "comparison": compare(mine)})
    for event in autos:
        came = {t.task for t in traces if t.session.startswith(f"{event.get('session')}-")}
        missing = [str(t) for t in event.get("asked") or [] if t not in came and t not in crashes]
        if missing:
            notes.append(f"trace auto asked {', '.join(missing)} for a capture ({event.get('why')}), and none came "
                         "back: " + ("it ended, or was ended, before its profiler stopped" if event.get("reason") ==
                                     "near-hang" else "the task recorded no step after it was asked (it ended, "
                                     "or hung)"))
    if not traces and not notes:
        return None
    manual = [t for t in traces if not t.session.startswith("auto-")]
    return {"logdir": str(run_dir / PROFILE_DIR), "tasks": [t.to_dict() for t in traces],
            "comparison": compare(manual), "captures": captures, "notes": notes}
