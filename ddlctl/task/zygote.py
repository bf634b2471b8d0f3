"""The fork server of a host agent (started by :class:`ddlctl.host.prefork.Zygote`).

Importing TensorFlow costs 3-4 CPU-seconds, most of a task's start (and of a restart). A zygote
imports it once, then forks each TensorFlow task of its host agent from that state: the task runs
in a fresh child as ``python script.py`` or ``python -m module`` would, with its own environment,
folder, output pipe, process group and CPU limits, and is its agent's child (the agent is a child
subreaper; the zygote forks twice), so the agent waits for it, signals it and sees its exit as it
does for a task it started itself. ``/proc/PID/environ`` and ``/proc/PID/cmdline`` of the task
read as the task's own (the zygote's blocks are rewritten in place: it starts with room for them),
so every tool that finds a run's processes by their environment (``ddlctl stop``, the telemetry
agent, ``/proc/self/environ`` in a graph) finds the task as before.

Whatever cannot be set up in the fork (a block too small, an error) ends in ``execve`` of the task's
own command: the same pid, a plain start. Standard library only.

Protocol (a ``SOCK_SEQPACKET`` socket, one JSON object a message): the zygote says
``{"ready": true}`` once TensorFlow is imported (or ``{"error": ...}`` and exits); the agent sends
``{"id", "argv", "env", "cwd", "agent_pid", "cgroup", "cpus"}`` with the write end of the task's
output pipe attached (``SCM_RIGHTS``); the zygote answers ``{"id", "pid"}`` (or ``{"id", "error"}``)
once the task is its agent's child.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

from ddlctl.contract.zygote import ARGV_ROOM, ROOM_BYTES, ROOM_VAR, ZYGOTE_CWD  # noqa: F401 - the agent's terms

#: The warning Python 3.12 gives at every fork of a process with threads (TensorFlow's import leaves
#: one waiting): silenced in the zygote alone.
FORK_WARNING = r".*fork\(\) may lead to deadlocks"
REPARENT_S = 5.0
#: The top-level modules :func:`preload` imports.
PRELOADED = ("tensorflow", "keras", "tf_keras")
#: What the import printed (TensorFlow's start-up notices: "Could not find cuda drivers ..."), at
#: most this much: written into a forked task's output when its program imports TensorFlow, where
#: a plain start prints it.
IMPORT_OUTPUT_MAX = 64 * 1024
_import_output = b""


def _send(sock: socket.socket, message: dict) -> None:
    sock.send(json.dumps(message).encode())


def preload() -> None:
    """Import what TensorFlow tasks import first: TensorFlow, and Keras as TensorFlow would load it;
    with the collector off, and what the import made frozen (:mod:`ddlctl.task.gcfreeze`: a
    forked task's collections and its Python's shutdown then skip it)."""
    import warnings

    from ddlctl.task.gcfreeze import collector_off_then_frozen

    warnings.filterwarnings("ignore", message=FORK_WARNING, category=DeprecationWarning)
    with collector_off_then_frozen():
        import tensorflow  # noqa: F401

        try:
            if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
                import tf_keras  # noqa: F401
            else:
                import keras  # noqa: F401
        except ImportError:
            pass


def serve(sock: socket.socket) -> Callable[[], None]:
    """Fork tasks on request until the agent closes the socket (then exit); in a forked task,
    return what runs it."""
    while True:
        try:
            message, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 4)
        except OSError:
            os._exit(0)
        if not message:
            os._exit(0)
        try:
            request = json.loads(message)
        except ValueError:
            for fd in fds:
                os.close(fd)
            continue
        reader, writer = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        middle = os.fork()
        if middle == 0:  # forks the task and leaves at once: the task is then the agent's child
            os.close(reader)
            try:
                task = os.fork()
            except OSError as exc:
                os.write(writer, json.dumps({"error": str(exc)}).encode())
                os._exit(1)
            if task == 0:
                os.close(writer)
                sock.close()
                return become(request, fds[0] if fds else -1)
            with contextlib.suppress(OSError):
                os.setpgid(task, task)  # (the task does so too: whichever runs first)
            os.write(writer, json.dumps({"pid": task}).encode())
            os._exit(0)
        os.close(writer)
        chunks = []
        while True:
            chunk = os.read(reader, 4096)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(reader)
        os.waitpid(middle, 0)
        for fd in fds:
            os.close(fd)
        try:
            answer = json.loads(b"".join(chunks) or b"{}")
        except ValueError:
            answer = {}
        if "pid" not in answer:
            answer.setdefault("error", "the fork failed")
        _send(sock, {"id": request.get("id"), **answer})


def _proc_blocks() -> tuple[int, int, int, int]:
    """(arg_start, arg_end, env_start, env_end) of this process, from ``/proc/self/stat``."""
    with open("/proc/self/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    # after the command's closing parenthesis the fields are numbered from 3 (state); proc(5): 48-51
    arg_start, arg_end, env_start, env_end = (int(f) for f in fields[48 - 3:52 - 3])
    return arg_start, arg_end, env_start, env_end


def _block(strings: list[str]) -> bytes:
    """``strings`` as a process's argv or environment block holds them: each NUL-terminated."""
    return b"".join(s.encode("utf-8", "surrogateescape") + b"\0" for s in strings)


def _write(start: int, end: int, data: bytes) -> None:
    """``data`` over this process's block [start, end), NUL-padded (it fits: checked before)."""
    import ctypes

    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)


def _clear_libc_environment() -> None:
    import ctypes

    ctypes.CDLL(None).clearenv()


def become(request: dict, out_fd: int) -> Callable[[], None]:
    """In the forked task: take its identity; what runs its program. A step that fails execs the
    task's own command instead (same pid)."""
    argv: list[str] = request["argv"]
    env: dict[str, str] = request["env"]
    try:
        from ddlctl.host import procsetup

        procsetup.own_group_and_limits(request.get("cgroup"), set(request["cpus"]) if request.get("cpus") else None)
        # the agent's child once the middle process has gone: from then on, die with the agent
        deadline = time.monotonic() + REPARENT_S
        while os.getppid() != request["agent_pid"] and time.monotonic() < deadline:
            time.sleep(0.0005)
        procsetup.die_with_parent()
        if os.getppid() != request["agent_pid"]:
            os._exit(137)  # the agent is gone (or never became the parent): nothing to run for
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        if out_fd >= 0:
            os.dup2(out_fd, 1)
            os.dup2(out_fd, 2)
            os.close(out_fd)
        if request.get("cwd"):
            os.chdir(request["cwd"])
            _rebase_pythonpath(env.get("PYTHONPATH", ""))
        return _take_identity(argv, env)
    except Exception as exc:  # noqa: BLE001 - whatever it was, the task starts the plain way
        _exec(argv, env, f"{type(exc).__name__}: {exc}")
        raise  # (not reached)


def _rebase_pythonpath(pythonpath: str) -> None:
    """``sys.path`` entries of relative ``PYTHONPATH`` folders as the task's folder makes them:
    Python made each absolute at start-up (``site``), in the zygote against ``/``; a plain start
    makes it against the task's folder. Finders cached for the old paths are dropped."""
    import importlib

    def canonical(path: str) -> str:  # (Python's start-up writes "lib" in "/" as "//lib")
        return os.path.normpath("/" + path.lstrip("/")) if path.startswith("/") else path

    moved = {canonical(os.path.join(ZYGOTE_CWD, entry)): os.path.abspath(entry)
             for entry in pythonpath.split(os.pathsep) if entry and not os.path.isabs(entry)}
    if not moved:
        return
    for i, path in enumerate(sys.path):
        if canonical(path) in moved:
            sys.path_importer_cache.pop(path, None)
            sys.path[i] = moved[canonical(path)]
    importlib.invalidate_caches()


def _say_import_output_at_first_import() -> None:
    """Write what the zygote's import printed (TensorFlow's start-up notices) into this task's
    output when its program first imports TensorFlow or Keras, where a plain start prints it (a
    program that never does, or does not compile, prints none). The import statement calls
    ``builtins.__import__`` (even for a module already imported) once that is not Python's own: a
    wrapper stands there until that import, then Python's is put back."""
    import builtins

    original = builtins.__import__

    def first_import(name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - __import__'s
        level = args[3] if len(args) > 3 else kwargs.get("level", 0)
        if level == 0 and name.partition(".")[0] in PRELOADED and builtins.__import__ is first_import:
            builtins.__import__ = original
            sys.stderr.flush()
            data = _import_output
            with contextlib.suppress(OSError):
                while data:
                    data = data[os.write(2, data):]
        return original(name, *args, **kwargs)

    if _import_output:
        builtins.__import__ = first_import


def _printed(call: Callable[[], None]) -> bytes:
    """Run ``call`` with file descriptor 2 going to a spool; what it printed there (the first
    :data:`IMPORT_OUTPUT_MAX` bytes). Python's own writes go through descriptor 2 too."""
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as spool:
        os.dup2(spool.fileno(), 2)
        try:
            call()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        spool.seek(0)
        return spool.read(IMPORT_OUTPUT_MAX)


def _exec(argv: list[str], env: dict[str, str], why: str) -> None:
    """Run the task's own command in this process (a fork that could not become the task); why in
    ``fork-fallback.txt`` of its folder."""
    with contextlib.suppress(OSError):
        if env.get("DDLCTL_TASK_DIR"):
            with open(os.path.join(env["DDLCTL_TASK_DIR"], "fork-fallback.txt"), "a") as handle:
                handle.write(why + "\n")
    try:
        os.execvpe(argv[0], argv, env)
    finally:
        os._exit(127)


def _take_identity(argv: list[str], env: dict[str, str]) -> Callable[[], None]:
    """Environment, blocks in /proc, signals, random state, ``sys.argv``/``sys.path``; the runner."""
    arg_start, arg_end, env_start, env_end = _proc_blocks()
    env_block, argv_block = _block([f"{k}={v}" for k, v in env.items()]), _block(argv)
    if len(env_block) > env_end - env_start or len(argv_block) > arg_end - arg_start:
        _exec(argv, env, "the command or the environment is longer than the zygote's room for them")
    os.environ.clear()
    _clear_libc_environment()  # nothing points into the old block any more
    os.environ.update(env)
    _write(env_start, env_end, env_block)
    _write(arg_start, arg_end, argv_block)
    import tempfile

    tempfile.tempdir = None  # (TMPDIR is the task's)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import warnings

    warnings.filters[:] = [f for f in warnings.filters if getattr(f[1], "pattern", None) != FORK_WARNING]
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    from ddlctl.task import stack_dumper as stacks

    stacks.install()  # (the zygote had no task folder: nothing registered before; its model.fit
    # hook, installed when it started, is the task's: DDLCTL_AUTO_STEPS is the same in both)
    return _runner(argv, env)


def _runner(argv: list[str], env: dict[str, str]) -> Callable[[], None]:
    """What ``python [-u] script.py ARGS`` or ``python [-u] -m module ARGS`` would run."""
    import builtins
    import runpy
    import types

    rest = argv[1:]
    if rest and rest[0] == "-u":
        rest = rest[1:]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    safe = bool(env.get("PYTHONSAFEPATH"))
    if rest[0] == "-m":
        module, args = rest[1], rest[2:]
        if not safe:
            sys.path.insert(0, os.getcwd())
        sys.argv = ["-m", *args]

        def run_module() -> None:
            sys.modules["__main__"] = main
            _say_import_output_at_first_import()
            runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]

        return _as_python_would(run_module)
    script, args = rest[0], rest[1:]
    if not safe:
        sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    sys.argv = [script, *args]
    main.__dict__.update(__file__=os.path.abspath(script), __cached__=None, __loader__=None, __spec__=None,
                         __package__=None)

    def run_script() -> None:
        import io

        sys.modules["__main__"] = main
        with io.open_code(os.path.abspath(script)) as handle:
            source = handle.read()
        code = compile(source, os.path.abspath(script), "exec")
        _say_import_output_at_first_import()
        exec(code, main.__dict__)  # noqa: S102 - the task's own program

    return _as_python_would(run_script)


def _as_python_would(run: Callable[[], None]) -> Callable[[], None]:
    """``run``, with what Python does with an exception its program left uncaught:
    ``sys.excepthook`` with the program's frames alone (not this module's runner frames), then exit
    status 1. A syntax error of the script then reads as Python shows one (no "Traceback" line).
    An uncaught KeyboardInterrupt (Ctrl-C) is said so too, then raised on with nothing more said:
    the interpreter ends as Python does after one, by SIGINT once it has finalised."""
    def runner() -> None:
        try:
            run()
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - said as Python says it
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == runner.__code__.co_filename:
                tb = tb.tb_next
            sys.excepthook(type(exc), exc.with_traceback(tb), tb)
            if isinstance(exc, KeyboardInterrupt):
                sys.excepthook = lambda *_: None
                raise
            raise SystemExit(1) from None

    return runner


def main(argv: list[str]) -> Callable[[], None]:
    """Import TensorFlow, say so, serve forks; in a forked task, what runs it."""
    sock = socket.socket(fileno=int(argv[0]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent's to handle; a task gets its own back
    global _import_output
    try:
        _import_output = _printed(preload)
    except BaseException as exc:  # noqa: BLE001 - said to the agent, which starts tasks the plain way
        _send(sock, {"error": f"{type(exc).__name__}: {exc}"[:2000]})
        with contextlib.suppress(OSError):  # until the agent has read it (unread requests here
            while sock.recv(1 << 20):       # would reset the connection, losing the message)
                pass
        os._exit(1)
    _send(sock, {"ready": True})
    return serve(sock)


if __name__ == "__main__":
    main(sys.argv[1:])()
