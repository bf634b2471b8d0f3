"""The controller's side of a host agent: one :class:`HostSession` per host, one stream each.

A session is a byte stream to the agent (:mod:`ddlctl.host.agent`): the pipes of a local
subprocess, or one SSH exec channel. Every task of the host is started, signalled and watched
through it; its output arrives as frames that :meth:`HostSession.pump` sorts into
:class:`AgentTask` objects (which the supervisor uses as its ``TaskProcess``). When the stream
ends without the agent saying goodbye, the session is *lost*: every task still running on that
host is reported as ended by a lost connection (the remote agent kills them when its input
ends), never as an exit code of the program.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence

from ddlctl.cluster.model import Host
from ddlctl.contract.errors import LaunchError
from ddlctl.contract.hostclock import CLOCK_CORRECTED_S
from ddlctl.contract.wire import FrameReader, GarbledFrame, Kind, Op, check_frame, encode_command
from ddlctl.planning.plan import TaskSpec
from ddlctl.transport.agentcmd import no_python, task_command
from ddlctl.transport.status import ExitStatus
from ddlctl.transport.streams import Stream

HELLO_TIMEOUT_S = 60.0


#: The most of a task's received output one read gives the supervisor.
READ_MAX = 1 << 20
#: The most one write command carries (base64 in a JSON frame).
WRITE_PIECE = 1 << 20



class AgentTask:
    """One task started through a host agent (the supervisor's ``TaskProcess``)."""

    def __init__(self, spec: TaskSpec, session: HostSession) -> None:
        self.spec = spec
        self.session = session
        self.chunks: deque[bytes] = deque()
        self.status: ExitStatus | None = None
        self.ended_t: float | None = None  # wall time the agent saw it end
        self.eof = False
        self.listening = False
        self._pids: dict[str, object] = {}

    def read(self) -> bytes | None:
        """The output received so far and not read (the pieces that came, joined, up to
        :data:`READ_MAX`: what each piece costs the supervisor is paid once); b"" at its end."""
        if len(self.chunks) == 1:
            return self.chunks.popleft()
        if self.chunks:
            pieces, size = [], 0
            while self.chunks and size < READ_MAX:
                pieces.append(self.chunks.popleft())
                size += len(pieces[-1])
            return b"".join(pieces)
        return b"" if self.eof else None

    def poll(self) -> ExitStatus | None:
        return self.status

    def send(self, sig: str) -> None:
        self.session.command({"op": Op.SIGNAL, "task": self.spec.name, "sig": sig})

    def force_kill(self) -> None:
        """SIGKILL: through the agent, or directly when a local agent is gone."""
        self.send("KILL")
        pgid = self._pids.get("task_pgid")
        if self.session.host.is_local and self.session.lost and isinstance(pgid, int):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)

    def pids(self) -> dict[str, object]:
        return dict(self._pids)

    def _end(self, status: ExitStatus, when: float | None) -> None:
        if self.status is None:
            self.status, self.ended_t = status, when or time.time()
        self.eof = True


class HostSession:
    """The controller's end of one host agent."""

    def __init__(self, host: Host, stream: Stream, pythonpath: Sequence[str], python: str = "python3") -> None:
        self.host = host
        self.python = python  # the interpreter that runs the agent (for messages)
        self.stream = stream
        self.pythonpath = tuple(pythonpath)  # for tasks: where ddlctl's code is on that host
        self.reader = FrameReader()
        self._tasks: dict[str, AgentTask] = {}
        self._steps: dict[str, tuple[int, float]] = {}  # task -> (steps recorded so far, when it last grew)
        self._credits: dict[str, dict[str, int]] = {}  # task -> worker -> steps it ran (ps chief)
        self._progress: dict[str, tuple[int, int | None]] = {}  # task -> (highest step reached, declared total)
        self._activity: dict[str, tuple[int, str | None]] = {}  # task -> (phase lines and beats, open phase)
        self._beats: dict[str, str] = {}  # task -> the kind of its last beat
        self._paces: dict[str, dict[str, tuple[float, float | None, int]]] = {}  # task -> ran by -> its pace
        self._dumps: dict[str, dict] = {}
        self._dumps_asked: set[str] = set()  # dumps are kept only for tasks asked for
        self.ports_reply: dict | None = None
        self._ports_asked = False
        self._replies: dict[object, list[tuple[dict, bytes]]] = {}  # file operations, by request id
        self._asked: set[int] = set()  # request ids whose replies are awaited
        self._next_id = 0
        self.hello: dict | None = None
        self._pids_changed = False  # a task reported its pids since the supervisor last looked
        self.lost: str | None = None  # why the stream ended unexpectedly
        self.lost_at: float | None = None
        # the host's clock less this machine's (seconds), as closely as its frames tell: each frame's
        # time of sending less this machine's time of reading is the offset less the frame's delay,
        # so the largest such difference is the tightest bound (None until a frame said its time)
        self.clock_offset: float | None = None
        self.clock_frames = 0  # frames that told it
        self.closed = False
        self.last_heard = time.monotonic()
        # a drain thread (see _drain) reads only under this lock and while the stream is open: once
        # closed, its descriptor number may belong to another agent's pipe
        self._io = threading.Lock()
        self._stream_open = True

    # -- stream --------------------------------------------------------------------------------

    def fileno(self) -> int:
        return self.stream.fileno()

    def command(self, command: dict) -> None:
        if self.lost or self.closed:
            return
        try:
            self.stream.write(encode_command(command))
        except Exception as exc:  # noqa: BLE001 - any transport error means the same: connection gone
            self._lose(f"cannot write to the host agent: {exc}")

    def pump(self) -> None:
        """Read what the agent sent and sort it into tasks, step counts and replies."""
        while not self.lost and not self.closed:
            try:
                data = self.stream.read()
            except Exception as exc:  # noqa: BLE001
                self._lose(f"connection error: {exc}")
                return
            if data is None:
                return
            if data == b"":
                said = self.stream.ended()
                self._lose("connection closed" + (f": {said}" if said else ""))
                return
            self.last_heard = time.monotonic()
            try:
                for header, payload in self.reader.feed(data):
                    self._dispatch(header, payload)
            except GarbledFrame as exc:
                self._lose(f"garbled data from the host agent: {exc}")
                return

    def _dispatch(self, header: dict, payload: bytes) -> None:
        """Act on one frame, its fields checked first (:func:`~ddlctl.contract.wire.check_frame`); a
        task it names must be one started through this session (a host speaks for its own tasks
        only); replies are kept only for what was asked. A frame that breaks a rule raises
        :class:`GarbledFrame` (the session is then lost; the controller goes on)."""
        kind = check_frame(header).get("k")
        if kind in (Kind.HELLO, Kind.BEAT, Kind.STEPS) and header.get("t") is not None:
            seen = header["t"] - time.time()
            self.clock_offset = seen if self.clock_offset is None else max(self.clock_offset, seen)
            self.clock_frames += 1
        task = self._tasks.get(header.get("task") or "")
        if kind == Kind.OUT and task is not None:
            task.chunks.append(payload)
        elif kind == Kind.EXIT and task is not None:
            if header.get("signal"):
                status = ExitStatus(signal=header["signal"], oom=header.get("oom") or None,
                                    profiling=header.get("profiling") or None)
            else:
                status = ExitStatus(code=header.get("code") or 0)
            task._end(status, self.here(header.get("t")))
        elif kind == Kind.STARTED and task is not None:
            task._pids = {k: header[k] for k in ("agent_pid", "task_pid", "task_pgid", "ssh_connection", "executable")
                          if k in header}
            if header.get("note"):  # what the agent changed about the start (shown with the task's output)
                task.chunks.append(f"ddlctl: {header['note']}\n".encode())
            self._pids_changed = True
        elif kind == Kind.START_FAILED and task is not None:
            error = str(header.get("error"))
            task.chunks.append(f"ddlctl: {error}\n".encode())
            self._pids_changed = True  # (it has none: the supervisor still counts it as started)
            task._end(ExitStatus(code=header.get("code", 127), not_started=error), time.time())
        elif kind == Kind.LISTENING and task is not None:
            task.listening = True
        elif kind == Kind.STEPS:
            self._take_steps(header)
        elif kind == Kind.DUMP and task is not None and header["task"] in self._dumps_asked:
            self._dumps_asked.discard(header["task"])
            self._dumps[header["task"]] = header
        elif kind == Kind.PORTS and self._ports_asked:
            self._ports_asked = False
            self.ports_reply = header
        elif kind in Kind.FILE_REPLIES and type(header.get("id")) is int and header["id"] in self._asked:
            self._replies.setdefault(header["id"], []).append((header, payload))
        elif kind == Kind.SIGNALLED:  # the agent itself was signalled: its tasks end with the host
            signum = header.get("sig", 15)
            name = signal.Signals(signum).name if signum in signal.valid_signals() else f"signal {signum}"
            said = self.stream.ended()
            self._lose(f"its host agent received {name}"
                       + (f": {said}" if said else " (its Slurm step cancelled, or the host shutting down)"))
            self._drain()
        elif kind == Kind.HELLO:
            self.hello = header
        elif kind == Kind.BYE:
            self.closed = True

    def _take_steps(self, header: dict) -> None:
        """A ``steps`` frame (checked): step counts, highest steps, declared totals, activity and a ps
        chief's credits, for this session's own tasks only."""
        when = header["t"] if header.get("t") is not None else time.time()
        last, totals, opened = header.get("last") or {}, header.get("totals") or {}, header.get("open") or {}
        for name, count in (header.get("counts") or {}).items():
            if name in self._tasks:
                self._steps[name] = (count, when)
                self._progress[name] = (last.get(name, count), totals.get(name))
        for name, busy in (header.get("activity") or {}).items():
            if name in self._tasks:
                self._activity[name] = (busy, opened.get(name))
        for name, kind in (header.get("beats") or {}).items():
            if name in self._tasks:
                self._beats[name] = kind
        for name, credits in (header.get("credits") or {}).items():
            if name in self._tasks:
                self._credits[name] = dict(credits)
        for name, paces in (header.get("pace") or {}).items():
            if name in self._tasks:
                self._paces[name] = {ran_by or name: (float(p[0]), None if p[1] is None else float(p[1]), p[2])
                                     for ran_by, p in paces.items()}

    def here(self, t: float | None) -> float | None:
        """The host's time ``t`` on this machine's clock (see ``clock_offset``): exits on hosts whose
        clocks differ are then ordered as they happened."""
        if t is None or self.clock_offset is None or abs(self.clock_offset) < CLOCK_CORRECTED_S:
            return t
        return float(t) - self.clock_offset

    def _lose(self, reason: str) -> None:
        if self.lost or self.closed:
            return
        self.lost, self.lost_at = reason, time.time()
        for task in self._tasks.values():
            if task.status is None:
                task._end(ExitStatus(lost=True), self.lost_at)
            task.eof = True

    def _drain(self) -> None:
        """Read and drop what a signalled agent still sends while it stops its tasks (its last
        output, exits), so that it never blocks on a full pipe or window; ends with the stream."""

        def drain() -> None:
            while True:
                with contextlib.suppress(Exception):  # a stream closed under it: seen below
                    select.select([self.stream.fileno()], [], [], 1.0)
                with self._io:
                    if not self._stream_open:
                        return
                    try:
                        data = self.stream.read()
                    except Exception:  # noqa: BLE001 - the stream broke: nothing more to drain
                        return
                if data == b"":
                    return

        threading.Thread(target=drain, daemon=True, name=f"drain-{self.host.label}").start()

    def _end_stream(self) -> bool:
        """Mark the stream closed for a drain thread (before its descriptor can be reused); False
        when it already was."""
        with self._io:
            was, self._stream_open = self._stream_open, False
        return was

    def check_silence(self, limit_s: float, now: float | None = None) -> bool:
        """An agent beats every 2 s: nothing heard for ``limit_s`` means the host is gone (network
        down without a reset, agent stopped). Then the session is lost and cut off; True if so."""
        now = time.monotonic() if now is None else now
        if self.lost or self.closed or now - self.last_heard <= limit_s:
            return False
        self._lose(f"no word from its host agent for {now - self.last_heard:.0f}s")
        if self._end_stream():
            with contextlib.suppress(Exception):
                self.stream.abandon()
        return True

    def heard(self) -> None:
        """Count the agent as heard now: ddlctl itself did not run for a while (stopped, suspended),
        and what the agent sent meanwhile may still be on its way (an SSH channel's thread)."""
        self.last_heard = max(self.last_heard, time.monotonic())

    def wait_for(self, ready, timeout: float) -> bool:  # noqa: ANN001 - a predicate
        """Pump until ``ready()`` or the timeout (or the connection is lost)."""

        deadline = time.monotonic() + timeout
        while not ready():
            if self.lost or self.closed:
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            select.select([self.fileno()], [], [], min(left, 0.1))
            self.pump()
        return True

    def await_hello(self) -> None:
        """Wait for the agent's hello; a clear error naming the host if it never comes."""
        if self.wait_for(lambda: self.hello is not None, HELLO_TIMEOUT_S):
            return
        said = (self.stream.errors() or self.reader.skipped.decode("utf-8", "replace")).strip()[-600:]
        why = self.lost or f"no answer within {HELLO_TIMEOUT_S:g}s"
        self.close()
        if "No such file" in said or "not found" in said:
            raise no_python(self.host, self.python)
        raise LaunchError(f"{self.host.label}: the ddlctl host agent did not start ({why})"
                          + (f": {said}" if said else ""),
                          f"check python= for this host ({self.host.source}) and that it is Python 3.10+")

    # -- tasks ---------------------------------------------------------------------------------

    def start(self, spec: TaskSpec, grace_s: float) -> AgentTask:
        """Ask the agent to start ``spec``; the returned task fills in as frames arrive."""
        task = AgentTask(spec, self)
        self._tasks[spec.name] = task
        self._steps.pop(spec.name, None)
        self._activity.pop(spec.name, None)
        self._beats.pop(spec.name, None)
        self._paces.pop(spec.name, None)
        if self.lost:
            task._end(ExitStatus(lost=True), time.time())
            return task
        self.command({"op": Op.START, "task": spec.name, "spec": task_command(spec, grace_s, self.pythonpath)})
        return task

    def take_pids_changed(self) -> bool:
        """Whether a task reported its pids (or failed to start) since the last call."""
        changed, self._pids_changed = self._pids_changed, False
        return changed

    def step_counts(self) -> Mapping[str, tuple[int, float]]:
        """Task -> (step records so far, when the count last grew), as the agent reports them."""
        return self._steps

    def credits(self) -> Mapping[str, Mapping[str, int]]:
        """Task -> the steps each worker ran for it, as its records say (a ps chief's; else empty)."""
        return self._credits

    def activity(self) -> Mapping[str, tuple[int, str | None]]:
        """Task -> (lines of its phases file so far: work outside its steps, the phase it is in)."""
        return self._activity

    def beats(self) -> Mapping[str, str]:
        """Task -> the kind of its last beat ("eval", "train"), for tasks that wrote one."""
        return self._beats

    def progress(self) -> Mapping[str, tuple[int, int | None]]:
        """Task -> (highest step reached, declared total)."""
        return self._progress

    def paces(self) -> Mapping[str, Mapping[str, tuple[float, float | None, int]]]:
        """Task -> the task that ran its recorded steps (itself; a ps chief's workers) -> (median
        seconds a step lately, median sync seconds a step or None, records timed)."""
        return self._paces

    def request_trace(self, name: str, request: dict) -> None:
        """Ask task ``name`` for a profiler capture (``--trace auto``: :mod:`ddlctl.task.trace`)."""
        if not self.lost:
            self.command({"op": Op.TRACE, "task": name, "request": request})

    def request_dump(self, names: Sequence[str]) -> None:
        """Ask the agent for the processes and Python stacks of ``names`` (see :meth:`dump_of`)."""
        for name in names:
            self._dumps.pop(name, None)
            self._dumps_asked.add(name)
        self.command({"op": Op.DUMP, "tasks": list(names)})

    def dump_of(self, name: str) -> dict | None:
        """The agent's dump of ``name`` once it came (``procs``: pid, state, command; ``stacks``)."""
        return self._dumps.get(name)

    def check_ports(self, ports: dict[str, int], timeout: float = 10.0) -> dict[str, int]:
        """The given ports where still free on the host, fresh ones where not."""
        if not ports:
            return {}
        self.ports_reply, self._ports_asked = None, True
        self.command({"op": Op.PORTS, "ports": ports})
        if not self.wait_for(lambda: self.ports_reply is not None, timeout):
            return dict(ports)
        return {k: int(v) for k, v in self.ports_reply["ports"].items()}  # type: ignore[index]

    def _request(self, command: dict, done, timeout: float) -> list[tuple[dict, bytes]]:  # noqa: ANN001
        """Send a file command and wait until ``done(replies)``; raises OSError on failure."""
        self._next_id += 1
        ident = self._next_id
        self._asked.add(ident)
        self.command({**command, "id": ident})
        finished = self.wait_for(lambda: any(h.get("k") == Kind.FILE_ERROR for h, _ in self._replies.get(ident, ()))
                                 or done(self._replies.get(ident, [])), timeout)
        self._asked.discard(ident)
        replies = self._replies.pop(ident, [])
        errors = [h["error"] for h, _ in replies if h.get("k") == Kind.FILE_ERROR]
        if errors or not finished:
            raise OSError(f"{self.host.label}: {errors[0] if errors else self.lost or 'no answer'}")
        return replies

    def list_files(self, folder: str, timeout: float = 60.0) -> dict[str, tuple[int, int]]:
        """Files under ``folder`` on the host: relative path -> (size, mtime in ns)."""
        replies = self._request({"op": Op.LS, "dir": folder}, lambda r: bool(r), timeout)
        return {k: (int(v[0]), int(v[1])) for k, v in replies[0][0]["files"].items()}

    def _stream(self, command: dict, timeout: float) -> Iterator[bytes]:
        """Send a file command answered by data frames and yield their payloads as they come (each
        within ``timeout`` of the one before): nothing is held whole. Raises OSError on failure."""
        self._next_id += 1
        ident = self._next_id
        self._asked.add(ident)
        self.command({**command, "id": ident})
        try:
            while True:
                if not self.wait_for(lambda: bool(self._replies.get(ident)), timeout):
                    raise OSError(f"{self.host.label}: {self.lost or 'no answer'}")
                for header, payload in self._replies.pop(ident):
                    if header.get("k") == Kind.FILE_ERROR:
                        raise OSError(f"{self.host.label}: {header['error']}")
                    yield payload
                    if header.get("eof"):
                        return
        finally:
            self._asked.discard(ident)
            self._replies.pop(ident, None)

    def read_chunks(self, path: str, timeout: float = 600.0) -> Iterator[bytes]:
        """``path`` on the host, piece by piece."""
        return self._stream({"op": Op.READ, "path": path}, timeout)

    def read_file(self, path: str, timeout: float = 600.0) -> bytes:
        return b"".join(self.read_chunks(path, timeout))

    def write_chunks(self, path: str, chunks: Iterable[bytes], mtime_ns: int | None = None,
                     timeout: float = 600.0) -> int:
        """Write ``path`` on the host from ``chunks`` as they come, in pieces of at most 1 MiB (to a
        temporary name, renamed when complete); returns the bytes written."""
        import base64

        pieces = (chunk[at:at + WRITE_PIECE] for chunk in chunks for at in range(0, len(chunk), WRITE_PIECE))
        current, first, written = next(pieces, b""), True, 0
        while True:
            following = next(pieces, None)  # one piece ahead: the last one is written as final
            self._request({"op": Op.WRITE, "path": path, "append": not first, "final": following is None,
                           "mtime_ns": mtime_ns, "data": base64.b64encode(current).decode("ascii")},
                          lambda r: bool(r), timeout)
            written += len(current)
            if following is None:
                return written
            current, first = following, False

    def write_file(self, path: str, data: bytes, mtime_ns: int | None = None, timeout: float = 600.0) -> None:
        """Write ``path`` on the host (chunks to a temporary name, renamed when complete)."""
        self.write_chunks(path, [data], mtime_ns, timeout)

    def pack_chunks(self, dirs: Mapping[str, str], timeout: float = 600.0) -> Iterator[bytes]:
        """A tar of the plain files of each folder (``name -> path`` on the host) as ``name/file``,
        piece by piece as the agent writes it."""
        return self._stream({"op": Op.PACK, "dirs": dict(dirs)}, timeout)

    def prune(self, path: str, keep: Sequence[str] = (), timeout: float = 120.0) -> None:
        """Remove ``path`` on the host except the entries named in ``keep``."""
        self._request({"op": Op.PRUNE, "path": path, "keep": list(keep)}, lambda r: bool(r), timeout)

    def shutdown(self) -> None:
        """Ask the agent to stop every task and leave."""
        self.command({"op": Op.SHUTDOWN})

    def close(self) -> None:
        self.closed = True
        if self._end_stream():
            self.stream.close()
