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


class FrameReader:
    """Incremental parser: ``feed(bytes)`` returns the complete frames, ``(header, payload)``."""

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
        while True:
            end = self.buffer.find(b"\n")
            if end < 0:
                return frames
            header = json.loads(self.buffer[:end])
            size = int(header.get("n", 0))
            if len(self.buffer) < end + 1 + size:
                return frames
            payload = self.buffer[end + 1:end + 1 + size]
            self.buffer = self.buffer[end + 1 + size:]
            frames.append((header, payload))


def encode_command(command: dict) -> bytes:
    """One controller -> agent command line."""
    return json.dumps(command, separators=(",", ":")).encode("utf-8") + b"\n"
