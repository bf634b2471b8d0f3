"""Where a hung task stands, read from what its host agent saw: the process state and the Python
stacks that :mod:`faulthandler` wrote (``Thread 0x... (most recent call first):`` blocks).

Pure functions over text. The main thread is the block that did not start in ``threading``'s
``_bootstrap`` (faulthandler lists the newest thread first, so it is also the last block). Its
innermost frame outside the standard library says what it is doing:

* in TensorFlow, Keras or another installed library (``site-packages``), or in ddlctl's own
  instrumentation: **waiting** (a collective, ``quick_execute``, a coordinator's ``join``): it
  waits for someone else;
* anywhere else (the user's program, ddlctl's built-in workload): **in user code**: a busy loop,
  a lock that is never released, a read of a pipe nobody writes. That task holds the others up.

A main thread whose only frame is ``threading._shutdown`` is **joining**: the program has
ended, and Python waits for a thread that was not started as a daemon (a prefetcher never told
to stop, say) before it exits.

A main thread with no Python frame at all (``<no Python frame>``; the oldest thread, which
faulthandler lists last) is **exiting**: the program has ended (its code, its threads and its
``atexit`` handlers are done) and the interpreter is shutting down, freeing objects; a process that
stays there (TensorFlow's teardown spinning once the coordination leader is gone) is stuck in
its exit, not in its training.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):\s*$")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_LIBRARY = ("/site-packages/", "/dist-packages/")
#: ddlctl's own code that runs inside a task without being the user's: a frame there is waiting.
_DDLCTL_INTERNAL = ("/ddlctl/task/", "/ddlctl/host/")
_STDLIB = re.compile(r"/lib/python3\.\d+/(?!site-packages/|dist-packages/)")
_NO_FRAME = "<no Python frame>"


@dataclass(frozen=True)
class Frame:
    """One line of a faulthandler stack."""

    path: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} in {self.function}"

    @property
    def importing(self) -> bool:
        """Whether this is the import system loading a module (``_find_and_load``)."""
        return self.path.startswith("<frozen importlib") and self.function == "_find_and_load"

    @property
    def kind(self) -> str:
        """"stdlib", "library" (installed packages, ddlctl's instrumentation) or "user"."""
        if any(part in self.path for part in (*_LIBRARY, *_DDLCTL_INTERNAL)):
            return "library"
        if _STDLIB.search(self.path) or self.path.startswith("<"):
            return "stdlib"
        return "user"  # the user's program (ddlctl's built-in workload is the user's program here)


@dataclass(frozen=True)
class Standing:
    """Where one task stood when the hang was noticed."""

    task: str
    state: str  # "stopped" (state T), "blocked" (state D), "user" (in its own code), "waiting" (in a
    # library), "joining" (its program has ended, a thread has not), "exiting" (its program has ended,
    # the interpreter is shutting down), "unknown", "gone"
    where: str  # "train.py:88 in on_batch_end", "waiting in TensorFlow (execute.py:53 in quick_execute)"
    library: str = ""  # "waiting": the library its main thread is in ("TensorFlow", "numpy", ...)
    frames: tuple[Frame, ...] = ()  # its main thread's frames (innermost first), where a stack was read


def threads(text: str) -> list[list[Frame]]:
    """Every thread's frames (innermost first) in the order faulthandler wrote them. Of several
    dumps in ``text`` (one per request, appended), the last is read: a dump starts again where a
    thread id repeats."""
    blocks: list[list[Frame]] = []
    seen: set[str] = set()
    current: list[Frame] | None = None
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            if head.group(2) in seen:
                blocks, seen = [], set()
            seen.add(head.group(2))
            current = []
            blocks.append(current)
            continue
        match = _FRAME.match(line)
        if match and current is not None:
            current.append(Frame(match.group(1), int(match.group(2)), match.group(3).strip()))
    return blocks


def main_thread(stacks: list[list[Frame]]) -> list[Frame]:
    """The main thread's frames: the last block that did not start in ``threading``."""
    for frames in reversed(stacks):
        if frames and not (frames[-1].function in ("_bootstrap", "_bootstrap_inner")
                           and frames[-1].path.endswith("threading.py")):
            return frames
    return stacks[-1] if stacks else []


def main_thread_ended(text: str) -> bool:
    """Whether the main thread of the last dump in ``text`` runs no Python code any more: its block
    (the last: faulthandler lists the newest thread first) says ``<no Python frame>``."""
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if _THREAD.match(line)]
    return bool(heads) and _NO_FRAME in (line.strip() for line in lines[heads[-1] + 1:])


def stand(task: str, reply: dict | None) -> Standing:
    """Where ``task`` stood, from its host agent's dump reply (``procs``: pid, state, command;
    ``stacks``: faulthandler text) or ``None`` when no reply came."""
    if reply is None:
        return Standing(task, "unknown", "no reply from its host agent")
    procs = reply.get("procs") or []
    if not procs:
        return Standing(task, "gone", "no process left")
    if any(state in ("T", "t") for _pid, state, _cmd in procs):
        return Standing(task, "stopped", "its process is stopped (state T)")
    blocked = [pid for pid, state, _cmd in procs if state == "D"]
    if blocked:
        channel = (reply.get("wchan") or {}).get(str(blocked[0])) or ""
        at = f" at {channel}" if channel else ""
        return Standing(task, "blocked", f"its process is blocked in the kernel (state D{at}): a disk, a network "
                                         f"filesystem, a driver or a frozen cgroup holds it")
    text = reply.get("stacks") or ""
    if main_thread_ended(text):
        return Standing(task, "exiting", "its program has ended: the interpreter is shutting down "
                                         "(no Python frame on its main thread)")
    blocks = threads(text)
    frames = main_thread(blocks)
    if not frames:
        return Standing(task, "unknown", "no Python stack (not a Python task ddlctl started)")
    if frames[-1].function == "_shutdown" and frames[-1].path.endswith("threading.py"):
        return Standing(task, "joining", "its program has ended but waits for a thread that has not ended (one "
                                         f"not started as a daemon): {_busy_thread(blocks, frames)}",
                        frames=tuple(frames))
    innermost = next((f for f in frames if f.kind != "stdlib"), None)
    if innermost is None:
        return Standing(task, "waiting", f"in the standard library ({frames[0]})", "the standard library",
                        tuple(frames))
    if innermost.kind == "user":
        return Standing(task, "user", _short(innermost), frames=tuple(frames))
    user = next((f for f in frames if f.kind == "user"), None)
    tail = f", called from {_short(user)}" if user is not None else ""
    library = _library_name(innermost)
    return Standing(task, "waiting", f"waiting in {library} ({_short(innermost)}{tail})", library, tuple(frames))


def _busy_thread(blocks: list[list[Frame]], main: list[Frame]) -> str:
    """Where the first other thread with a frame outside the standard library stands."""
    for frames in blocks:
        if frames is main:
            continue
        own = next((f for f in frames if f.kind != "stdlib"), None)
        if own is not None:
            return f"a thread at {_short(own)}"
    return "a thread in the standard library"


def _short(frame: Frame) -> str:
    parts = frame.path.split("/")
    return f"{'/'.join(parts[-2:]) if len(parts) > 1 else frame.path}:{frame.line} in {frame.function}"


def _library_name(frame: Frame) -> str:
    path = frame.path
    for marker in _LIBRARY:
        if marker in path:
            package = path.split(marker, 1)[1].split("/", 1)[0]
            return {"tensorflow": "TensorFlow", "keras": "Keras", "tf_keras": "Keras"}.get(package, package)
    return "ddlctl's instrumentation" if "/ddlctl/" in path else "a library"
