"""The host agent: ``python -m ddlctl.host.agent``, one per host and run, over one session.

Standard library only (it runs from ddlctl's code bundle on hosts where ddlctl is not installed).
ddlctl starts one agent per host (a local subprocess, or the command of one SSH exec session) and
talks to it over its stdin/stdout (wire format: :mod:`ddlctl.contract.wire`). The agent

* starts that host's tasks when told (``start``: argv, environment, working directory: all sent
  over stdin, never on a command line), each in its own process group, with
  ``PR_SET_PDEATHSIG = SIGKILL`` so a task dies with the agent;
* forks a TensorFlow task from a zygote that imported TensorFlow once (:mod:`ddlctl.host.prefork`;
  the agent is a child subreaper, so a forked task is its child too), else starts it with
  ``subprocess`` (:mod:`ddlctl.host.tasks`);
* forwards each task's combined stdout/stderr as ``out`` frames, unchanged;
* reports ``started`` (pids), ``listening`` (a process of the task listens on its port, seen in
  /proc on this host: no port forwarding needed, and a port someone else took does not count),
  ``exit`` (code or signal, after the task's last output), ``steps``
  (per task: steps recorded, the highest step reached and the declared total: ddlctl's hang watch
  and progress bar), and a ``beat`` every 2 s;
* signals a task's group when asked (``signal``: TERM/INT/HUP, then SIGKILL after the grace
  period; KILL at once; a stopped process takes no SIGTERM, so the SIGKILL always follows);
* on ``dump`` reports the state of every process of the named tasks (``T`` = stopped) and asks
  Python tasks that registered ``faulthandler`` (:mod:`ddlctl.task.stack_dumper`) for their stacks;
* on ``ports`` says which of the given ports can still be bound, with a fresh one for each that
  cannot;
* on ``ls`` / ``read`` / ``write`` lists a folder, sends a file, or writes one (ddlctl copies the
  chief's checkpoint to hosts that do not share its file system before a group restart);
* kills every task (TERM, grace, KILL) when its input ends (ddlctl gone: killed, or the SSH
  connection dropped), on SIGTERM/SIGHUP/SIGINT, or on ``shutdown``; then exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time

from ddlctl.contract import envvars
from ddlctl.contract.rundir import TASK_PID, TASK_TRACE_REQUEST
from ddlctl.contract.wire import MAGIC, Kind, Op, encode_frame
from ddlctl.host import oom, prefork, procsetup
from ddlctl.host.dumps import DUMP_WAIT_S, dump_frame, look_at
from ddlctl.host.files import code_bundle_path, file_command, take_profiling, write_json
from ddlctl.host.prefork import Zygote
from ddlctl.host.procs import (
    descendants,
    fresh_port,
    group_listens,
    listening_sockets,
    port_free,
    run_elsewhere,
)
from ddlctl.host.tasks import BadEnvironment, MissingProgram, Task, start_error

SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "HUP": signal.SIGHUP, "KILL": signal.SIGKILL}
BEAT_S = 2.0
TICK_S = 0.25  # longest sleep: task output and commands wake the agent at once
ENDING_TICK_S = 0.01
STEPS_S = 1.0
PORTS_S = 0.2  # a look at the listening sockets: cheap over netlink, ~8 ms from /proc/net/tcp*
#: What a stack request reads of a process's stacks file at most, and sends of a task's in all
#: (its threads' stacks: kilobytes; the frame stays well within the controller's header bound).
DRAIN_S = 2.0
#: Once ddlctl is gone, tasks that SIGKILL has not ended after this long are left (a process in
#: uninterruptible sleep, state D, dies only when the kernel lets it go: the signal stays pending).
LEAVE_AFTER_S = 10.0


class HostAgent:
    def __init__(self, in_fd: int = 0, out_fd: int = 1, probe: dict | None = None) -> None:
        self.probe = probe
        self.in_fd = in_fd
        self.out_fd = out_fd
        self.tasks: dict[str, Task] = {}
        self.pending = b""
        self.input_open = True
        self.output_open = True
        self.stopping = False
        self.leave_at: float | None = None  # ddlctl gone: leave tasks SIGKILL cannot end after this
        self.dumps: list[tuple[float, dict[str, dict]]] = []
        self.zygotes: dict[tuple, Zygote] = {}
        self.forking: dict[str, Zygote] = {}  # task -> the zygote asked to fork it
        self.subreaper = False

    # -- output to the controller ---------------------------------------------------------------

    def send(self, header: dict, payload: bytes = b"") -> None:
        if not self.output_open:
            return
        data = encode_frame(header, payload)
        try:
            while data:
                written = os.write(self.out_fd, data)
                data = data[written:]
        except OSError:  # the controller is gone: keep going until the tasks are down
            self.output_open = False

    # -- commands -------------------------------------------------------------------------------

    def handle(self, command: dict, now: float) -> None:
        op = command.get("op")
        if op == Op.START:
            self.start(command["task"], command["spec"], now)
        elif op == Op.SIGNAL:
            task = self.tasks.get(command["task"])
            if task is not None and task.status is None:
                task.terminate(SIGNALS.get(command.get("sig", "TERM"), signal.SIGTERM), now)
        elif op == Op.DUMP:
            self.begin_dump(command.get("tasks") or list(self.tasks), now)
        elif op == Op.PORTS:
            ports = {name: (port if port_free(port) else fresh_port()) for name, port in command["ports"].items()}
            self.send({"k": Kind.PORTS, "id": command.get("id"), "ports": ports})
        elif op == Op.TRACE:
            task = self.tasks.get(command["task"])
            if task is not None and task.task_dir:
                with contextlib.suppress(OSError, TypeError, ValueError):
                    write_json(os.path.join(task.task_dir, TASK_TRACE_REQUEST), dict(command["request"]))
        elif op == Op.SHUTDOWN:
            self.stop_all(now)
        elif op in Op.FILES:
            file_command(op, command, self.send)

    def start(self, name: str, spec: dict, now: float) -> None:
        previous = self.tasks.get(name)
        if previous is not None and previous.status is None:
            self.send({"k": Kind.START_FAILED, "task": name, "error": "already running", "code": 1})
            return
        try:
            task = Task(name, spec)
            zygote = self.zygote_for(task)
            if zygote is not None and task.ask_fork(zygote):
                self.tasks[name] = task
                self.forking[name] = zygote
                return  # said started once the zygote forked it
            task.spawn()
        except BadEnvironment as exc:
            self.send({"k": Kind.START_FAILED, "task": name, "error": f"environment: {exc}", "code": 2})
            return
        except MissingProgram as exc:  # (Python itself would say "can't open file", exit code 2)
            self.send({"k": Kind.START_FAILED, "task": name, "error": str(exc), "code": 2})
            return
        except OSError as exc:
            self.send({"k": Kind.START_FAILED, "task": name, "error": start_error(spec, exc),
                       "code": 127 if isinstance(exc, FileNotFoundError) else 126})
            return
        self.tasks[name] = task
        self.started(task)

    def started(self, task: Task) -> None:
        assert task.popen is not None
        task.started_us, task.oom_kills = oom.monotonic_us(), oom.oom_kills()
        record = {"agent_pid": os.getpid(), "task_pid": task.popen.pid, "task_pgid": task.pgid,
                  "ssh_connection": os.environ.get("SSH_CONNECTION"), "forked": task.forked,
                  "executable": task.executable()}
        if task.task_dir:
            write_json(os.path.join(task.task_dir, TASK_PID),
                       {**record, **({"fork_note": task.fork_note} if task.fork_note else {}),
                        **({"zygote_pid": task.zygote_pid} if task.zygote_pid else {})})
        self.send({"k": Kind.STARTED, "task": task.name, "t": time.time(), **record,
                   **({"note": task.note} if task.note else {})})

    # -- tasks forked from a zygote (one per interpreter and environment) -----------------------

    def zygote_for(self, task: Task) -> Zygote | None:
        """The zygote that forks ``task`` (started now if it is the first of its kind), or None."""
        if self.stopping or not os.path.isdir(task.cwd) \
                or not prefork.forkable(task.argv, task.env, task.cwd):
            return None
        if not self.subreaper:
            self.subreaper = procsetup.become_subreaper()
            if not self.subreaper:
                return None
        prefork.import_environment(task.argv, task.env)
        key = prefork.zygote_key(task.argv, task.env, task.cwd)
        zygote = self.zygotes.get(key)
        if zygote is None:  # (the key's first part: the interpreter and its -u)
            zygote = self.zygotes[key] = Zygote(key[0], task.env)
        if zygote.failed:  # started the plain way, and pid.json says why
            task.fork_note = f"no zygote: {zygote.failed}"
            return None
        return zygote

    def read_zygote(self, zygote: Zygote) -> None:
        for message in zygote.receive():
            name = message.get("id")
            if name is None or self.forking.get(name) is not zygote:
                if message.get("pid"):  # a fork nobody waits for any more
                    with contextlib.suppress(OSError):
                        os.kill(int(message["pid"]), signal.SIGKILL)
                continue
            del self.forking[name]
            task = self.tasks[name]
            if "pid" in message:
                task.forked_as(int(message["pid"]), zygote.proc.pid if zygote.proc is not None else None)
                self.started(task)
            else:
                self.fork_failed(task, f"the fork failed: {message.get('error')}")
        if zygote.failed and self.stopping:
            self.drop_forks(zygote, f"stopped before its zygote forked it ({zygote.failed})")
        elif zygote.failed:  # what it was asked for starts the plain way
            for name in [n for n, z in self.forking.items() if z is zygote]:
                del self.forking[name]
                self.fork_failed(self.tasks[name], f"no zygote: {zygote.failed}")
        if zygote.failed:
            zygote.close()

    def drop_forks(self, zygote: Zygote, why: str) -> None:
        """The tasks ``zygote`` was asked to fork never start (the agent is stopping)."""
        for name in [n for n, z in self.forking.items() if z is zygote]:
            del self.forking[name]
            task = self.tasks.pop(name)
            task.close_fork_pipe()
            task.release()
            self.send({"k": Kind.START_FAILED, "task": name, "error": f"not started: {why}", "code": 143})

    def fork_failed(self, task: Task, why: str) -> None:
        try:
            task.fork_failed(why)
        except OSError as exc:
            del self.tasks[task.name]
            self.send({"k": Kind.START_FAILED, "task": task.name, "error": start_error({"argv": task.argv}, exc),
                       "code": 127 if isinstance(exc, FileNotFoundError) else 126})
            return
        self.started(task)

    def close_zygotes(self) -> None:
        for zygote in self.zygotes.values():
            zygote.close()

    def controller_gone(self, now: float) -> None:
        """No more input: stop every task, and leave those SIGKILL cannot end once it had its time."""
        self.input_open = False
        self.stop_all(now)
        if self.leave_at is None:
            self.leave_at = now + max((t.grace for t in self.tasks.values()), default=0.0) + LEAVE_AFTER_S

    def stop_all(self, now: float) -> None:
        self.stopping = True
        for task in self.tasks.values():
            if task.status is None:
                task.terminate(signal.SIGTERM, now)
        for zygote in list(self.zygotes.values()):  # one still importing: what it was asked for never starts
            if not zygote.ready and any(z is zygote for z in self.forking.values()):
                zygote.close()
                self.drop_forks(zygote, "stopped while its zygote imported TensorFlow")

    # -- stacks of a hung job -------------------------------------------------------------------

    def begin_dump(self, names: list[str], now: float) -> None:
        report = {name: look_at(self.tasks[name], self.forking.get(name)) for name in names if name in self.tasks}
        self.dumps.append((now + (DUMP_WAIT_S if any(r["offsets"] for r in report.values()) else 0), report))

    def finish_dumps(self, now: float) -> None:
        due = [d for d in self.dumps if d[0] <= now]
        self.dumps = [d for d in self.dumps if d[0] > now]
        if due:  # the step counts first: ddlctl has them when it reads the stacks (a step just taken
            self.report_steps()  # is progress, whatever the stacks say)
        for _, report in due:
            for name, entry in report.items():
                self.send(dump_frame(name, entry))

    # -- the loop -------------------------------------------------------------------------------

    def read_input(self, now: float) -> None:
        try:
            chunk = os.read(self.in_fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:  # ddlctl is gone (or the connection dropped): take everything down
            self.controller_gone(now)
            return
        self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            if line.strip():
                try:
                    command = json.loads(line)
                except ValueError:
                    continue
                self.handle(command, now)

    def read_task(self, task: Task) -> None:
        try:
            chunk = os.read(task.fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            self.send({"k": Kind.OUT, "task": task.name}, chunk)
        else:
            task.eof = True

    def reap(self, now: float) -> None:
        for task in self.tasks.values():
            if task.popen is None:  # its fork asked for: a kill is held for it
                if task.kill_at is not None and now >= task.kill_at:
                    task.signal(signal.SIGKILL)
                continue
            if task.status is None:
                status = task.popen.poll()
                if status is not None:
                    task.status, task.exited_at = status, time.time()
                    task.signal(signal.SIGKILL)  # what the task left in its group
                    task.sweep(self.own_pids())  # and what it started outside it (setsid daemons)
                    if all(t.status is not None for t in self.tasks.values()):
                        self.end_strays()  # ... even with its environment cleared (env -i)
            if task.status is not None and not task.eof and task.exited_at is not None \
                    and time.time() - task.exited_at > DRAIN_S:
                task.eof = True  # something outside its group holds the pipe: stop waiting
            if task.status is not None and task.eof and task.fd >= 0:
                with contextlib.suppress(OSError):
                    task.popen.stdout.close()  # type: ignore[union-attr]
                task.fd = -1
                task.release()
                record = {"code": task.status if task.status >= 0 else None,
                          "signal": -task.status if task.status < 0 else None}
                if task.status == -signal.SIGKILL and task.popen is not None and not task.killed:  # the OOM killer's?
                    evidence = oom.oom_evidence(task.popen.pid, task.started_us, task.oom_kills)
                    if evidence:
                        record["oom"] = evidence
                profiling = take_profiling(task.task_dir) if task.task_dir else None
                if profiling and record["signal"] and not task.killed:  # (a crash: TensorFlow's profiler's?)
                    record["profiling"] = profiling
                if task.task_dir:
                    write_json(os.path.join(task.task_dir, "exit.json"), record)
                # its last steps first (a task that lived less than STEPS_S was never counted: one
                # that trained alone for 0.6 s was not said to have)
                self.report_steps()
                self.send({"k": Kind.EXIT, "task": task.name, "t": task.exited_at, **record})
            if task.status is None and task.kill_at is not None and now >= task.kill_at:
                task.signal(signal.SIGKILL)
                task.kill_at = now + 1.0  # again if it has not gone (never trust one signal)
        if self.subreaper:  # a zygote that ended is waited for; so is a task's orphaned descendant
            zygotes = {z.proc.pid for z in self.zygotes.values() if z.proc is not None and z.proc.poll() is None}
            prefork.reap_orphans(zygotes | {t.popen.pid for t in self.tasks.values()
                                            if t.popen is not None and t.status is None})

    def end_strays(self) -> list[int]:
        """SIGKILL every process below this agent but its zygotes (and what they are forking) and
        its running tasks: what tasks started outside their process groups and left behind, orphans
        this subreaper adopted, found whatever their environment says (a daemon started with
        ``env -i`` carries no run id). Called when no task of this agent runs (an orphan cannot tell
        which task it came from) and as the agent ends. The pids killed."""
        if not self.subreaper:
            return []
        killed = []
        for pid in descendants(os.getpid(), skip=self.own_pids()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        return killed

    def own_pids(self) -> set[int]:
        """This agent's own processes: itself, its zygotes, its tasks still running (never swept)."""
        own = {os.getpid(), *(z.proc.pid for z in self.zygotes.values() if z.proc is not None)}
        return own | {t.popen.pid for t in self.tasks.values() if t.popen is not None and t.status is None}

    def report_listening(self) -> None:
        waiting = [t for t in self.tasks.values() if t.status is None and not t.listening and t.popen is not None]
        if not waiting:
            return
        listening = listening_sockets() if os.path.exists("/proc/net/tcp") else None  # one reading for all
        for task in waiting:
            if group_listens(task.pgid, task.port, listening):
                task.listening = True
                self.send({"k": Kind.LISTENING, "task": task.name, "t": time.time()})

    def report_steps(self) -> None:
        counts, last, totals, credits, activity, phases, beats, paces = {}, {}, {}, {}, {}, {}, {}, {}
        for task in self.tasks.values():
            if task.steps is not None and task.phases is not None:
                count, busy = task.steps.poll(), task.phases.poll()
                if (count, busy, task.phases.open) != task.reported_steps:
                    task.reported_steps = (count, busy, task.phases.open)
                    counts[task.name] = count
                    last[task.name] = task.steps.last
                    activity[task.name] = busy  # work outside the steps: phases, beats
                    phases[task.name] = task.phases.open
                    if task.phases.beat:
                        beats[task.name] = task.phases.beat
                    if task.steps.total is not None:
                        totals[task.name] = task.steps.total
                    if task.steps.credits:
                        credits[task.name] = dict(task.steps.credits)
                    if task.steps.recent:
                        paces[task.name] = task.steps.pace()
        if counts:
            self.send({"k": Kind.STEPS, "t": time.time(), "counts": counts, "last": last, "totals": totals,
                       "credits": credits, "activity": activity, "open": phases, "beats": beats, "pace": paces})

    def run(self) -> int:
        def on_signal(signum: int, _frame: object) -> None:
            # Say so first: the tasks got the same signal (a Slurm step cancelled, a host shutting
            # down), and their exits are the host's end, not the program's failure.
            with contextlib.suppress(OSError):
                self.send({"k": Kind.SIGNALLED, "sig": signum, "t": time.time()})
            self.controller_gone(time.monotonic())

        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, on_signal)
        # what a task leaves behind, orphaned, becomes this agent's child (a zygote's forks too)
        self.subreaper = procsetup.become_subreaper()
        run_id, launch = os.environ.get(envvars.RUN_ID), os.environ.get(envvars.LAUNCH)
        self.send({"k": Kind.HELLO, "pid": os.getpid(), "t": time.time(), "probe": self.probe,
                   "ssh_connection": os.environ.get("SSH_CONNECTION"), "python": sys.version.split()[0],
                   "code": code_bundle_path(), "slurm_step": slurm_step(),
                   # the run id must be this launch's alone here (another launch of it would end our
                   # processes, and share our folders on this host)
                   "run_elsewhere": run_elsewhere(run_id, launch) if run_id and launch else []})
        next_beat = next_steps = next_ports = time.monotonic()
        while True:
            live = [t for t in self.tasks.values() if t.fd >= 0 and not t.eof]
            zygotes = [z for z in self.zygotes.values() if not z.failed]
            watched = [t.fd for t in live] + [z.fileno() for z in zygotes] + ([self.in_fd] if self.input_open else [])
            # a task whose output ended is about to exit: look again soon, its exit is news
            ending = any(t.eof and t.status is None for t in self.tasks.values())
            try:
                ready, _, _ = select.select(watched, [], [], ENDING_TICK_S if ending else TICK_S)
            except InterruptedError:
                ready = []
            now = time.monotonic()
            for task in live:
                if task.fd in ready:
                    self.read_task(task)
            for zygote in zygotes:
                if zygote.fileno() in ready:
                    self.read_zygote(zygote)
            if self.input_open and self.in_fd in ready:
                self.read_input(now)
            self.reap(now)
            self.finish_dumps(now)
            if now >= next_ports:
                self.report_listening()
                next_ports = now + PORTS_S
            if now >= next_steps:
                self.report_steps()
                next_steps = now + STEPS_S
            if now >= next_beat:
                self.send({"k": Kind.BEAT, "t": time.time()})
                next_beat = now + BEAT_S
            if self.leave_at is not None and now >= self.leave_at:
                break  # what is left cannot be killed (state D): it dies when the kernel lets it go
            if (self.stopping or not self.input_open) and not self.forking \
                    and all(t.fd < 0 for t in self.tasks.values()):
                if not self.input_open or not self.output_open:
                    break
                if self.stopping:
                    self.send({"k": Kind.BYE})
                    break
        self.end_strays()
        self.close_zygotes()
        return 0


def slurm_step() -> str | None:
    """``JOB.STEP`` when this agent runs as a Slurm job step (so a wedged agent can be cancelled)."""
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    return f"{job}.{step}" if job and step else None


def main(argv: list[str] | None = None) -> int:
    """``python -m ddlctl.host.agent --run RUN_ID --launch KEY [--ports N]``: with ``--ports``, the
    hello carries the launch-time probe (Python, TensorFlow present, N free ports): one process
    start per host. The run id and launch key (also in its environment, its tasks' base) are on its
    command line for ``killrun`` and ``stop``: sealed (:func:`~ddlctl.host.procsetup.seal`), its
    environment is not readable by the user's other processes."""
    args = sys.argv[1:] if argv is None else argv
    options = dict(zip(args[::2], args[1::2], strict=False))
    os.umask(0o077)  # the run's files on this host (and its tasks' own) are the user's alone
    procsetup.seal()  # no task of the user's can ptrace it, write its memory or reopen its streams
    with contextlib.suppress(OSError):  # own session: a terminal's Ctrl-C is ddlctl's to handle
        os.setsid()
    os.write(1, MAGIC)
    probe = None
    if "--ports" in options:
        from ddlctl.host.probe import quick_probe

        probe = quick_probe(int(options["--ports"]))
    code = HostAgent(probe=probe).run()
    os._exit(code)  # no interpreter shutdown: nothing left to flush, nothing to wait for


if __name__ == "__main__":
    main()
