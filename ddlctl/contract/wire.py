"""The host agent's wire format (standard library only: it runs on hosts without ddlctl installed).

Agent -> controller, on the agent's stdout: after one ``MAGIC`` line (anything a login shell
printed before it is skipped), a sequence of frames. A frame is one JSON header line; when the
header has ``"n": N``, N raw bytes follow it (task output, unchanged). Controller -> agent, on the
agent's stdin: one JSON object per line (a command). Task specs, environment values included,
travel only here, never in a command line.
"""

from __future__ import annotations

import json

MAGIC = b"DDLCTL-HOSTAGENT 1\n"


class Op:
    """Commands, controller -> agent (a command's ``"op"``)."""

    START = "start"  # start a task: {task, spec}
    SIGNAL = "signal"  # {task, sig}: TERM/INT/HUP (then KILL after the grace) or KILL
    DUMP = "dump"  # {tasks}: processes and Python stacks
    PORTS = "ports"  # {ports}: still free? fresh ones where not
    SHUTDOWN = "shutdown"  # stop every task and leave
    TRACE = "trace"  # {task, request}: --trace auto asks a running task for a profiler capture
    LS = "ls"  # file operations, each with an "id" its replies carry
    READ = "read"
    WRITE = "write"
    PACK = "pack"
    PRUNE = "prune"
    FILES = (LS, READ, WRITE, PACK, PRUNE)


class Kind:
    """Frames, agent -> controller (a header's ``"k"``)."""

    HELLO = "hello"  # first frame: pid, probe
    BEAT = "beat"  # every 2 s
    BYE = "bye"  # leaving after shutdown
    SIGNALLED = "signalled"  # the agent itself got SIGTERM/SIGHUP/SIGINT
    OUT = "out"  # a task's output (payload)
    STARTED = "started"  # a task's pids
    START_FAILED = "start_failed"
    LISTENING = "listening"  # a task's own process group listens on its port
    EXIT = "exit"  # code or signal, after the task's last output
    STEPS = "steps"  # per task: step records, highest step, declared total
    DUMP = "dump"
    PORTS = "ports"
    LS = "ls"  # replies to file operations
    DATA = "data"
    WRITTEN = "written"
    FILE_ERROR = "file_error"
    FILE_REPLIES = (LS, DATA, WRITTEN, FILE_ERROR)


def encode_frame(header: dict, payload: bytes = b"") -> bytes:
    """One frame: the JSON header (with ``n`` when there is a payload), a newline, the payload."""
    if payload:
        header = {**header, "n": len(payload)}
    return json.dumps(header, separators=(",", ":")).encode("utf-8") + b"\n" + payload


#: Bounds on what an agent may send (a frame past one costs that session, never the controller):
#: a header line (a dump's stacks, a listing of a big folder) and a payload (task output is read
#: 64 KiB at a time, file data 1 MiB at a time).
MAX_HEADER = 8 << 20
MAX_PAYLOAD = 4 << 20


class GarbledFrame(ValueError):
    """Bytes from an agent that are not a frame (the session that sent them is lost, said so)."""


class FrameReader:
    """Incremental parser: ``feed(bytes)`` returns the complete frames, ``(header, payload)``; a
    header that is not a JSON object with ``0 <= n <= MAX_PAYLOAD``, or a line longer than
    :data:`MAX_HEADER`, raises :class:`GarbledFrame`."""

    def __init__(self) -> None:
        self.buffer = b""
        self.synced = False
        self.skipped = b""  # what came before MAGIC (a login shell's chatter), for error messages

    def feed(self, data: bytes) -> list[tuple[dict, bytes]]:
        self.buffer += data
        frames: list[tuple[dict, bytes]] = []
        if not self.synced:
            at = self.buffer.find(MAGIC)
            if at < 0:
                keep = len(MAGIC) - 1  # a MAGIC split across reads
                if len(self.buffer) > keep:
                    self.skipped = (self.skipped + self.buffer[:-keep])[-4096:]
                    self.buffer = self.buffer[-keep:]
                return frames
            self.skipped = (self.skipped + self.buffer[:at])[-4096:]
            self.buffer = self.buffer[at + len(MAGIC):]
            self.synced = True
        start, buffer = 0, self.buffer
        try:
            while True:
                end = buffer.find(b"\n", start, start + MAX_HEADER + 1)
                if end < 0:
                    if len(buffer) - start > MAX_HEADER:
                        raise GarbledFrame(f"a header line longer than {MAX_HEADER} bytes")
                    return frames
                header = parse_header(buffer[start:end])
                size = header.get("n", 0)
                if len(buffer) < end + 1 + size:
                    return frames
                frames.append((header, buffer[end + 1:end + 1 + size]))
                start = end + 1 + size
        finally:
            self.buffer = buffer[start:]


def parse_header(line: bytes) -> dict:
    """A frame's header line as a dict; :class:`GarbledFrame` if it is not one with a valid ``n``."""
    try:
        header = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise GarbledFrame(f"not JSON ({type(exc).__name__}): {line[:80]!r}") from None
    if not isinstance(header, dict):
        raise GarbledFrame(f"a header that is not an object: {line[:80]!r}")
    size = header.get("n", 0)
    if type(size) is not int or not 0 <= size <= MAX_PAYLOAD:
        raise GarbledFrame(f"a payload size that is not an integer from 0 to {MAX_PAYLOAD}: {str(size)[:40]}")
    return header


def encode_command(command: dict) -> bytes:
    """One controller -> agent command line."""
    return json.dumps(command, separators=(",", ":")).encode("utf-8") + b"\n"


# -- what a frame's fields may hold (the controller checks each frame it acts on) -----------------

#: The largest integer a frame may carry (a pid, a step count, an exit code, a byte count).
MAX_INT = 1 << 53
#: The longest task name, note or error a frame may carry.
MAX_TEXT = 64 << 10


def integer(value: object, low: int = 0, high: int = MAX_INT) -> int:
    """``value`` if it is an int (not a bool) within [low, high]; else :class:`GarbledFrame`."""
    if type(value) is not int or not low <= value <= high:
        raise GarbledFrame(f"not an integer from {low} to {high}: {str(value)[:40]}")
    return value


def number(value: object) -> float:
    """``value`` as a float if it is a finite int or float; else :class:`GarbledFrame`."""
    if type(value) not in (int, float) or not -1e15 < value < 1e15:  # type: ignore[operator]
        raise GarbledFrame(f"not a finite number: {str(value)[:40]}")
    return float(value)  # type: ignore[arg-type]


def text(value: object, limit: int = MAX_TEXT) -> str:
    """``value`` if it is a string of at most ``limit`` characters; else :class:`GarbledFrame`."""
    if not isinstance(value, str) or len(value) > limit:
        raise GarbledFrame(f"not a string of at most {limit} characters: {str(value)[:40]}")
    return value


def table(value: object) -> dict:
    """``value`` if it is an object whose keys are strings (JSON's are); else :class:`GarbledFrame`."""
    if not isinstance(value, dict):
        raise GarbledFrame(f"not an object: {str(value)[:40]}")
    return value


def _opt(header: dict, key: str, check, *bounds: int) -> None:  # noqa: ANN001 - one of the checks above
    if header.get(key) is not None:
        check(header[key], *bounds)


def _integers(value: object, low: int = 0) -> dict:
    """An object of integers (step counts by task)."""
    for count in table(value).values():
        integer(count, low)
    return value  # type: ignore[return-value]


def check_frame(header: dict) -> dict:
    """``header`` if every field its kind carries holds what the agent writes there (the schema of
    the wire, one place); else :class:`GarbledFrame`. Which task a frame may name, and which
    replies are awaited, is the session's to decide."""
    kind = header.get("k")
    _opt(header, "task", text)
    _opt(header, "t", number)
    if kind == Kind.EXIT:
        _opt(header, "oom", text)  # (the agent's evidence: the kernel log's line, or its counters)
        _opt(header, "profiling", text)  # (a profiler capture was open: its session)
        if header.get("signal"):
            integer(header["signal"], 1, 64)
        _opt(header, "code", integer, -(1 << 31), 1 << 31)
    elif kind == Kind.STARTED:
        for key in ("agent_pid", "task_pid", "task_pgid"):
            _opt(header, key, integer, 1, 1 << 31)
        for key in ("ssh_connection", "executable", "note"):
            _opt(header, key, text)
    elif kind == Kind.START_FAILED:
        _opt(header, "error", text)
        _opt(header, "code", integer, 0, 255)
    elif kind == Kind.STEPS:
        for key in ("counts", "last", "activity"):
            _integers(header.get(key) or {})
        for total in table(header.get("totals") or {}).values():
            if total is not None:
                integer(total)
        for phase in [*table(header.get("open") or {}).values(), *table(header.get("beats") or {}).values()]:
            if phase is not None:
                text(phase, 200)
        for credits in table(header.get("credits") or {}).values():
            for worker in _integers(credits):
                text(worker, 200)
        for paces in table(header.get("pace") or {}).values():
            for ran_by, pace in table(paces).items():
                text(ran_by, 200)
                if not isinstance(pace, list) or len(pace) != 3:
                    raise GarbledFrame(f"a pace is not [step s, sync s, records]: {str(pace)[:40]}")
                number(pace[0]), pace[1] is None or number(pace[1]), integer(pace[2])
    elif kind == Kind.DUMP:
        procs = header.get("procs") or []
        if not isinstance(procs, list) or not all(
                isinstance(p, list) and len(p) == 3 and type(p[0]) is int and isinstance(p[1], str)
                and isinstance(p[2], str) for p in procs):
            raise GarbledFrame(f"a dump's processes are not [pid, state, command] lists: {str(procs)[:80]}")
        _opt(header, "stacks", text, MAX_HEADER)
        table(header.get("wchan") or {})
        _opt(header, "cpu_s", number)
        _opt(header, "at", number)
        _opt(header, "io_bytes", integer)
    elif kind == Kind.PORTS:
        for port in table(header.get("ports")).values():
            integer(port, 1, 65535)
    elif kind == Kind.LS:
        for entry in table(header.get("files")).values():
            if not isinstance(entry, list) or len(entry) != 2:
                raise GarbledFrame(f"a listing's entry is not [size, mtime]: {str(entry)[:40]}")
            integer(entry[0]), integer(entry[1], -(1 << 62), 1 << 62)  # (mtime in ns)
    elif kind == Kind.FILE_ERROR:
        text(header.get("error"))
    elif kind == Kind.SIGNALLED:
        integer(header.get("sig", 15), 1, 64)
    return header
