"""Fake host agents for driving the real :class:`~ddlctl.supervise.supervisor.Supervisor` without
processes (the pattern of torch elastic's agent tests: scripted monitor results).

A :class:`World` is a scripted cluster: each task behaves as its :class:`Behaviour` says (listen,
step, print, exit, ignore SIGTERM, stop like a SIGSTOPped process) and the test adds events at
given times (``world.at(2.0, world.kill, "worker:1")``). Time is the world's own clock: it moves one
``TICK`` per supervisor tick (the supervisor calls ``on_progress`` once a tick; the world is driven
from there), so a 5 s grace period costs a hundred loop turns, not five seconds.

The fakes implement the two interfaces the supervisor uses: ``AgentSession`` (a host agent's
session) and ``TaskProcess`` (a task started through it). They import nothing of TensorFlow.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ddlctl.cluster.model import Cluster, Host
from ddlctl.console.output import PrefixedWriter
from ddlctl.contract.telemetry import GPU_FIELDS
from ddlctl.planning.plan import LaunchRequest, Plan, TaskSpec, make_plan
from ddlctl.supervise.job import SupervisorOptions
from ddlctl.supervise.results import JobResult
from ddlctl.supervise.supervisor import Supervisor
from ddlctl.transport.status import ExitStatus

TICK = 0.05
REAL_LIMIT_S = 60.0  # real seconds a fake job may take before its test fails (they take under 1 s)
SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "KILL": signal.SIGKILL}


@dataclass
class Behaviour:
    """How a fake task behaves once started."""

    exit_after: float | None = 3.0  # world seconds after start (None: runs until signalled)
    code: int = 0
    output: bytes = b""  # printed just before it exits
    listen_after: float | None = 0.2  # a task with a port listens this long after start (None: never)
    steps: bool = True  # records a step every tick while running
    ignores_term: bool = False  # like MWMS (preemption notifier): only SIGKILL ends it
    stalls_at: float | None = None  # stops stepping (a hang) this long after start
    stopped: bool = False  # SIGSTOPped: state T in dumps, ignores TERM
    kill_takes: float = 0.0  # world seconds between SIGKILL and its end (a slow host, a process in D state)
    runs_on: tuple[str, ...] = ()  # a ps chief: its steps run on these workers in turn (credited to them);
    # it stalls on a step whose worker is stopped or stalled, as a coordinator waits on its closure
    stack: str | None = None  # the faulthandler text a dump shows (default: a bland main thread)
    total: int | None = None  # its declared last step: it stops stepping there (and runs on till exit_after)
    past_python: bool = False  # stuck in native teardown: a stack request's SIGUSR2 kills it (no handler left)
    blocked: bool = False  # in the kernel (state D, a dead NFS): stops stepping, and no signal ends it
    prepares_for: float = 0.0  # takes no step this long after start (it prepares its data)
    busy: float = 0.0  # the share of a CPU its processes use (dumps say so: CPU seconds, like an agent's)
    io: float = 0.0  # bytes a second its processes read and write (dumps say so, like an agent's)


class FakeTask:
    """A task started through a fake session (the supervisor's ``TaskProcess``)."""

    def __init__(self, spec: TaskSpec, session: FakeSession, behaviour: Behaviour, attempt: int) -> None:
        self.spec = spec
        self.session = session
        self.behaviour = behaviour
        self.attempt = attempt
        self.started_at = session.world.now
        self.chunks: deque[bytes] = deque()
        self.status: ExitStatus | None = None
        self.ended_t: float | None = None
        self.eof = False
        self.listening = False
        self.steps = 0
        self.signals: list[str] = []
        self.killed_at: float | None = None
        self.pid = session.world.next_pid()

    def read(self) -> bytes | None:
        if self.chunks:
            return self.chunks.popleft()
        return b"" if self.eof else None

    def poll(self) -> ExitStatus | None:
        return self.status

    def send(self, sig: str) -> None:
        self.signals.append(sig)
        if self.status is not None or self.behaviour.blocked:
            return
        if sig == "KILL":
            if self.behaviour.kill_takes:
                self.killed_at = self.killed_at or self.session.world.now
            else:
                self.end(ExitStatus(signal=signal.SIGKILL))
        elif not (self.behaviour.ignores_term or self.behaviour.stopped):
            self.end(ExitStatus(signal=SIGNALS[sig]))

    def force_kill(self) -> None:
        self.send("KILL")

    def pids(self) -> dict[str, object]:
        return {"task_pid": self.pid, "task_pgid": self.pid}

    def end(self, status: ExitStatus, output: bytes = b"") -> None:
        if self.status is not None:
            return
        if output:
            self.chunks.append(output)
        self.status, self.ended_t, self.eof = status, self.session.world.wall(), True

    def stalled(self, now: float) -> bool:
        b = self.behaviour
        late = b.stalls_at is not None and now - self.started_at >= b.stalls_at
        return self.status is not None or b.stopped or b.blocked or late

    def advance(self, now: float) -> None:
        """One world tick of this task's life."""
        if self.status is not None:
            return
        age = now - self.started_at
        b = self.behaviour
        if self.killed_at is not None and now - self.killed_at >= b.kill_takes:
            self.end(ExitStatus(signal=signal.SIGKILL))
            return
        if self.spec.port and b.listen_after is not None and age >= b.listen_after:
            self.listening = True
        if self.spec.kind == "agent":
            self._sample(now)
        done = b.total is not None and self.steps >= b.total
        if b.steps and self.spec.kind == "program" and not self.stalled(now) and not done and age >= b.prepares_for:
            live = [w for w in b.runs_on if self.session.world.latest[w].status is None]  # the lost: rescheduled
            worker = live[self.steps % len(live)] if live else None
            if worker is not None and (self.session.world.latest[worker].stalled(now)
                                       or not self.session.world.latest[worker].listening):
                return  # waits on that worker's closure (a replacement not listening yet: too)
            self.steps += 1
            self.session.counts[self.spec.name] = (self.steps, now)
            self.session.totals[self.spec.name] = (self.steps, b.total)
            if worker is not None:
                mine = self.session.credit.setdefault(self.spec.name, {})
                mine[worker] = mine.get(worker, 0) + 1
        if b.exit_after is not None and age >= b.exit_after and not b.stopped:
            self.end(ExitStatus(code=b.code), b.output)

    def _sample(self, now: float) -> None:
        """A telemetry agent: its hello, then a sample every world second with the GPU
        utilisation the world's ``gpu_util`` gives and each running task's CPU from ``task_cpu``
        (as ``ddlctl.host.telemetry`` prints them)."""
        world = self.session.world
        if world.gpu_util is None and world.task_cpu is None:
            return
        host = self.spec.host.label
        if self.steps == 0:
            self.chunks.append(json.dumps({"type": "hello", "host": host, "gpu_fields": list(GPU_FIELDS),
                                           "gpus": [{"index": i, "uuid": f"GPU-{host}-{i}"}
                                                    for i in range(world.gpus)]}).encode() + b"\n")
        if now - self.started_at >= self.steps:  # one a second (steps counts the samples)
            self.steps += 1
            utils = world.gpu_util(host, now - 1000.0) if world.gpu_util else {}
            procs = {name: [world.task_cpu(name, now - 1000.0), 1 << 20] for name, task in world.latest.items()
                     if world.task_cpu and task.spec.kind != "agent" and task.spec.host.label == host
                     and task.status is None}
            self.chunks.append(json.dumps({"type": "sample", "t": world.wall(), "procs": procs, "gpus": [
                [i, util, *[None] * (len(GPU_FIELDS) - 2)] for i, util in sorted(utils.items())]}).encode() + b"\n")


class FakeSession:
    """A fake host agent's session (the supervisor's ``AgentSession``)."""

    def __init__(self, world: World, label: str) -> None:
        self.world = world
        self.label = label
        self.tasks: dict[str, FakeTask] = {}
        self.counts: dict[str, tuple[int, float]] = {}
        self.totals: dict[str, tuple[int, int | None]] = {}
        self.credit: dict[str, dict[str, int]] = {}
        self.busy: dict[str, tuple[int, str | None]] = {}  # task -> (phase lines, open phase)
        self.dumps: dict[str, dict] = {}
        self.files: dict[str, bytes] = {}  # path -> bytes (its "file system")
        self.mtimes: dict[str, int] = {}
        self.file_error: str | None = None  # file operations fail with this
        self.taken_ports: set[int] = set()
        self.lost: str | None = None
        self.lost_at: float | None = None
        self.clock_offset: float | None = None
        self.clock_frames = 0
        self._pids_changed = False
        # step reports held back (``World.starve``): what ddlctl saw last, until a stack request
        self.held: tuple[dict, dict] | None = None
        # always readable: the supervisor's select returns at once and every tick runs immediately
        self._read_end, self._write_end = os.pipe()
        os.write(self._write_end, b"x")

    # -- AgentSession ----------------------------------------------------------------------------

    def fileno(self) -> int:
        return self._read_end

    def pump(self) -> None:
        """The world pushes everything into the tasks: nothing to read. A pause (``World.pause``)
        happens here, as a Ctrl-Z lands while ddlctl waits for or reads its hosts."""
        if self.world.pausing:
            self.world.now += self.world.pausing
            self.world.pausing, self.world.frozen = 0.0, True

    def start(self, spec: TaskSpec, grace_s: float) -> FakeTask:
        attempt = self.world.starts.count(spec.name)
        self.world.starts.append(spec.name)
        self.world.started_specs.append(spec)
        task = FakeTask(spec, self, self.world.behaviour(spec.name, attempt), attempt)
        self.tasks[spec.name] = task
        self.world.latest[spec.name] = task
        self.counts.pop(spec.name, None)
        if self.lost:
            task.end(ExitStatus(lost=True))
        else:
            self._pids_changed = True
        return task

    def take_pids_changed(self) -> bool:
        changed, self._pids_changed = self._pids_changed, False
        return changed

    def step_counts(self) -> dict[str, tuple[int, float]]:
        return self.held[0] if self.held else self.counts

    def progress(self) -> dict[str, tuple[int, int | None]]:
        return self.held[1] if self.held else self.totals

    def credits(self) -> dict[str, dict[str, int]]:
        return self.credit

    def activity(self) -> dict[str, tuple[int, str | None]]:
        return self.busy

    def beats(self) -> dict[str, str]:
        return {}

    def paces(self) -> dict[str, dict[str, tuple[float, float | None, int]]]:
        return {}  # (no step records here: --trace auto finds nothing to capture, asks nothing)

    def check_silence(self, limit_s: float, now: float | None = None) -> bool:
        return False

    def heard(self) -> None:
        """Nothing is silent here."""

    def request_dump(self, names: list[str]) -> None:
        self.held = None  # a host agent reports its step counts before it answers a stack request
        for name in names:
            task = self.tasks[name]
            state = "T" if task.behaviour.stopped else "D" if task.behaviour.blocked else "S"
            bland = ('Current thread 0x1 (most recent call first):\n'
                     '  File "/site-packages/tensorflow/x.py", line 1 in wait\n')
            self.dumps[name] = {"procs": [[task.pid, state, " ".join(task.spec.argv)]],
                                "stacks": None if task.behaviour.stopped else (task.behaviour.stack or bland),
                                "cpu_s": task.behaviour.busy * (self.world.now - task.started_at),
                                "io_bytes": int(task.behaviour.io * (self.world.now - task.started_at)),
                                "at": self.world.now}
            if task.behaviour.blocked:
                self.dumps[name].update(stacks="", wchan={str(task.pid): "nfs_wait_on_request"})
            if task.behaviour.past_python:
                self.dumps[name]["stacks"] = ""
                task.end(ExitStatus(signal=signal.SIGUSR2))

    def dump_of(self, name: str) -> dict | None:
        return self.dumps.get(name)

    def wait_for(self, ready: Callable[[], bool], timeout: float) -> bool:
        return ready()

    def check_ports(self, ports: dict[str, int], timeout: float = 10.0) -> dict[str, int]:
        self.world.port_checks.append(dict(ports))
        return {name: (port + 1000 if port in self.taken_ports else port) for name, port in ports.items()}

    def list_files(self, folder: str, timeout: float = 60.0) -> dict[str, tuple[int, int]]:
        self._check_files()
        prefix = folder.rstrip("/") + "/"
        return {p[len(prefix):]: (len(d), self.mtimes[p]) for p, d in self.files.items() if p.startswith(prefix)}

    def read_file(self, path: str, timeout: float = 600.0) -> bytes:
        self._check_files()
        return self.files[path]

    def write_file(self, path: str, data: bytes, mtime_ns: int | None = None, timeout: float = 600.0) -> None:
        self._check_files()
        self.files[path] = data
        self.mtimes[path] = mtime_ns or 0

    def read_chunks(self, path: str, timeout: float = 600.0) -> Iterator[bytes]:
        data = self.read_file(path, timeout)
        yield from (data[at:at + 7] for at in range(0, len(data), 7))  # in pieces, as a real agent sends them

    def write_chunks(self, path: str, chunks: Iterable[bytes], mtime_ns: int | None = None,
                     timeout: float = 600.0) -> int:
        data = b"".join(chunks)
        self.write_file(path, data, mtime_ns, timeout)
        return len(data)

    # -- the world's side ------------------------------------------------------------------------

    def _check_files(self) -> None:
        if self.file_error:
            raise OSError(f"{self.label}: {self.file_error}")

    def put_file(self, folder: str, name: str, data: bytes, mtime_ns: int = 1) -> None:
        path = posixpath.join(folder, name)
        self.files[path], self.mtimes[path] = data, mtime_ns

    def lose(self, reason: str) -> None:
        """The connection ends: every running task is lost with it (the agent kills them)."""
        self.lost, self.lost_at = reason, self.world.wall()
        for task in self.tasks.values():
            task.end(ExitStatus(lost=True))

    def close(self) -> None:
        for fd in (self._read_end, self._write_end):
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass
class World:
    """A scripted cluster of fake host agents, with its own clock."""

    strategy: str
    hosts: tuple[str, ...] = ("localhost",)
    workers: int | None = None
    ps: int | None = None
    evaluator: bool = False
    telemetry: bool = False
    slots: int = 4  # per host
    gpus: int = 0  # per host
    gpu_util: Callable[[str, float], dict[int, float]] | None = None  # (host, world age) -> GPU index -> util %
    task_cpu: Callable[[str, float], float] | None = None  # (task, world age) -> its CPU % of one core
    behaviours: dict[str, Behaviour] = field(default_factory=dict)  # task name -> its behaviour
    retries: dict[tuple[str, int], Behaviour] = field(default_factory=dict)  # (task, attempt) -> behaviour
    now: float = 1000.0
    events: list[tuple[float, Callable[..., None], tuple]] = field(default_factory=list)
    starts: list[str] = field(default_factory=list)  # task names in the order they were started
    started_specs: list[TaskSpec] = field(default_factory=list)
    port_checks: list[dict[str, int]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    hard_exits: list[int] = field(default_factory=list)
    reconnects: list[str] = field(default_factory=list)
    latest: dict[str, FakeTask] = field(default_factory=dict)  # task name -> its latest start
    _pid: int = 1000
    real_deadline: float | None = None  # see tick()
    pausing: float = 0.0  # ddlctl stopped for this long while it next reads (see pause())
    frozen: bool = False  # what happened during that pause is not read in the tick it ends

    def __post_init__(self) -> None:
        self.sessions = {label: FakeSession(self, label) for label in self.hosts}

    # -- scripting -------------------------------------------------------------------------------

    def behaviour(self, name: str, attempt: int) -> Behaviour:
        """The behaviour of ``name``'s ``attempt``-th start (0: the first)."""
        if (name, attempt) in self.retries:
            return self.retries[(name, attempt)]
        base = self.behaviours.get(name)
        if base is not None:
            return base if attempt == 0 else Behaviour(exit_after=base.exit_after, ignores_term=base.ignores_term)
        if name.startswith("agent:"):
            return Behaviour(exit_after=None, steps=False)
        return Behaviour()

    def at(self, when: float, action: Callable[..., None], *args: object) -> None:
        """Run ``action(*args)`` once the world is ``when`` seconds old."""
        self.events.append((1000.0 + when, action, args))

    def task(self, name: str) -> FakeTask:
        """The latest start of ``name``."""
        return self.latest[name]

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """The task dies of a signal (``kill -9`` from outside)."""
        self.task(name).end(ExitStatus(signal=sig))

    def crash(self, name: str, code: int, output: bytes) -> None:
        """The task prints ``output`` and exits with ``code``."""
        self.task(name).end(ExitStatus(code=code), output)

    def say(self, name: str, output: bytes) -> None:
        """The running task prints ``output`` (and goes on)."""
        self.task(name).chunks.append(output)

    def block(self, name: str) -> None:
        """The task blocks in the kernel (state D): it stops stepping and no signal ends it."""
        self.task(name).behaviour.blocked = True

    def enter_phase(self, name: str, phase: str | None) -> None:
        """The task's program begins a declared phase (``ddlctl.phase``; None: ends the one it is in)."""
        busy = self.task(name).session.busy
        lines, _ = busy.get(name, (0, None))
        busy[name] = (lines + 1, phase)

    def starve(self, label: str) -> None:
        """The host's agent gets no CPU for a while (a loaded machine): its step reports stop
        reaching ddlctl, and what was stepped meanwhile comes at its next stack request."""
        session = self.sessions[label]
        session.held = (dict(session.counts), dict(session.totals))

    def stop(self, name: str) -> None:
        """SIGSTOP: it stops stepping, ignores TERM and shows state T."""
        self.task(name).behaviour.stopped = True

    def pause(self, seconds: float) -> None:
        """ddlctl itself stops for ``seconds`` (Ctrl-Z, then fg) at its next read: its wait comes
        back empty, as Python's does after SIGCONT, and the world's clock has moved on."""
        self.pausing = seconds

    def signal_me(self, signum: int = signal.SIGINT) -> None:
        """A signal to this process (ddlctl), as Ctrl-C in its terminal sends."""
        os.kill(os.getpid(), signum)

    # -- the clock -------------------------------------------------------------------------------

    def clock(self) -> float:
        return self.now

    def wall(self) -> float:
        return time.time() + (self.now - 1000.0)

    def next_pid(self) -> int:
        self._pid += 1
        return self._pid

    def tick(self, _progress: object = None, _activity: object = None) -> None:
        """One supervisor tick: events due, then every task's life moves on. A job that has not
        ended after ``REAL_LIMIT_S`` of real time fails the test instead of hanging it (the fake
        clock races ahead while a real-time thread works, so no fake-time bound would do)."""
        if self.real_deadline is not None and time.monotonic() > self.real_deadline:
            raise AssertionError(f"the fake job did not end within {REAL_LIMIT_S:g}s of real time; said so far: "
                                 f"{self.messages[-5:]}")
        self.now += TICK
        due = [e for e in self.events if e[0] <= self.now]
        self.events = [e for e in self.events if e[0] > self.now]
        for _when, action, args in due:
            action(*args)
        if self.frozen:  # the read that ended a pause found nothing new
            self.frozen = False
            return
        for task in list(self.latest.values()):
            task.advance(self.now)

    # -- running ---------------------------------------------------------------------------------

    def plan(self, run_dir: Path) -> Plan:
        cluster = Cluster(hosts=tuple(Host(name=h, slots=self.slots, gpus=self.gpus, source=f"hosts.txt:{i + 1}")
                                      for i, h in enumerate(self.hosts)), source="hosts.txt")
        request = LaunchRequest(strategy=self.strategy, workers=self.workers, ps=self.ps, evaluator=self.evaluator,
                                command=("python3", "train.py"), run_id="fake", run_dir=str(run_dir),
                                telemetry=self.telemetry, legacy_keras=False)
        ports: dict[str, int] = {}
        port = 20000
        for spec in make_plan(cluster, request, {}).tasks:
            if spec.port is not None:
                port += 1
                ports[spec.name] = port
        return make_plan(cluster, request, ports)

    def reconnect_to(self, label: str, comes_back: bool = True) -> Callable[[str], FakeSession]:
        """A reconnect function: a fresh session for ``label`` (or a failure every time)."""

        def reconnect(host: str) -> FakeSession:
            self.reconnects.append(host)
            if not comes_back:
                raise ConnectionRefusedError(f"{host}: connection refused")
            session = FakeSession(self, host)
            self.sessions[host] = session
            return session

        return reconnect

    def run(self, tmp_path: Path, reconnect: Callable[[str], FakeSession] | None = None,
            **options: object) -> tuple[JobResult, Plan]:
        """Supervise this world's plan to the end."""
        plan = self.plan(tmp_path / "run")
        self.real_deadline = time.monotonic() + REAL_LIMIT_S
        defaults: dict[str, object] = {"tick_s": 0.0, "probe_interval_s": 0.0, "grace_s": 2.0,
                                       "restart_grace_s": 1.0, "startup_timeout_s": 30.0, "hang_timeout_s": 0.0}
        writer = PrefixedWriter(open(tmp_path / "console.txt", "wb"))  # noqa: SIM115
        supervisor = Supervisor(plan, self.sessions, writer, SupervisorOptions(**{**defaults, **options}),
                                notify=self.messages.append, reconnect=reconnect, on_progress=self.tick,
                                clock=self.clock, hard_exit=self.hard_exits.append)
        handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            return supervisor.run(), plan
        finally:
            for signum, handler in handlers.items():  # ddlctl would exit now; pytest goes on
                signal.signal(signum, handler)
            for session in list(self.sessions.values()):
                session.close()
