"""Which tasks a host agent forks from a zygote (:mod:`ddlctl.task.zygote`), and the agent's end
of a zygote. Standard library only (it runs in the host agent).

A task is forked when its command is ``PYTHON [-u] SCRIPT ARGS`` with a script that imports
TensorFlow or Keras, ``PYTHON [-u] -m MODULE ARGS`` with such a module of the task's folder or
``PYTHONPATH``, or ``PYTHON [-u] -m ddlctl.workloads|ddlctl.task.server`` (the built-in workload,
ps servers) or ``-m ddlctl.task.devbench devices`` (``--bench``'s device measurement), on a host without
NVIDIA devices (a CUDA context does not survive a fork, and whether an import creates one is not
ddlctl's to promise), unless its environment says ``DDLCTL_PREFORK=0``. Tasks share a zygote when
their interpreter and environment agree in everything but what a task reads after its imports
(:data:`PER_TASK`: its identity, cluster, folders, threads, devices).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import socket
import subprocess

from ddlctl.contract import envvars
from ddlctl.contract.zygote import ARGV_ROOM, ROOM_BYTES, ROOM_VAR, ZYGOTE_CWD
from ddlctl.host import procsetup

#: ``0`` in a task's environment (``ddlctl launch --no-prefork``): the task starts the plain way.
OFF_VAR = envvars.PREFORK
#: What a TensorFlow task reads after its imports: tasks that differ only in these share a zygote.
PER_TASK = frozenset({
    "TF_CONFIG", envvars.TASK, envvars.TASK_DIR, envvars.RESTART_COUNT, envvars.NUM_WORKERS, envvars.DEVICES,
    envvars.BALANCE, envvars.SPEEDS, envvars.TOTAL_STEPS, envvars.CHECKPOINT_DIR, "TMPDIR", "CUDA_VISIBLE_DEVICES",
    envvars.PROFILER_SERVE, envvars.PROFILER_ADDRESSES,
    "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", envvars.SAFE_PATH, "DDLCTL_SERVER_FULL_IMPORT", OFF_VAR,
    "TF_FORCE_GPU_ALLOW_GROWTH",  # (read when the GPUs are first used: after the fork)
    "TF_GRPC_DEFAULT_OPTIONS",  # (read when a gRPC channel is made; a task with TF_CONFIG gets it)
})
#: ddlctl's own modules that import TensorFlow (its telemetry agent does not fork), with the first
#: argument that makes them import it (None: any). ``--bench``'s device measurement forks too: on
#: a host with ``cpu_quota=`` its import is then not throttled, only the timed matrix products are;
#: its link measurements import no TensorFlow (forked, they would end as a TensorFlow process does,
#: a CPU-second later).
OWN_MODULES = {"ddlctl.workloads": None, "ddlctl.task.server": None, "ddlctl.task.devbench": "devices"}
_IMPORTS = re.compile(rb"^[ \t]*(?:import|from)[ \t]+(?:tensorflow|keras|tf_keras)\b", re.M)
#: A program that changes its own environment (``os.environ[...] =``, ``.setdefault``, ``.update``,
#: ``putenv``) may do so before its imports read it (``KERAS_BACKEND``, ``TF_CPP_MIN_LOG_LEVEL``):
#: in a zygote they were read already, so such a program starts the plain way.
_SETS_ENVIRONMENT = re.compile(rb"environ\s*(?:\[[^\]\n]*\]\s*=(?!=)|\.setdefault\s*\(|\.update\s*\()|putenv\s*\(")
#: What ddlctl's own modules set before they import TensorFlow (``tfenv.quiet_tensorflow_logs``):
#: given to their zygote, which imports TensorFlow for them.
OWN_MODULES_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}
_PYTHON = re.compile(r"python[0-9.]*")
#: Where this ddlctl's code is (a folder, or the code bundle's zip on a remote host).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The zygote's program: this ddlctl's (another copy the interpreter imported first, through the
#: instrumentation's ``sitecustomize``, is forgotten), leaving the folder off ``sys.path`` again
#: (ddlctl's modules are found through the imported package).
ZYGOTE_MAIN = ("import sys; r = sys.argv[1]; sys.path.insert(0, r); "
               "[sys.modules.pop(m) for m in list(sys.modules) if m.split('.')[0] == 'ddlctl' "
               "and not (getattr(sys.modules[m], '__file__', None) or '').startswith(r)]; "
               "import ddlctl.task.zygote as z; sys.path.remove(r); z.main(sys.argv[2:])()")


def command_form(argv: list[str]) -> tuple[tuple[str, ...], str, str] | None:
    """(interpreter and its ``-u``, ``"-m"`` or ``"script"``, module or script) of a plain Python
    command, or None for any other command."""
    if len(argv) < 2 or not _PYTHON.fullmatch(os.path.basename(str(argv[0]))):
        return None
    at = 2 if argv[1] == "-u" else 1
    prefix = tuple(argv[:at])
    if at >= len(argv):
        return None
    if argv[at] == "-m":
        return (prefix, "-m", argv[at + 1]) if at + 1 < len(argv) else None
    if argv[at].startswith("-"):
        return None
    return prefix, "script", argv[at]


def gpu_host() -> bool:
    """Whether this host has NVIDIA devices."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def forkable(argv: list[str], env: dict[str, str], cwd: str | None) -> bool:
    """Whether this task is started from a zygote (see the module's docstring)."""
    form = command_form(argv)
    if form is None or env.get(OFF_VAR) == "0" or gpu_host():
        return False
    prefix, kind, target = form
    folder = cwd or os.getcwd()
    if kind == "-m":
        if target in OWN_MODULES:
            first_argument = argv[len(prefix) + 2] if len(argv) > len(prefix) + 2 else None
            return OWN_MODULES[target] in (None, first_argument)
        found = module_files(target, folder, env)
        if not found:
            return False
        *packages, program = found
    else:
        packages, program = [], os.path.join(folder, target)
    sources = [_read(path) for path in (*packages, program)]
    return all(source is not None and not _SETS_ENVIRONMENT.search(source) for source in sources) \
        and bool(_IMPORTS.search(sources[-1] or b""))


def module_files(module: str, cwd: str, env: dict[str, str]) -> list[str] | None:
    """The files ``python -m module`` runs, found where the task's Python looks first (its folder,
    unless ``PYTHONSAFEPATH``, then ``PYTHONPATH``): the ``__init__.py`` of each enclosing package,
    in import order, then the module's own file (a package's ``__main__.py``). None when it is not
    there (an installed module, or none: not ddlctl's to read)."""
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    roots = ([] if env.get(envvars.SAFE_PATH) else [cwd]) + \
        [os.path.join(cwd, p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    for root in roots:
        base = os.path.join(root, *parts)
        if os.path.isfile(base + ".py"):
            program, enclosing = base + ".py", len(parts) - 1
        elif os.path.isfile(os.path.join(base, "__main__.py")):
            program, enclosing = os.path.join(base, "__main__.py"), len(parts)
        else:
            continue
        packages = [os.path.join(root, *parts[:i], "__init__.py") for i in range(1, enclosing + 1)]
        return [p for p in packages if os.path.isfile(p)] + [program]  # (a namespace package has none)
    return None


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(1 << 20)
    except OSError:
        return None


def import_environment(argv: list[str], env: dict[str, str]) -> None:
    """Add to a forked task's ``env`` what its program would set before importing TensorFlow
    (ddlctl's own modules: :data:`OWN_MODULES_ENV`, unless set), so that its zygote imports alike."""
    form = command_form(argv)
    if form is not None and form[1] == "-m" and form[2] in OWN_MODULES:
        for key, value in OWN_MODULES_ENV.items():
            env.setdefault(key, value)


def zygote_key(argv: list[str], env: dict[str, str], cwd: str | None = None) -> tuple:
    """What tasks sharing a zygote agree in: the interpreter and the environment but :data:`PER_TASK`.
    An interpreter given as a relative path (``.venv/bin/python``) is the one in the task's folder
    ``cwd``, where a plain start finds it (a zygote starts in ``/``)."""
    form = command_form(argv)
    assert form is not None
    interpreter, *flags = form[0]
    if os.sep in interpreter and not os.path.isabs(interpreter):
        interpreter = os.path.normpath(os.path.join(cwd or os.getcwd(), interpreter))
    return (interpreter, *flags), tuple(sorted((k, v) for k, v in env.items() if k not in PER_TASK))


class Zygote:
    """The agent's end of one zygote: its process, its socket, whether it is ready or failed."""

    def __init__(self, prefix: tuple[str, ...], env: dict[str, str]) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        zygote_env = {k: v for k, v in env.items() if k not in PER_TASK}
        zygote_env[envvars.SAFE_PATH] = "1"  # nothing from a folder: a task sets its own sys.path[0]
        # room in the environment block for a task's: twice what this one's own entries take (a large
        # cluster's TF_CONFIG), at least ROOM_BYTES
        own = sum(len(k) + len(v) + 2 for k, v in env.items() if k in PER_TASK)
        zygote_env[ROOM_VAR] = "x" * max(ROOM_BYTES, 2 * own)
        self.ready = False
        self.failed: str | None = None
        self.sock = mine
        prctl = procsetup.libc_prctl()

        def zygote_setup() -> None:  # its own group; it dies with the agent
            procsetup.own_group_and_limits()
            procsetup.die_with_parent(prctl)

        try:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [*prefix, "-c", ZYGOTE_MAIN, ROOT, str(theirs.fileno()), ARGV_ROOM], env=zygote_env, cwd=ZYGOTE_CWD,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), preexec_fn=zygote_setup)
        except OSError as exc:
            self.proc = None
            self.failed = f"cannot start: {exc}"
        theirs.close()
        mine.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def request(self, ident: str, argv: list[str], env: dict[str, str], cwd: str | None, out_fd: int,
                cgroup_procs: str | None, cpus: set[int] | None) -> bool:
        """Ask for a fork (the task's output pipe attached); False if the zygote cannot take it."""
        if self.failed:
            return False
        message = json.dumps({"id": ident, "argv": argv, "env": env, "cwd": cwd, "agent_pid": os.getpid(),
                              "cgroup": cgroup_procs, "cpus": sorted(cpus) if cpus else None}).encode()
        try:
            socket.send_fds(self.sock, [message], [out_fd])
        except (BlockingIOError, InterruptedError):
            return False  # too many asked for at once: this one starts the plain way
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:
                return False
            self.failed = f"unreachable: {exc}"
            return False
        return True

    def receive(self) -> list[dict]:
        """The messages that arrived (``{"ready"}``, ``{"id", "pid"}``, ``{"id", "error"}``,
        ``{"error"}``); an ended zygote is failed."""
        messages = []
        while not self.failed:
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                break
            except OSError as exc:
                data, self.failed = b"", str(exc)
            if not data:
                self.failed = self.failed or "it ended"
                break
            with contextlib.suppress(ValueError):
                message = json.loads(data)
                if message.get("ready"):
                    self.ready = True
                elif "error" in message and message.get("id") is None:
                    self.failed = str(message["error"])
                messages.append(message)
        return messages

    def close(self) -> None:
        """End the zygote (its tasks are the agent's children and go on) and wait for it."""
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.proc.kill()
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                self.proc.wait(5)


class ForkedProcess:
    """A task forked by a zygote, as the agent sees a ``Popen``: ``pid``, ``stdout``, ``poll()``."""

    def __init__(self, pid: int, out_fd: int) -> None:
        self.pid = pid
        self.stdout = os.fdopen(out_fd, "rb", buffering=0)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not (or no longer) this agent's child: gone when /proc says so
                if not os.path.exists(f"/proc/{self.pid}"):
                    self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def reap_orphans(known: set[int]) -> None:
    """Wait for the agent's children that are not tasks or zygotes (a task's orphaned descendants,
    reparented to the subreaper), so none stays a zombie."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid in known:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)
