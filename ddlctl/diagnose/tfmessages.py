"""What TensorFlow's own error messages say about which task is at fault (TF 2.21 wording).

When one task of a cluster dies or hangs, its peers fail too, and their messages name it:

* a peer killed: ``Collective ops is aborted by: ... remote target /job:worker/replica:0/task:1``
  (MWMS), ``UnavailableError ... remote target /job:ps/replica:0/task:0`` (ps);
* a non-leader hung (stopped sending heartbeats): ``The following tasks are unhealthy (stopped
  sending heartbeats): /job:worker/replica:0/task:1``;
* the coordination-service leader hung: ``Deadline Exceeded ... CoordinationService/Heartbeat``,
  which names no task: the leader (worker 0 under MWMS, the chief under ps) is at fault.

Only the task's *final* error counts (text from its last Python traceback on, or its last lines):
a ps chief logs recoverable worker losses (``Worker /job:worker/... failed with UnavailableError``)
and goes on, and those lines must not blame anyone. The verbatim messages are test fixtures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ddlctl.diagnose.rootcause import TRACEBACK_HEAD, line_at

_TASK = r"/job:(\w+)/replica:\d+/task:(\d+)"
HEARTBEAT = re.compile(r"stopped sending heartbeats\)?:?\s*" + _TASK)
REMOTE = re.compile(r"(?:Collective ops is aborted by|UnavailableError|Unavailable:|Socket closed|"
                    r"Connection reset)[\s\S]{0,600}?remote target " + _TASK)
LEADER = re.compile(r"Deadline ?Exceeded[\s\S]{0,600}?CoordinationService/Heartbeat")


#: TensorFlow's words when a ps coordinator asks a worker for a result the worker no longer has
#: because it was restarted since (the chief was held, stopped or swapped out, across the
#: replacement), or when a worker kept across a chief's restart cannot hand a closure's result to
#: the new chief ("Unable to parse request" from its ``RunComponentFunction``, with
#: ``RecvFromRemoteAsync is cancelled``: seen once in a loaded suite, right after the restarted chief
#: resumed): the chief's own error is then a consequence of a fault, not a bug of the program.
STALE_HANDLE = ("Unable to find the relevant tensor remote_handle", "Unable to find a context_id",
                "Perhaps the worker was restarted", "was probably restarted",
                "RecvTensor expects a different device incarnation", "Unable to parse request")


def stale_handle(text: str) -> str | None:
    """The line of ``text`` (a task's final error) that says a peer was restarted under it, if any."""
    for words in STALE_HANDLE:
        at = text.find(words)
        if at >= 0:
            return line_at(text, at)
    return None


#: TensorFlow's words when the members of a collective (the workers' all-reduce) disagree on what
#: it is: different shapes or types (workers that ran different collectives: one evaluates while
#: another steps, models that differ): a bug of the program, whichever peer the error mentions.
MISMATCH = re.compile(r"Shape mismatch in the collective instance[^\n]*|Collective instance \d+ [^\n]*but another "
                      r"member in the group[^\n]*")


def collective_mismatch(text: str) -> str | None:
    """TensorFlow's sentence in ``text`` (a task's final error) that says its collective did not
    match its peers', up to its first full stop after the mismatch; None if none."""
    found = MISMATCH.search(text)
    if found is None:
        return None
    words = found.group(0)
    end = words.find(". ", words.find("another member"))
    return (words[:end + 1] if end >= 0 else words).strip()


PORT_TAKEN = re.compile(r"Could not start gRPC server|Failed to add port to server|Address already in use")


def port_taken(text: str) -> bool:
    """Whether a task's final error says its TensorFlow server could not bind its port."""
    return bool(PORT_TAKEN.search(final_error(text)))


#: What ``ddlctl.task.server`` says when the port planned for its profiler is taken.
PROFILER_PORT_TAKEN = re.compile(r"cannot serve TensorFlow's profiler on port (\d+): Address already in use")


def profiler_port_taken(text: str) -> int | None:
    """The profiler port a ps server's final words say was taken (None: not that)."""
    match = PROFILER_PORT_TAKEN.search(final_error(text))
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Blame:
    """A peer named (or implied) by a task's final error."""

    task: str  # "worker:1"
    kind: str  # "heartbeat" (stopped sending heartbeats), "unavailable" (gone), "leader" (leader hung)
    line: str  # the line of TensorFlow's message that says so

    @property
    def hung(self) -> bool:
        return self.kind in ("heartbeat", "leader")


def final_error(text: str, tail: int = 40) -> str:
    """The part of a log that holds the task's final error: from its last traceback, or its tail."""
    at = text.rfind(TRACEBACK_HEAD)
    if at >= 0:
        return text[at:]
    return "\n".join(text.splitlines()[-tail:])


def blame_peer(text: str, leader: str) -> Blame | None:
    """The peer that ``text`` (a failed task's log) blames, if any. ``leader``: the task that leads
    the coordination service (``worker:0`` under MWMS, ``chief:0`` under ps)."""
    error = final_error(text)
    match = HEARTBEAT.search(error)
    if match:
        line = line_at(error, match.start())
        named = match.group(0).split()[-1]
        return Blame(f"{match.group(1)}:{match.group(2)}", "heartbeat", line if named in line else f"{line} {named}")
    match = REMOTE.search(error)
    if match:
        return Blame(f"{match.group(1)}:{match.group(2)}", "unavailable", line_at(error, match.start(1) - 1))
    match = LEADER.search(error)
    if match:
        return Blame(leader, "leader", line_at(error, match.start()))
    return None


#: The coordination service's leader, while tasks have not connected: ``Waiting for 1/2 tasks to
#: connect.``, then ``Example stragglers:`` and their names, a line each.
WAITING = re.compile(r"Waiting for (\d+)/(\d+) tasks to connect")
STRAGGLER = re.compile(r"^\s*" + _TASK + r"\s*$")


class LiveReports:
    """Fault reports in a *running* task's output: TensorFlow's coordination service logs that a
    peer "stopped sending heartbeats" as an ``E`` line (the peer's name on the next line) and the
    reporting process may go on stepping: no traceback ever follows. Fed line by line. Also the
    tasks the coordination service (on its leader) last said it waits for (:attr:`stragglers`:
    TensorFlow's names, "worker:1"; :attr:`waiting`: that line)."""

    def __init__(self) -> None:
        self._pending = ""
        self.stragglers: tuple[str, ...] = ()
        self.waiting = ""
        self._listing = False  # the lines after "Example stragglers:" name them

    def feed_lines(self, lines: list[bytes]) -> list[Blame]:
        """:meth:`feed` of each of ``lines`` (raw): one scan of the block when none can matter."""
        if not self._listing and not self._pending:
            block = b"".join(lines)
            if b"tasks to connect" not in block and b"heartbeats" not in block:
                return []
        return [blame for line in lines if (blame := self.feed(line.decode("utf-8", "replace"))) is not None]

    def feed(self, line: str) -> Blame | None:
        """The peer named by ``line`` (with the line before it, when that one began the report)."""
        if self._listing or "tasks to connect" in line:
            self._stragglers(line)
        if not self._pending and "heartbeats" not in line:
            return None  # almost every line
        text = f"{self._pending}\n{line}" if self._pending else line
        self._pending = ""
        match = HEARTBEAT.search(text)
        if match:
            return Blame(f"{match.group(1)}:{match.group(2)}", "heartbeat", " ".join(text.split("\n")).strip()[:400])
        if "stopped sending heartbeats" in line:
            self._pending = line.strip()
        return None

    def waiting_words(self) -> str:
        """The coordination service's last count and the tasks it named, as one quotable line."""
        return f"{self.waiting} Example stragglers: {', '.join(self.stragglers)}"

    def _stragglers(self, line: str) -> None:
        waiting = WAITING.search(line)
        if waiting:  # a new count: the names follow ("Waiting for 0/2": none is awaited any more)
            self.waiting, self.stragglers = line.strip()[waiting.start():], ()
            self._listing = waiting.group(1) != "0"
            return
        named = STRAGGLER.match(line)
        if named:
            self.stragglers = (*self.stragglers, f"{named.group(1)}:{named.group(2)}")
        elif "Example stragglers" not in line:
            self._listing = False
