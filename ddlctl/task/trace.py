"""TensorFlow Profiler captures at step boundaries (``ddlctl profile --trace A-B``).

ddlctl asks for a capture through the task's environment (``DDLCTL_TRACE_STEPS=A-B``). Every
path that records steps (``ddlctl.step``, the ``model.fit`` hook, the built-in workload, the
pipeline loop) goes through :meth:`ddlctl.task.steps.StepRecorder.record`, which calls
:meth:`Capture.after` with the steps just recorded: once the task has recorded step ``A - 1`` the
profiler starts (``tf.profiler.experimental.start`` into ``$DDLCTL_TASK_DIR/profile``), and once it
has recorded step ``B`` it stops; the trace moves up to ``capture.xplane.pb`` in the task folder
and ``capture.json`` says what was captured (the steps, the wall-clock span, the file). Steps
recorded in blocks: a block's steps that began before the start are not counted as captured (the
capture then runs to the end of a block that began after it). Aligned on the task's own step
counter, not on the clock, so every task captures the same steps however far apart they run.

``DDLCTL_TRACE_STEPS=auto`` (``--trace auto``, ``profile``'s default): no capture until ddlctl asks
for one while the task runs (:class:`AutoCapture`): its host agent writes ``trace-request.json`` in
the task folder (``{"id": n, "from": a, "steps": k, "seconds": s, "why": "..."}``), which the task
looks at, at most twice a second, after a recorded step; the capture then starts after step
``a - 1`` (the steps ddlctl asks of every task it captures: they run them about together), or after
the next step when the task is past it, and stops after ``k`` steps or at the first step boundary
past ``s`` seconds, into ``capture-auto-<n>.json`` / ``capture-auto-<n>.xplane.pb``. A request with
``"now": true`` (a task near its hang threshold: it may record no step again) starts at once and
stops after ``s`` seconds, whatever the steps. One thread looks for requests (``ddlctl-trace``).

Nothing here imports TensorFlow: a program that has not imported it (a PyTorch one) is not
captured, and says so once in ``capture.json``. A capture that TensorFlow refuses (another profiler
session running) is recorded as refused; training goes on either way.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading
import time

from ddlctl.contract import envvars
from ddlctl.contract.rundir import TASK_CAPTURE, TASK_PROFILING, TASK_TRACE_DIR, TASK_TRACE_REQUEST

#: Seconds past its stop a ps chief waits for its servers' traces to come back.
REMOTE_WAIT_S = 15.0
#: The shortest time a ps chief traces its servers (seconds).
SERVERS_MIN_S = 2.0
#: A task's capture, moved to its folder's top level (a remote task's folder comes back without subfolders).
CAPTURE_FILE = "capture.xplane.pb"
#: How often (seconds, at most) an ``--trace auto`` task looks for a request, and the longest one.
LOOK_S = 0.5
AUTO_STEPS_MAX = 1000
AUTO_SECONDS_MAX = 300.0


def parse_steps(text: str) -> tuple[int, int]:
    """``"A-B"`` or ``"A"`` -> (A, B), steps counted from 1; ValueError with what to give otherwise."""
    first, dash, last = text.strip().partition("-")
    try:
        start, end = int(first), int(last) if dash else int(first)
    except ValueError:
        raise ValueError(f"{text!r}: give the steps to capture as A-B (e.g. 100-110) or one step A; or auto, "
                         "or off") from None
    if start < 1 or end < start:
        raise ValueError(f"{text!r}: steps count from 1 and the last is not before the first (e.g. 100-110)")
    return start, end


def file_prefix(name: str) -> str:
    """The start of a capture's file names: ``capture`` (``--trace A-B``), ``capture-auto-3``."""
    return f"capture-{name}" if name else "capture"


class Capture:
    """One capture over steps ``first``..``last`` of this task, into ``folder`` (``name``: an
    ``--trace auto`` capture's, e.g. ``auto-1``, with ``why`` ddlctl asked for it)."""

    def __init__(self, first: int, last: int, folder: str, servers: dict[str, str] | None = None,
                 name: str = "", why: str = "", seconds: float | None = None,
                 asked: tuple[int, int] | None = None) -> None:
        self.first, self.last, self.folder = first, last, folder
        self.asked = list(asked or (first, last))  # (an auto capture's: the steps ddlctl asked for)
        self.name, self.why, self.prefix = name, why, file_prefix(name)
        self.deadline = time.monotonic() + seconds if seconds else None  # (stops at a step boundary past it)
        self.seconds = seconds
        self.state = "waiting"  # -> "tracing" -> "done" | "refused" | "not TensorFlow"
        self.began: tuple[int, float] | None = None  # (the first step after the start, epoch s)
        self.servers = dict(servers or {})  # a ps chief: server task -> "host:port" of its profiler
        self.step_s: list[float] = []  # the last steps' durations (how long a remote trace should run)
        self.remote: threading.Thread | None = None
        self.remote_record: dict = {}

    @classmethod
    def from_env(cls) -> Capture | AutoCapture | None:
        """The capture ddlctl asked this task for, if any (a bad value asks for none)."""
        text, task_dir = os.environ.get(envvars.TRACE_STEPS), os.environ.get(envvars.TASK_DIR)
        if not text or not task_dir:
            return None
        try:
            servers = json.loads(os.environ.get(envvars.PROFILER_ADDRESSES) or "{}")
            servers = {str(k): str(v) for k, v in servers.items()} if isinstance(servers, dict) else {}
            if text == "auto":
                return AutoCapture(task_dir, servers)
            first, last = parse_steps(text)
        except ValueError:
            return None
        return cls(first, last, os.path.join(task_dir, TASK_TRACE_DIR), servers)

    def after(self, step: int, steps: int = 1, started: float | None = None, duration_s: float | None = None) -> None:
        """Steps ``step``..``step + steps - 1`` (begun at ``started``, epoch s) were just recorded:
        start or stop the capture. The first step captured is the first that began after the start
        (a block's later steps, recorded after the start, ran before it)."""
        reached = step + steps - 1
        if duration_s is not None and self.servers:
            self.step_s = [*self.step_s[-19:], duration_s / max(1, steps)]
        if self.state == "waiting" and reached >= self.first - 1 and (reached < self.last or self.name):
            # (an auto capture starts at the next step whatever its block: it runs one block at least)
            self._start(reached + 1)
        elif self.state == "tracing":
            if self.began is not None and started is not None and started < self.began[1] - 1e-4:
                self.began = (reached + 1, self.began[1])
                if self.name:  # (an auto capture counts its steps from the first it covers)
                    self.first, self.last = reached + 1, reached + 1 + self.last - self.first
            past = self.deadline is not None and time.monotonic() >= self.deadline
            if reached >= (self.began[0] if self.began else 0) and (reached >= self.last or past):  # (1 step at least)
                self._stop(reached)

    def marker(self, step: int):  # noqa: ANN201 - a context manager
        """While tracing, step ``step``'s marker in the trace (XProf's step-time view counts the
        ``train`` events with their ``step_num``); nothing otherwise."""
        if self.state != "tracing":
            return contextlib.nullcontext()
        return sys.modules["tensorflow"].profiler.experimental.Trace("train", step_num=step, _r=1)

    def _start(self, next_step: int) -> None:
        tf = sys.modules.get("tensorflow")
        if tf is None:
            self.state = "not TensorFlow"
            self._write({"error": "the program had not imported TensorFlow: nothing to capture"})
            return
        try:
            os.makedirs(self.folder, exist_ok=True)
            tf.profiler.experimental.start(self.folder)
        except Exception as exc:  # noqa: BLE001 - (tf.errors.AlreadyExistsError: another session)
            self.state = "refused"
            self._write({"error": f"TensorFlow refused to start its profiler: {type(exc).__name__}: {exc}"[:500]})
            return
        self.state = "tracing"
        self.began = (next_step, time.time())
        if self.name:
            self.first, self.last = next_step, next_step + self.last - self.first
        self._profiling(f"{self.name}-steps-{self.first}-{self.last}".lstrip("-"))
        if self.servers:  # the ps servers, traced from here over about as long as the steps take
            # (half as long again, and SERVERS_MIN_S at least: the chief's steps are records of
            # closures the workers ran in their own time, and a loaded worker can run none in a
            # second; client.trace cannot be stopped early)
            usual = sorted(self.step_s)[len(self.step_s) // 2] if self.step_s else 0.05
            predicted = (self.last - next_step + 1) * usual * 1.5
            duration_ms = int(min(60_000, max(SERVERS_MIN_S * 1000, predicted * 1000 + 200)))
            if self.seconds and self.last - self.first >= AUTO_STEPS_MAX:  # (a capture "now": for its seconds)
                duration_ms = int(self.seconds * 1000)
            self.remote = threading.Thread(target=self._trace_servers, args=(tf, duration_ms), daemon=True)
            self.remote.start()

    def _stop(self, reached: int) -> None:
        tf = sys.modules["tensorflow"]
        ended = time.time()
        try:
            tf.profiler.experimental.stop()
        except Exception as exc:  # noqa: BLE001
            self._profiling(None)
            self.state = "refused"
            self._write({"error": f"TensorFlow could not stop its profiler: {type(exc).__name__}: {exc}"[:500]})
            return
        self._profiling(None)
        self.state = "done"
        made = sorted(_sessions(self.folder))  # (the folder is removed once its trace is kept: this one alone)
        assert self.began is not None
        if self.remote is not None:
            self.remote.join(timeout=REMOTE_WAIT_S)
        self._write({**self.remote_record, "steps": [self.began[0], reached], "asked": self.asked,
                     "start_s": round(self.began[1], 6), "end_s": round(ended, 6),
                     "file": _keep(self.folder, made[-1], f"{self.prefix}.xplane.pb") if made else None})

    def _trace_servers(self, tf, duration_ms: int) -> None:  # noqa: ANN001 - the tensorflow module
        """Trace every server's profiler (``client.trace``) into ``capture-<task>.xplane.pb`` files."""
        folder = os.path.join(os.path.dirname(self.folder), "profile-servers")
        began = time.time()
        try:
            tf.profiler.experimental.client.trace(",".join(f"grpc://{a}" for a in self.servers.values()), folder,
                                                  duration_ms)
        except Exception as exc:  # noqa: BLE001 - (tf.errors.UnavailableError: a profiler not reached)
            self.remote_record = {"servers_error": f"{type(exc).__name__}: {exc}"[:500]}
            return
        kept: dict[str, str] = {}
        for session in _sessions(folder):
            for task, address in self.servers.items():
                written = os.path.join(folder, "plugins", "profile", session, address.replace(":", "_") + ".xplane.pb")
                name = f"{self.prefix}-{task.replace(':', '-')}.xplane.pb"
                with contextlib.suppress(OSError):
                    os.replace(written, os.path.join(os.path.dirname(self.folder), name))
                    kept[task] = name
        with contextlib.suppress(OSError):
            shutil.rmtree(folder)
        self.remote_record = {"servers": kept, "servers_start_s": round(began, 6),
                              "servers_end_s": round(began + duration_ms / 1000, 6)}

    def _profiling(self, session: str | None) -> None:
        """Say in the task folder that the profiler captures (``session``) or no longer does (None):
        a task killed by a signal meanwhile was crashed by TensorFlow's profiler (its host agent
        tells ddlctl, which starts it again once with tracing off)."""
        path = os.path.join(os.path.dirname(self.folder), TASK_PROFILING)
        with contextlib.suppress(OSError):
            if session is None:
                os.unlink(path)
                return
            with open(f"{path}.tmp", "w") as handle:
                json.dump({"session": session, "since": round(time.time(), 3)}, handle)
            os.replace(f"{path}.tmp", path)

    def _write(self, record: dict) -> None:
        path = os.path.join(os.path.dirname(self.folder), f"{self.prefix}.json" if self.name else TASK_CAPTURE)
        named = {"session": self.name, "why": self.why} if self.name else {}
        with contextlib.suppress(OSError):
            with open(f"{path}.tmp", "w") as handle:
                json.dump({"asked": self.asked, **named, **record}, handle)
            os.replace(f"{path}.tmp", path)


class AutoCapture:
    """``--trace auto``: the captures ddlctl asks of this running task (see the module's words).
    The same calls as :class:`Capture`'s, made by :class:`~ddlctl.task.steps.StepRecorder`; a
    thread (``watch``) looks for requests: a step capture waits for the next recorded step, a
    capture "now" starts and stops on that thread."""

    def __init__(self, task_dir: str, servers: dict[str, str] | None = None, watch: bool = True) -> None:
        self.task_dir, self.servers = task_dir, dict(servers or {})
        self.current: Capture | None = None
        self.taken: set[int] = set()  # the requests already acted on
        self.seen: tuple[int, int] | None = None  # the request file's (mtime ns, size) last read
        self.step_s: list[float] = []
        self.reached = 0  # the highest step recorded
        self.pending: tuple[int, int | None, int, float, str, bool] | None = None  # a step request not begun
        self.lock = threading.Lock()  # (captures begin and end on either thread)
        if watch:
            threading.Thread(target=self._watch, name="ddlctl-trace", daemon=True).start()

    @property
    def state(self) -> str:
        return self.current.state if self.current is not None else "idle"

    def after(self, step: int, steps: int = 1, started: float | None = None, duration_s: float | None = None) -> None:
        """Steps were recorded: the capture under way goes on (or stops); else a request waiting begins."""
        with self.lock:
            reached = step + steps - 1
            self.reached = max(self.reached, reached)
            if self.current is not None and self.current.state in ("waiting", "tracing"):
                self.current.after(step, steps, started, duration_s)
                return
            if duration_s is not None and self.servers:
                self.step_s = [*self.step_s[-19:], duration_s / max(1, steps)]
            if self.pending is None:
                return
            (ident, start, count, seconds, why, _), self.pending = self.pending, None
            first = max(start or 0, reached + 2)
            self.current = Capture(first, first + count - 1, os.path.join(self.task_dir, TASK_TRACE_DIR),
                                   self.servers, name=f"auto-{ident}", why=why, seconds=seconds,
                                   asked=(start, start + count - 1) if start else None)
            self.current.step_s = list(self.step_s)

    def marker(self, step: int):  # noqa: ANN201 - a context manager
        current = self.current
        return current.marker(step) if current is not None else contextlib.nullcontext()

    def look(self) -> None:
        """One look for a request: a step capture is left for :meth:`after`; one "now" runs here."""
        request = self._request()
        if request is None:
            return
        ident, _, _, seconds, why, now = request
        if not now:
            with self.lock:
                self.pending = request
            return
        with self.lock:
            if self.current is not None and self.current.state in ("waiting", "tracing"):
                return  # (one profiler session at a time)
            at = self.reached + 1
            capture = Capture(at, at + AUTO_STEPS_MAX, os.path.join(self.task_dir, TASK_TRACE_DIR), self.servers,
                              name=f"auto-{ident}", why=why, seconds=seconds, asked=(at, at))
            capture.step_s = list(self.step_s)
            self.current = capture
            capture._start(at)
        time.sleep(seconds)
        with self.lock:
            if capture.state == "tracing":  # (no step boundary came past its deadline)
                capture._stop(self.reached)

    def _watch(self) -> None:
        while True:
            time.sleep(LOOK_S)
            with contextlib.suppress(Exception):  # (never the task's end: a capture is a bonus)
                self.look()

    def _request(self) -> tuple[int, int | None, int, float, str, bool] | None:
        """A request not acted on yet: (id, from, steps, seconds, why, now); None when there is none
        (or it is not one: the file is written by this task's host agent, but checked all the same)."""
        path = os.path.join(self.task_dir, TASK_TRACE_REQUEST)
        try:
            info = os.stat(path)
        except OSError:
            return None
        if (info.st_mtime_ns, info.st_size) == self.seen or info.st_size > 4096:
            return None
        self.seen = (info.st_mtime_ns, info.st_size)
        try:
            with open(path) as handle:
                record = json.load(handle)
            os.unlink(path)  # (taken: a task started again in this folder does not take it again)
            ident, count, seconds = record["id"], record.get("steps", 10), record.get("seconds", 30)
            start, why, now = record.get("from"), record.get("why", ""), record.get("now", False)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        if type(ident) is not int or ident < 1 or ident in self.taken or type(count) is not int \
                or not 1 <= count <= AUTO_STEPS_MAX or type(seconds) not in (int, float) \
                or not 0 < seconds <= AUTO_SECONDS_MAX or not isinstance(why, str) or type(now) is not bool \
                or not (start is None or type(start) is int and 1 <= start < 1 << 62):
            return None
        self.taken.add(ident)
        return ident, start, count, float(seconds), why[:500], now


def _keep(folder: str, session: str, kept_as: str = CAPTURE_FILE) -> str | None:
    """Move the trace TensorFlow wrote in ``folder``'s ``session`` up to the task folder as
    ``kept_as`` (what comes back with a remote task's folder); its name, or None."""
    written = os.path.join(folder, "plugins", "profile", session)
    names = sorted(n for n in _listing(written) if n.endswith(".xplane.pb"))
    if not names:
        return None
    try:
        os.replace(os.path.join(written, names[0]), os.path.join(os.path.dirname(folder), kept_as))
    except OSError:
        return None
    with contextlib.suppress(OSError):
        shutil.rmtree(folder)
    return kept_as


def _listing(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _sessions(folder: str) -> list[str]:
    """The session folders TensorFlow wrote under ``folder`` (``plugins/profile/<session>``)."""
    return _listing(os.path.join(folder, "plugins", "profile"))
