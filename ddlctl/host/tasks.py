"""One task of a host agent (:mod:`ddlctl.host.agent`): its environment, folder, CPU limits
and process, started the plain way (``subprocess``) or forked by a zygote (:mod:`ddlctl.host.prefork`).
Standard library only."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time

from ddlctl.contract import envvars
from ddlctl.contract.rundir import TASK_PHASES, TASK_STEPS
from ddlctl.host import cgroup, procsetup
from ddlctl.host.devices import visible_devices
from ddlctl.host.prefork import ForkedProcess, Zygote, command_form
from ddlctl.host.procs import processes_with
from ddlctl.host.stepfollow import PhaseFile, StepFile

# gRPC channel arguments for every task of a TensorFlow cluster, unless the host or the user set
# their own. Tasks start in any order: a task that connects to a peer still importing TensorFlow
# fails, and gRPC waits its initial reconnect backoff (1 s by default; TensorFlow caps the later
# ones at 1 s) before trying again. That wait was ~1 s of every ps launch here; with 50 ms the
# retries are 50, 80, 128... ms, still capped at TensorFlow's 1 s. The connect timeout is untouched.
GRPC_OPTIONS = "grpc.initial_reconnect_backoff_ms=50"

# glibc's malloc hands the free memory at the top of a heap back to the kernel once it exceeds its
# trim threshold, and a TensorFlow step frees and allocates its tensors again: every step then
# faults its memory back in page by page, zeroed by the kernel (the built-in deep workload on CPU:
# 23,000 faults per step, half of its CPU time in the kernel). Keeping 64 MiB at the top of each heap
# ends that (benchmarks/malloc_pad.py: runs of 200 steps 1.9x faster for deep, 1.5x for mlp, 1.14x
# for cnn, for 40-110 MiB more memory). Not set where the environment already tunes glibc's malloc.
MALLOC_TOP_PAD_BYTES = 64 * 2**20
MALLOC_SETTINGS = ("MALLOC_TOP_PAD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_")


def keep_freed_memory(env: dict[str, str]) -> None:
    """Give ``env`` glibc's ``MALLOC_TOP_PAD_`` (:data:`MALLOC_TOP_PAD_BYTES`) unless it already sets
    one of glibc's malloc thresholds (as a variable or in ``GLIBC_TUNABLES``)."""
    if any(name in env for name in MALLOC_SETTINGS) or "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        return
    env["MALLOC_TOP_PAD_"] = str(MALLOC_TOP_PAD_BYTES)


def runs_own_module(argv: list) -> bool:
    """Whether ``argv`` is ``PYTHON -m ddlctl...``: one of ddlctl's own modules (its server, the
    built-in workload, the telemetry agent, the device bench)."""
    return len(argv) > 2 and argv[1] == "-m" and str(argv[2]).split(".")[0] == "ddlctl"


def unsafe_folder(path: str) -> str | None:
    """Why another user could plant code where a task would start (its folder is first on a Python
    program's ``sys.path``): the folder is someone else's, or others may write to it. None: safe."""
    try:
        info = os.stat(path)
    except OSError:
        return None  # (a folder that is not there fails the start, saying so)
    if info.st_uid != os.getuid():
        return f"it belongs to another user (uid {info.st_uid})"
    if info.st_mode & 0o002:
        return "other users may write to it"
    if info.st_mode & 0o020 and not _private_group(info.st_gid):
        return f"its group (gid {info.st_gid}) may write to it, and others are in that group"
    return None


def _private_group(gid: int) -> bool:
    """Whether group ``gid`` is this user's own (a user private group: their primary group, with
    no other member), so that its write permission lets nobody else in."""
    import grp
    import pwd

    try:
        group, me = grp.getgrgid(gid), pwd.getpwuid(os.getuid())
    except KeyError:
        return False
    return gid == me.pw_gid and set(group.gr_mem) <= {me.pw_name} and not any(
        p.pw_gid == gid and p.pw_uid != me.pw_uid for p in pwd.getpwall())


def start_error(spec: dict, exc: OSError) -> str:
    """Why a task could not be started, naming what to look at."""
    cwd = spec.get("cwd")
    what = (f"working directory {cwd!r} does not exist" if cwd and not os.path.isdir(os.path.expanduser(cwd))
            else f"cpu_quota={spec['cpu_quota']} on this host" if isinstance(exc, cgroup.QuotaError)
            else f"cpus={cgroup.cpu_ranges(spec['cpus'])} on this host" if isinstance(exc, cgroup.CpusError)
            else f"cannot start {spec['argv'][0]!r}")
    reason = exc if isinstance(exc, (cgroup.QuotaError, cgroup.CpusError)) else (exc.strerror or exc)
    return f"{what}: {reason}"


class BadEnvironment(ValueError):
    """A task's spec holds an environment entry no process can be given."""


class MissingProgram(ValueError):
    """A task's command runs a Python script that is not on this host."""


def missing_program(argv: list[str], cwd: str) -> str | None:
    """Why ``python SCRIPT ...`` cannot run in ``cwd`` (the script is not there), or None."""
    form = command_form(argv)
    if form is None or form[1] != "script" or not os.path.isdir(cwd):  # (a missing folder is said as such)
        return None
    path = os.path.join(cwd, os.path.expanduser(form[2]))
    if os.path.isfile(path):
        return None
    return (f"the program {os.path.normpath(path)} is not on {socket.gethostname()} (tasks run {form[2]} from "
            f"{cwd}): put it at the same path on every host, or give this host workdir= in the hosts file")


class Task:
    """One task process and what the agent knows about it."""

    def __init__(self, name: str, spec: dict) -> None:
        self.name = name
        self.grace = float(spec.get("grace", 5.0))
        self.task_dir = os.path.expanduser(spec.get("task_dir") or "")
        for key, value in spec.get("env", {}).items():
            problem = envvars.env_entry_problem(key, value)
            if problem is not None:  # refused for this task alone (the agent and its other tasks go on)
                raise BadEnvironment(problem)
        env = dict(os.environ)
        # nothing from the working directory for ddlctl's own modules; a program is run as Python
        # runs it (the agent's own PYTHONSAFEPATH is not passed on unless the spec's env gives it)
        if runs_own_module(spec["argv"]):
            env[envvars.SAFE_PATH] = "1"
        else:
            env.pop(envvars.SAFE_PATH, None)
        for key in spec.get("unset", []):
            env.pop(key, None)
        for key, value in spec.get("env", {}).items():
            env[key] = os.path.expanduser(value) if key in (envvars.TASK_DIR, envvars.CHECKPOINT_DIR) else value
        if "TF_CONFIG" in env:
            env.setdefault("TF_GRPC_DEFAULT_OPTIONS", GRPC_OPTIONS)
        keep_freed_memory(env)
        # temporary files in the task's folder, removed when it ends: a task killed at the end of a
        # job runs no atexit hook, and TensorFlow's autograph leaves a file in /tmp per traced function
        self.tmp = os.path.join(self.task_dir, "tmp") if self.task_dir and "TMPDIR" not in env else None
        if self.tmp:
            os.makedirs(self.tmp, exist_ok=True)
            env["TMPDIR"] = self.tmp
        if "CUDA_VISIBLE_DEVICES" in spec.get("env", {}):
            env["CUDA_VISIBLE_DEVICES"] = visible_devices(spec["env"]["CUDA_VISIBLE_DEVICES"],
                                                          os.environ.get("CUDA_VISIBLE_DEVICES"))
        if spec.get("pythonpath"):
            path = os.pathsep.join(os.path.expanduser(p) for p in spec["pythonpath"])
            env["PYTHONPATH"] = path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        for folder in spec.get("mkdirs", []):
            os.makedirs(os.path.expanduser(folder), exist_ok=True)
        cwd = os.path.expanduser(spec["cwd"]) if spec.get("cwd") else None
        self.note: str | None = None
        why = unsafe_folder(cwd) if cwd and spec.get("cwd_default") else None
        if why:  # the controller's folder by default: not where someone else can put a json.py
            home = os.path.expanduser("~")
            self.note = (f"starting in {home}, not in {cwd}: {why} (workdir= in the hosts file chooses where "
                         "tasks start)")
            cwd = home
        missing = missing_program(list(spec["argv"]), cwd or os.getcwd())
        if missing is not None:
            raise MissingProgram(missing)
        self.cgroup = None
        # CPU affinity: TensorFlow sizes its thread pools to the CPUs a process may run on
        cpus = cgroup.check_cpus(spec["cpus"]) if spec.get("cpus") else None
        if spec.get("cpu_quota"):
            group = f"{os.environ.get(envvars.RUN_ID, 'run')}-{name.replace(':', '-')}-{os.getpid()}"
            self.cgroup = cgroup.create(group, float(spec["cpu_quota"]))
            # TensorFlow's op thread pools as wide as the quota (unless the program says otherwise)
            threads = cgroup.intra_op_threads(float(spec["cpu_quota"]))
            env.setdefault("TF_NUM_INTRAOP_THREADS", str(min(threads, len(cpus)) if cpus else threads))
        self.argv: list[str] = list(spec["argv"])
        # no folder given: the agent's, for a plain start and a fork alike (a zygote runs in its own)
        self.env, self.cwd, self.cpus = env, cwd or os.getcwd(), cpus
        self.popen: subprocess.Popen[bytes] | ForkedProcess | None = None  # None: a fork asked for
        self.fd = -1
        self.pgid = 0
        self.fork_note: str | None = None  # why a task meant to be forked was started the plain way
        self.zygote_pid: int | None = None  # the zygote that forked it
        self.fork_out = -1  # the output pipe's reading end while a fork is asked for
        self.held_signal: int | None = None  # a signal that came before the fork's pid
        self.kill_at: float | None = None
        self.status: int | None = None
        self.exited_at: float | None = None
        self.started_us = 0  # the kernel log's clock at its start, and the host's OOM kills then
        self.oom_kills: int | None = None
        self.killed = False  # ddlctl sent it SIGKILL
        self.eof = False
        self.steps = StepFile(os.path.join(self.task_dir, TASK_STEPS)) if self.task_dir else None
        self.phases = PhaseFile(os.path.join(self.task_dir, TASK_PHASES)) if self.task_dir else None
        self.reported_steps: tuple = ()
        self.port = int(spec.get("port") or 0)
        self.listening = not self.port

    def executable(self) -> str | None:
        """Where its command's first word is, as the start looked it up (its PATH; its folder for a
        relative path): which Python a "No module named" was said by."""
        first = self.argv[0] if self.argv else ""
        if os.sep in first:
            return os.path.normpath(os.path.join(self.cwd, os.path.expanduser(first)))
        return shutil.which(first, path=self.env.get("PATH")) if first else None

    def spawn(self) -> None:
        """Start the task the plain way (OSError: it could not be started; its CPU group is removed)."""
        prctl = procsetup.libc_prctl()

        def child_setup() -> None:  # in the task, before exec
            procsetup.own_group_and_limits(self.cgroup, self.cpus)
            procsetup.die_with_parent(prctl)

        try:
            self.popen = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd,
                                          preexec_fn=child_setup)
        except OSError:
            self.release()
            raise
        assert self.popen.stdout is not None
        self._started(self.popen.stdout.fileno())

    def ask_fork(self, zygote: Zygote) -> bool:
        """Ask ``zygote`` to fork the task; False if it cannot (start it the plain way)."""
        try:
            reader, writer = os.pipe()
        except OSError:
            return False
        try:
            asked = zygote.request(self.name, self.argv, self.env, self.cwd, writer, self.cgroup, self.cpus)
        finally:
            os.close(writer)
        if asked:
            self.fork_out = reader
        else:
            os.close(reader)
        return asked

    def forked_as(self, pid: int, zygote_pid: int | None = None) -> None:
        """The zygote (``zygote_pid``) forked the task: ``pid``, now this agent's child."""
        self.zygote_pid = zygote_pid
        self.popen = ForkedProcess(pid, self.fork_out)
        self.fork_out = -1
        self._started(self.popen.stdout.fileno())

    @property
    def forked(self) -> bool:
        return isinstance(self.popen, ForkedProcess)

    def fork_failed(self, why: str) -> None:
        """The fork did not happen: start the task the plain way (OSError as from :meth:`spawn`)."""
        self.close_fork_pipe()
        self.fork_note = why
        self.spawn()

    def close_fork_pipe(self) -> None:
        """Close the output pipe kept for a fork that will not happen."""
        if self.fork_out >= 0:
            os.close(self.fork_out)
            self.fork_out = -1

    def _started(self, fd: int) -> None:
        assert self.popen is not None
        self.fd = fd
        os.set_blocking(self.fd, False)
        self.pgid = self.popen.pid
        if self.held_signal is not None:
            self.terminate(self.held_signal, time.monotonic())

    def release(self) -> None:
        """Remove the task's CPU-quota group (once nothing runs in it) and its temporary files."""
        if self.cgroup:
            cgroup.remove(self.cgroup)
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def signal(self, sig: int) -> None:
        if sig == signal.SIGKILL and self.status is None:
            self.killed = True  # (its SIGKILL is then ddlctl's, not the OOM killer's)
        if self.popen is None:  # not forked yet: signalled as soon as it is (a SIGKILL is never undone)
            if self.held_signal != signal.SIGKILL:
                self.held_signal = sig
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def sweep(self, exclude: set[int]) -> list[int]:
        """SIGKILL what the task started outside its process group (a daemon in a session of its own:
        ``setsid``, ``start_new_session=True``), found by its environment (this run, this task),
        once the task itself has ended: nothing a task started outlives it, as under Slurm. The pids
        killed (``exclude``: the agent's own processes, zygotes among them)."""
        run_id = self.env.get(envvars.RUN_ID)
        if not run_id:
            return []
        ours = [f"{envvars.RUN_ID}={run_id}", f"{envvars.TASK}={self.name}"]
        for key in (envvars.TASK_DIR, envvars.LAUNCH):  # (another run of the same --run-id is not this one)
            if self.env.get(key):
                ours.append(f"{key}={self.env[key]}")
        killed = []
        for pid in processes_with(ours, exclude):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        return killed

    def terminate(self, sig: int, now: float) -> None:
        """``sig`` to the group now; SIGKILL after the grace period (unless it was SIGKILL)."""
        self.signal(sig)
        if sig != signal.SIGKILL and self.kill_at is None:
            self.kill_at = now + self.grace
