"""The host agent with real processes: one agent, many tasks, exits, signals, stacks, secrets."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddlctl.cluster.model import Host
from ddlctl.contract.wire import MAGIC, FrameReader, encode_frame
from ddlctl.planning.plan import TaskSpec
from ddlctl.transport.local import open_local_session
from ddlctl.transport.session import HostSession
from tests.conftest import PROGRAMS, ROOT, ddlctl_cmd, only_run_dir, processes_of_run, run_ddlctl

HOST = Host(name="localhost")


def spec(name: str, code: str, task_dir: Path, env: dict[str, str] | None = None, port: int | None = None,
         kind: str = "program") -> TaskSpec:
    return TaskSpec(name=name, role=name.split(":")[0], index=int(name.split(":")[1]), host=HOST, port=port,
                    kind=kind, argv=(sys.executable, "-c", code), env={"DDLCTL_TASK_DIR": str(task_dir), **(env or {})},
                    unset_env=(), workdir=str(task_dir.parent), task_dir=str(task_dir), gpus=None, tf_config=None)


def session(tmp_path: Path, run_id: str = "test-run") -> HostSession:
    return open_local_session(HOST, run_id, tmp_path / "agents")


def output(task) -> bytes:  # noqa: ANN001
    data = b""
    while (chunk := task.read()) not in (None, b""):
        data += chunk
    return data


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.dictionaries(st.sampled_from("abc"), st.text(max_size=5), max_size=2),
                          st.binary(max_size=300)), max_size=6), st.binary(max_size=40), st.integers(1, 50))
def test_frames_survive_any_split_and_leading_chatter(frames, chatter, cut):
    data = chatter.replace(MAGIC, b"") + MAGIC + b"".join(encode_frame({"k": "x", **h}, p) for h, p in frames)
    reader = FrameReader()
    got = []
    for i in range(0, len(data), cut):
        got += reader.feed(data[i:i + cut])
    assert [(h["k"], {k: v for k, v in h.items() if k not in ("k", "n")}, p) for h, p in got] == \
        [("x", h, p) for h, p in frames]


def test_many_tasks_one_agent_output_exits_and_signals(tmp_path):
    s = session(tmp_path)
    try:
        tasks = {
            "worker:0": s.start(spec("worker:0", "print('hello'); import sys; sys.exit(3)", tmp_path / "w0"), 5),
            "worker:1": s.start(spec("worker:1", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
                                     tmp_path / "w1"), 5),
            "worker:2": s.start(spec("worker:2", "import time; time.sleep(60)", tmp_path / "w2"), 5),
        }
        for i in range(3, 12):  # more tasks than an sshd's default MaxSessions: one session carries all
            tasks[f"worker:{i}"] = s.start(spec(f"worker:{i}", f"print({i})", tmp_path / f"w{i}"), 5)
        # a command's first word as its start found it (its PATH; a relative path from its folder)
        bare = dataclasses.replace(spec("worker:12", "pass", tmp_path / "w12"), argv=("sh", "-c", "exit 0"))
        tasks["worker:12"] = s.start(bare, 5)
        relative = os.path.relpath(sys.executable, tmp_path)
        tasks["worker:13"] = s.start(dataclasses.replace(spec("worker:13", "pass", tmp_path / "w13"),
                                                         argv=(relative, "-c", "pass")), 5)
        assert s.wait_for(lambda: all(t.poll() for n, t in tasks.items() if n != "worker:2"), 30)
        assert tasks["worker:0"].poll().code == 3
        assert output(tasks["worker:0"]) == b"hello\n", "the last output arrives before the exit"
        assert tasks["worker:1"].poll().signal == signal.SIGKILL
        assert all(output(tasks[f"worker:{i}"]) == f"{i}\n".encode() for i in range(3, 12))
        assert tasks["worker:2"].poll() is None and tasks["worker:2"].pids()["task_pid"]
        assert tasks["worker:12"].pids()["executable"] == shutil.which("sh")
        assert tasks["worker:13"].pids()["executable"] == os.path.normpath(os.path.join(tmp_path, relative)) \
            == os.path.normpath(sys.executable)
        tasks["worker:2"].send("TERM")
        assert s.wait_for(lambda: tasks["worker:2"].poll() is not None, 10)
        assert tasks["worker:2"].poll().signal == signal.SIGTERM
    finally:
        s.shutdown()
        s.close()


def test_a_missing_working_directory_is_a_start_failure_with_a_reason(tmp_path):
    s = session(tmp_path)
    try:
        bad = spec("worker:0", "print(1)", tmp_path / "w0")
        task = s.start(TaskSpec(**{**bad.__dict__, "workdir": str(tmp_path / "nope")}), 5)
        assert s.wait_for(lambda: task.poll() is not None, 10)
        assert task.poll().code == 127 and b"working directory" in output(task)
    finally:
        s.close()


def test_a_bad_environment_entry_fails_that_task_alone_and_the_agent_goes_on(tmp_path):
    s = session(tmp_path)
    try:
        bad_name = s.start(spec("worker:0", "print(1)", tmp_path / "w0", env={"A=B": "1"}), 5)
        bad_value = s.start(spec("worker:1", "print(1)", tmp_path / "w1", env={"TOKEN": "ab\0cd"}), 5)
        good = s.start(spec("worker:2", "print('still here')", tmp_path / "w2"), 5)
        assert s.wait_for(lambda: all(t.poll() is not None for t in (bad_name, bad_value, good)), 20)
        assert bad_name.poll().code == 2 and b"environment: 'A=B' is not a variable name" in output(bad_name)
        assert bad_value.poll().code == 2 and b"the value of TOKEN holds a NUL byte" in output(bad_value)
        assert good.poll().code == 0 and output(good) == b"still here\n"
    finally:
        s.close()


def test_secrets_travel_over_stdin_never_in_a_command_line(tmp_path):
    secret = "s3cr3t-value-" + os.urandom(4).hex()
    s = session(tmp_path)
    try:
        task = s.start(spec("worker:0", "import os, time; print(os.environ['API_TOKEN'], flush=True); time.sleep(30)",
                            tmp_path / "w0", env={"API_TOKEN": secret}), 5)
        assert s.wait_for(lambda: b"s3cr3t" in b"".join(task.chunks), 20)
        import base64
        forms = [secret.encode(), base64.b64encode(secret.encode()), base64.urlsafe_b64encode(secret.encode())]
        for proc in psutil.process_iter(["cmdline"]):
            line = "\0".join(proc.info["cmdline"] or ()).encode()
            assert not any(form.rstrip(b"=")[:16] in line for form in forms), proc.info["cmdline"]
    finally:
        s.shutdown()
        s.close()


def test_end_of_input_kills_every_task_even_a_stopped_one(tmp_path):
    s = session(tmp_path, "eof-run")
    running = s.start(spec("worker:0", "import time; time.sleep(60)", tmp_path / "w0"), 1)
    stopped = s.start(spec("worker:1", "import time; time.sleep(60)", tmp_path / "w1"), 1)
    assert s.wait_for(lambda: running.pids() and stopped.pids(), 10)
    pids = [running.pids()["task_pid"], stopped.pids()["task_pid"]]
    os.kill(pids[1], signal.SIGSTOP)
    agent = s.stream.popen  # type: ignore[attr-defined]
    s.stream.sock.shutdown(socket.SHUT_WR)  # type: ignore[attr-defined]  # ddlctl killed, the connection dropped
    agent.wait(15)
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


FORGER = """
import json, os, time
forged = 0
for fd in (1, 0):  # the agent's stream to ddlctl, and ddlctl's commands to the agent
    try:
        out = os.open(f"/proc/{os.getppid()}/fd/{fd}", os.O_WRONLY)
    except OSError as exc:
        print(f"fd {fd}: {exc.strerror}", flush=True)
        continue
    forged += 1
    os.write(out, b'\\n{"k":"exit","task":"worker:0","code":0}\\n{"op":"shutdown"}\\n')
print(f"forged {forged}", flush=True)
time.sleep(3)
print("still running", flush=True)
"""


def test_a_task_cannot_write_frames_or_commands_through_its_agents_streams(tmp_path):
    # before: a task opened /proc/<agent>/fd/1 (a pipe) and wrote an exit frame: within 0.9 s ddlctl
    # recorded exit 0 for a task still running. The local agent's streams are a socket now (ENXIO
    # there, even for root)
    s = session(tmp_path)
    try:
        task = s.start(spec("worker:0", FORGER, tmp_path / "w0"), 1)
        assert s.wait_for(lambda: task.poll() is not None, 20)
        said = output(task).decode()
        assert "forged 0" in said and said.count("No such device or address") == 2, said
        assert task.poll().code == 0 and "still running" in said and not s.lost
    finally:
        s.shutdown()
        s.close()


def test_dump_reports_a_stopped_process_and_python_stacks(tmp_path):
    s = session(tmp_path)
    try:
        # ('ready' said from inside waiting_here: said before it, a loaded machine's dump could come
        # while the task was still on the line that said it)
        code = ("import ddlctl.task.stack_dumper as s, time; s.install()\n"
                "def waiting_here():\n    print('ready', flush=True)\n    time.sleep(60)\nwaiting_here()")
        live = s.start(spec("worker:0", code, tmp_path / "w0"), 1)
        frozen = s.start(spec("worker:1", "import time; time.sleep(60)", tmp_path / "w1"), 1)
        assert s.wait_for(lambda: b"ready" in b"".join(live.chunks) and frozen.pids(), 20)
        os.kill(frozen.pids()["task_pid"], signal.SIGSTOP)
        # stopped once the kernel has delivered the signal, which takes a turn on a CPU (CI's loaded
        # machine showed it still R 0.2 s after the kill)
        stopped = psutil.Process(frozen.pids()["task_pid"])
        assert s.wait_for(lambda: stopped.status() == psutil.STATUS_STOPPED, 20)
        s.request_dump(["worker:0", "worker:1"])
        assert s.wait_for(lambda: all(s.dump_of(n) for n in ("worker:0", "worker:1")), 10)
        assert "waiting_here" in s.dump_of("worker:0")["stacks"]
        assert [state for _pid, state, _cmd in s.dump_of("worker:1")["procs"]] == ["T"]
        assert live.poll() is None, "SIGUSR2 went only to a process that registered for it"
    finally:
        s.shutdown()
        s.close()


def test_a_dump_comes_after_the_step_counts_it_should_be_read_with(tmp_path):
    # the agent reports step counts each second; a stack request answered in between came before
    # the steps just taken, and ddlctl judged the stacks (a task ending) with a stale count
    s = session(tmp_path)
    try:
        # (its records written as ddlctl.step writes them, by a shell: no stack dumper, so a stack
        # request is answered at once, not after the 1.5 s a dumper is given)
        record = '{"task": "worker:0", "step": %d, "start_us": 1, "duration_s": 0.001, "samples": null}'
        script = "".join(f"echo '{record % i}' >> \"$DDLCTL_TASK_DIR/steps.jsonl\"; " for i in range(1, 6))
        shell = dataclasses.replace(spec("worker:0", "", tmp_path / "w0"),
                                    argv=("sh", "-c", f"{script}echo ready; sleep 60"))
        task = s.start(shell, 1)
        assert s.wait_for(lambda: b"ready" in b"".join(task.chunks), 20)
        s.request_dump(["worker:0"])
        assert s.wait_for(lambda: s.dump_of("worker:0") is not None, 10)
        assert s.step_counts()["worker:0"][0] == 5
    finally:
        s.shutdown()
        s.close()


def test_a_task_that_ends_before_the_next_step_report_has_its_steps_counted_by_its_exit(tmp_path):
    # the agent reports step counts each second: a task that stepped and ended in between was
    # never counted, and ddlctl's checks at its end (a program that trained without joining its
    # cluster, a task that ended early) saw no steps
    s = session(tmp_path)
    try:
        record = '{"task": "worker:0", "step": %d, "start_us": 1, "duration_s": 0.001, "samples": null}'
        script = "".join(f"echo '{record % i}' >> \"$DDLCTL_TASK_DIR/steps.jsonl\"; " for i in range(1, 4))
        for attempt in range(3):  # (its life, 10 ms, falls between two reports: each attempt a new task)
            name = f"worker:{attempt}"
            quick = dataclasses.replace(spec(name, "", tmp_path / f"w{attempt}"), argv=("sh", "-c", script))
            task = s.start(quick, 1)
            assert s.wait_for(lambda task=task: task.poll() is not None, 20)
            assert task.poll().code == 0
            assert s.step_counts().get(name, (0,))[0] == 3, "counted by the time its exit was known"
    finally:
        s.shutdown()
        s.close()


def test_dumps_count_each_tasks_cpu_seconds_and_the_bytes_it_moved(tmp_path):
    s = session(tmp_path)
    try:
        busy = s.start(spec("worker:0", "import os\nout = open(os.devnull, 'wb')\nprint('ready', flush=True)\n"
                                        "while True:\n    out.write(bytes(1 << 16))\n", tmp_path / "w0"), 1)
        idle = s.start(spec("worker:1", "import time; print('ready', flush=True); time.sleep(60)", tmp_path / "w1"), 1)
        names = ["worker:0", "worker:1"]
        assert s.wait_for(lambda: all(b"ready" in b"".join(t.chunks) for t in (busy, idle)), 20)

        def look() -> dict:
            s.request_dump(names)
            assert s.wait_for(lambda: all(s.dump_of(n) for n in names), 10)
            return {n: s.dump_of(n) for n in names}

        first = look()
        time.sleep(1.0)
        second = look()
        seconds = second["worker:0"]["at"] - first["worker:0"]["at"]
        assert seconds >= 1.0
        moved = {n: (second[n]["cpu_s"] - first[n]["cpu_s"], second[n]["io_bytes"] - first[n]["io_bytes"])
                 for n in names}
        assert moved["worker:0"][0] > 0.1 * seconds and moved["worker:0"][1] > 2**20, moved
        assert moved["worker:1"][0] < 0.05 and moved["worker:1"][1] < 2**16, moved
    finally:
        s.shutdown()
        s.close()


def test_processes_of_a_run_id_are_another_launchs_unless_they_carry_this_launchs_key():
    from ddlctl.host.procs import run_elsewhere

    env = {**os.environ, "DDLCTL_RUN_ID": "r-elsewhere", "DDLCTL_LAUNCH": "k1"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        wait = time.monotonic() + 10
        while not run_elsewhere("r-elsewhere", "k2") and time.monotonic() < wait:
            time.sleep(0.05)
        assert [pid for pid, _command in run_elsewhere("r-elsewhere", "k2")] == [child.pid]
        assert "time.sleep(30)" in run_elsewhere("r-elsewhere", "k2")[0][1]
        assert run_elsewhere("r-elsewhere", "k1") == [] and run_elsewhere("r-other", "k2") == []
    finally:
        child.kill()
        child.wait()


def test_ports_still_free_are_kept_taken_ones_replaced_and_listening_is_reported(tmp_path):
    s = session(tmp_path)
    holder = socket.socket()
    holder.bind(("", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    try:
        with socket.socket() as probe:
            probe.bind(("", 0))
            free = probe.getsockname()[1]
        got = s.check_ports({"worker:0": free, "worker:1": taken})
        assert got["worker:0"] == free and got["worker:1"] not in (taken, free)
        code = f"import socket, time; s = socket.socket(); s.bind(('', {free})); s.listen(); time.sleep(30)"
        task = s.start(spec("worker:0", code, tmp_path / "w0", port=free), 1)
        assert s.wait_for(lambda: task.listening, 10)
    finally:
        holder.close()
        s.shutdown()
        s.close()


def test_checkpoint_folders_are_copied_only_where_they_are_not_shared(tmp_path):
    from ddlctl.supervise.recovery.checkpoints import files_to_copy, sync_folder

    source_dir, target_dir = tmp_path / "a" / "checkpoints", tmp_path / "b" / "checkpoints"
    (source_dir / "sub").mkdir(parents=True)
    (source_dir / "checkpoint").write_text('model_checkpoint_path: "ckpt-160"\n')
    (source_dir / "sub" / "ckpt-160.data").write_bytes(os.urandom(3 * (1 << 20) + 17))  # several chunks
    one, two = session(tmp_path / "s1"), session(tmp_path / "s2")
    try:
        assert sync_folder(one, str(source_dir), two, str(source_dir)) == (0, 0), "a shared folder: nothing"
        files, size = sync_folder(one, str(source_dir), two, str(target_dir))
        assert files == 2 and size == sum(p.stat().st_size for p in source_dir.rglob("*") if p.is_file())
        for name in ("checkpoint", "sub/ckpt-160.data"):
            assert (target_dir / name).read_bytes() == (source_dir / name).read_bytes()
        assert sync_folder(one, str(source_dir), two, str(target_dir)) == (0, 0), "copied once"
        (source_dir / "checkpoint").write_text('model_checkpoint_path: "ckpt-240"\n')  # same size, newer
        assert sync_folder(one, str(source_dir), two, str(target_dir))[0] == 1
        assert "ckpt-240" in (target_dir / "checkpoint").read_text()
        with pytest.raises(OSError, match="localhost"):
            sync_folder(one, str(source_dir), two, "/proc/no/such")
    finally:
        for s in (one, two):
            s.shutdown()
            s.close()
    assert files_to_copy({"a": (1, 2), "b": (3, 4)}, {"a": (1, 2), "b": (3, 5)}) == ["b"]


def test_task_files_come_back_as_a_tar_streamed_in_pieces_and_are_unpacked_as_they_come(tmp_path):
    """Collection at a run's end: the agent writes the tar as it packs, in pieces of at most 1 MiB
    (a step file of millions of lines is never held whole on either side)."""
    import tarfile

    from ddlctl.transport.fleet import ChunkReader

    folder = tmp_path / "tasks" / "worker-0"
    folder.mkdir(parents=True)
    steps = os.urandom(3 * (1 << 20) + 5)  # three pieces and more
    (folder / "steps.jsonl").write_bytes(steps)
    (folder / "result.json").write_text('{"accuracy": 0.9}')
    (folder / "output.log").write_text("streamed already: left out")
    one = session(tmp_path / "s")
    try:
        pieces = list(one.pack_chunks({"worker-0": str(folder)}))
        assert len(pieces) >= 4 and all(len(p) <= 1 << 20 for p in pieces)
        with tarfile.open(fileobj=ChunkReader(iter(pieces)), mode="r|") as archive:
            got = {m.name: archive.extractfile(m).read() for m in archive if m.isfile()}
        assert got == {"worker-0/result.json": b'{"accuracy": 0.9}', "worker-0/steps.jsonl": steps}
        missing = str(tmp_path / "missing")
        with tarfile.open(fileobj=ChunkReader(one.pack_chunks({"gone": missing})), mode="r|") as empty:
            assert [m.name for m in empty] == [], "a missing folder gives nothing"
        assert not one.list_files(missing)
    finally:
        one.shutdown()
        one.close()


def test_the_newest_checkpoint_state_is_found_in_the_folder_or_where_keras_backup_keeps_it(tmp_path):
    """Growing back waits for the leader's next checkpoint: the ``checkpoint`` state file of a
    CheckpointManager in the folder, or the one Keras's BackupAndRestore keeps in ``chief/``."""
    from ddlctl.supervise.recovery.checkpoints import checkpoint_step, newest_state

    folder = tmp_path / "checkpoints"
    (folder / "chief").mkdir(parents=True)
    (folder / "chief" / "checkpoint").write_text('model_checkpoint_path: "chief/ckpt-3"\n')
    (folder / "deep" / "er").mkdir(parents=True)
    (folder / "deep" / "er" / "checkpoint").write_text("not a level down")
    one = session(tmp_path / "s")
    try:
        files = one.list_files(str(folder))
        assert newest_state(files) == files["chief/checkpoint"]
        assert checkpoint_step(one.read_file(str(folder / "chief" / "checkpoint"))) == 3
        (folder / "checkpoint").write_text('model_checkpoint_path: "ckpt-40"\n')
        os.utime(folder / "checkpoint", ns=(2 * 10**18, 2 * 10**18))  # the newer of the two
        assert newest_state(one.list_files(str(folder))) == one.list_files(str(folder))["checkpoint"]
    finally:
        one.shutdown()
        one.close()
    assert newest_state({"ckpt-1.index": (1, 2)}) is None


def test_checkpoint_copies_never_follow_a_link_nor_take_a_name_outside_the_folder(tmp_path):
    from ddlctl.supervise.recovery.checkpoints import sync_folder, unsafe_name

    secret = tmp_path / "secret.txt"  # another file of the user's, which a planted link points at
    secret.write_text("not for copying")
    source_dir, target_dir = tmp_path / "a", tmp_path / "b"
    source_dir.mkdir()
    target_dir.mkdir()
    (source_dir / "ckpt-1.index").write_text("index")
    (source_dir / "ckpt-1.data").symlink_to(secret)  # planted in the source folder
    (source_dir / "linked").symlink_to(tmp_path, target_is_directory=True)
    os.mkfifo(source_dir / "pipe")
    one = session(tmp_path / "s1")
    try:
        assert one.list_files(str(source_dir)) == {"ckpt-1.index": ((source_dir / "ckpt-1.index").stat().st_size,
                                                                     (source_dir / "ckpt-1.index").stat().st_mtime_ns)}
        with pytest.raises(OSError, match="ckpt-1.data"):
            one.read_file(str(source_dir / "ckpt-1.data"))
        assert sync_folder(one, str(source_dir), one, str(target_dir))[0] == 1
        assert sorted(p.name for p in target_dir.iterdir()) == ["ckpt-1.index"]
        # a link planted where the copy is written is not written through
        (target_dir / "ckpt-2.index.ddlctl-partial").symlink_to(secret)
        with pytest.raises(OSError, match="ckpt-2.index"):
            one.write_file(str(target_dir / "ckpt-2.index"), b"overwritten?")
        assert secret.read_text() == "not for copying"
    finally:
        one.shutdown()
        one.close()
    assert [n for n in ("a", "sub/a", "../a", "/etc/a", "a/../../b", "", "a//b", "./a", "a\\b") if unsafe_name(n)] == \
        ["../a", "/etc/a", "a/../../b", "", "a//b", "./a", "a\\b"]


def test_a_tasks_gpus_are_taken_from_the_list_the_host_gave_the_agent(tmp_path, monkeypatch):
    from ddlctl.host.devices import visible_devices

    assert visible_devices("0", "2,3") == "2" and visible_devices("1", "2,3") == "3"
    assert visible_devices("0,1", "GPU-aa,GPU-bb") == "GPU-aa,GPU-bb"
    assert visible_devices("", "2,3") == "" and visible_devices("1", None) == "1"
    assert visible_devices("5", "2,3") == "5"  # outside the list: the plan's value stands
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # e.g. a Slurm step that holds GPUs 2 and 3
    s = session(tmp_path)
    try:
        code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
        tasks = [s.start(spec(f"worker:{i}", code, tmp_path / f"w{i}", env={"CUDA_VISIBLE_DEVICES": str(i)}), 5)
                 for i in range(2)]
        ps = s.start(spec("ps:0", code, tmp_path / "p0", env={"CUDA_VISIBLE_DEVICES": ""}), 5)
        assert s.wait_for(lambda: all(t.poll() for t in (*tasks, ps)), 30)
        assert [output(t) for t in (*tasks, ps)] == [b"2\n", b"3\n", b"\n"]
    finally:
        s.shutdown()
        s.close()


def test_a_signalled_agent_is_a_lost_host_and_still_stops_its_tasks_however_much_they_print(tmp_path):
    s = session(tmp_path)
    # on SIGTERM the task prints 1 MiB (more than any pipe holds) before leaving
    code = ("import signal, sys, time\n"
            "def bye(*_):\n    sys.stdout.write('x' * (1 << 20)); sys.stdout.flush(); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye)\nprint('up', flush=True)\ntime.sleep(60)\n")
    try:
        task = s.start(spec("worker:0", code, tmp_path / "w0"), 5)
        assert s.wait_for(lambda: b"up" in b"".join(task.chunks), 30)
        agent = psutil.Process(task.pids()["agent_pid"])
        child = psutil.Process(task.pids()["task_pid"])
        agent.send_signal(signal.SIGTERM)  # e.g. scancel of its Slurm step, a host shutting down
        assert s.wait_for(lambda: s.lost is not None, 5), "the agent said it was signalled: the session is lost"
        assert s.lost and "received SIGTERM" in s.lost
        assert task.poll().lost  # the task ended with its host, not by its own doing
        psutil.wait_procs([agent, child], timeout=15)  # the agent finishes, never blocked on its output
        assert not agent.is_running() and not child.is_running()
    finally:
        s.close()


class ReusedPipe:
    """An agent's stream over a real pipe whose close hands its descriptor number straight to
    another pipe (dup2), as the kernel does when the next agent starts right after."""

    def __init__(self) -> None:
        self.fd, self.agent_end = os.pipe()
        os.set_blocking(self.fd, False)
        self.next_read, self.next_write = os.pipe()

    def fileno(self) -> int:
        return self.fd

    def ended(self) -> str:
        return ""

    def read(self) -> bytes | None:
        try:
            return os.read(self.fd, 65536)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def write(self, data: bytes) -> None:
        pass

    def errors(self) -> str:
        return ""

    def abandon(self) -> None:
        self.close()

    def close(self) -> None:
        os.dup2(self.next_read, self.fd)  # the number now reads the next agent's pipe


def test_a_closed_session_never_reads_its_descriptor_number_again():
    """A signalled agent's session drains it in a thread; once the session is closed its
    descriptor number is free, and the next agent's pipe may get it at once (found in CI: the next
    session never saw its agent's hello, the old thread read it). The thread must leave it alone."""
    import threading

    stream = ReusedPipe()
    s = HostSession(HOST, stream, [], sys.executable)
    before = {t for t in threading.enumerate() if t.name == "drain-localhost"}  # (an earlier test's may linger)
    os.write(stream.agent_end, MAGIC + encode_frame({"k": "hello"}) + encode_frame({"k": "signalled", "sig": 15}))
    s.pump()
    assert s.lost and "SIGTERM" in s.lost  # and draining, in a thread
    drains = [t for t in threading.enumerate() if t.name == "drain-localhost" and t not in before]
    assert len(drains) == 1
    time.sleep(0.2)  # the thread waits on the (quiet) old pipe
    s.close()
    os.write(stream.next_write, b"hello of the next agent")
    drains[0].join(3.0)  # it wakes at least once a second
    assert not drains[0].is_alive()
    os.set_blocking(stream.fd, False)
    assert os.read(stream.fd, 100) == b"hello of the next agent"
    for fd in (stream.fd, stream.agent_end, stream.next_read, stream.next_write):
        os.close(fd)


def test_cluster_tasks_retry_grpc_connections_quickly_unless_told_otherwise(tmp_path):
    """A task of a TensorFlow cluster (it has TF_CONFIG) gets gRPC's first reconnect after 50 ms
    (TF_GRPC_DEFAULT_OPTIONS), not 1 s; a value the user or host gave wins; other tasks get nothing."""
    code = "import os; print(os.environ.get('TF_GRPC_DEFAULT_OPTIONS', 'unset'))"
    s = session(tmp_path)
    try:
        tasks = {
            "worker:0": s.start(spec("worker:0", code, tmp_path / "w0", env={"TF_CONFIG": "{}"}), 5),
            "worker:1": s.start(spec("worker:1", code, tmp_path / "w1", env={
                "TF_CONFIG": "{}", "TF_GRPC_DEFAULT_OPTIONS": "grpc.initial_reconnect_backoff_ms=7"}), 5),
            "worker:2": s.start(spec("worker:2", code, tmp_path / "w2"), 5),
        }
        assert s.wait_for(lambda: all(t.poll() for t in tasks.values()), 30), \
            (s.lost, {name: t.poll() for name, t in tasks.items()})
        said = {name: output(task).decode().strip() for name, task in tasks.items()}
        assert said == {"worker:0": "grpc.initial_reconnect_backoff_ms=50",
                        "worker:1": "grpc.initial_reconnect_backoff_ms=7", "worker:2": "unset"}
    finally:
        s.shutdown()
        s.close()


def test_tasks_keep_freed_memory_unless_their_environment_tunes_malloc(tmp_path):
    """Every task gets glibc's MALLOC_TOP_PAD_ (64 MiB kept at the top of each heap, not handed back
    to the kernel and faulted in again at every step); an environment that sets a malloc threshold of
    its own, as a variable or a glibc tunable, gets nothing added."""
    code = ("import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
            "if k.startswith('MALLOC_') or k == 'GLIBC_TUNABLES'}))")
    s = session(tmp_path)
    given = {"worker:0": {}, "worker:1": {"MALLOC_TOP_PAD_": "0"}, "worker:2": {"MALLOC_TRIM_THRESHOLD_": "1048576"},
             "worker:3": {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"},
             "worker:4": {"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=4096"}}
    try:
        tasks = {name: s.start(spec(name, code, tmp_path / name.replace(":", "-"), env=env), 5)
                 for name, env in given.items()}
        assert s.wait_for(lambda: all(t.poll() for t in tasks.values()), 30), s.lost
        said = {name: json.loads(output(task)) for name, task in tasks.items()}
    finally:
        s.shutdown()
        s.close()
    pad = {"MALLOC_TOP_PAD_": str(64 * 2**20)}
    assert said == {"worker:0": pad, "worker:1": given["worker:1"], "worker:2": given["worker:2"],
                    "worker:3": given["worker:3"], "worker:4": {**given["worker:4"], **pad}}


def test_listening_sockets_over_netlink_match_proc_net_tcp(tmp_path):
    """The netlink reading (sock_diag) and /proc/net/tcp* agree, IPv4 and IPv6, over a dump that
    takes several netlink messages; a socket that stops listening disappears from both."""
    from ddlctl.host import procs

    sockets = []
    try:
        for i in range(300):
            family, address = (socket.AF_INET6, "::1") if i % 10 == 0 else (socket.AF_INET, "127.0.0.1")
            sock = socket.socket(family)
            sock.bind((address, 0))
            sock.listen()
            sockets.append(sock)
        ports = {s.getsockname()[1] for s in sockets}
        own = {str(os.fstat(s.fileno()).st_ino) for s in sockets}

        def mine(found: dict) -> dict:  # (other tests open and close sockets between the two readings)
            return {port: inodes & own for port, inodes in found.items() if inodes & own}

        by_netlink, by_proc = procs._listening_by_netlink(), procs._listening_by_proc()
        assert set(mine(by_netlink)) == ports
        assert mine(by_netlink) == mine(by_proc)
        closed = sockets.pop()
        gone = str(os.fstat(closed.fileno()).st_ino)
        closed.close()
        assert all(gone not in inodes for inodes in procs.listening_sockets().values())
    finally:
        for sock in sockets:
            sock.close()


def test_a_ps_chiefs_step_records_credit_the_workers_that_ran_them(tmp_path):
    from ddlctl.host.stepfollow import StepFile

    path = tmp_path / "steps.jsonl"
    path.write_text('{"step": 1, "steps": 10, "worker": "worker:0", "total": 100}\n'
                    '{"step": 11, "steps": 10, "worker": "worker:1"}\n{"step": 21, "steps": 10, "worker": "worker:0"}\n'
                    '{"step": 31, "steps": 10, "worker": "worker:1"')  # not complete yet
    steps = StepFile(str(path))
    assert steps.poll() == 30
    assert (steps.credits, steps.last, steps.total) == ({"worker:0": 20, "worker:1": 10}, 30, 100)
    with path.open("a") as handle:
        handle.write("}\n")
    assert steps.poll() == 40 and steps.credits == {"worker:0": 20, "worker:1": 20}


def test_descendants_are_found_below_a_process_children_first_leaving_out_skipped_subtrees():
    from ddlctl.host import procs

    # 1 -> 2 -> 3; 1 -> 4 -> 5 -> 6; 7 (another tree) -> 8
    table = {2: 1, 3: 2, 4: 1, 5: 4, 6: 5, 8: 7, 1: 0, 7: 0}
    assert sorted(procs.descendants(1, table=table)) == [2, 3, 4, 5, 6]
    assert sorted(procs.descendants(1, skip={4}, table=table)) == [2, 3]  # a zygote and what it forks
    found = procs.descendants(1, table=table)
    assert found.index(4) < found.index(5) < found.index(6)  # a parent before its children
    # the real table: this test's process has a child, which has one of its own
    child = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while not procs.descendants(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        below, table = procs.descendants(os.getpid()), procs.parents()
        assert child.pid in below and any(table.get(pid) == child.pid for pid in below), below
    finally:
        for pid in procs.descendants(child.pid):
            os.kill(pid, 9)
        child.kill()
        child.wait()


def test_a_hostile_task_cannot_crash_fake_or_reach_the_terminal_through_ddlctl(tmp_path):
    # its steps file holds Infinity, 2**64, random bytes and escapes; its output random bytes and
    # escapes; it writes frames to its agent's streams. Before: the agent died of OverflowError
    # (the host lost, every task with it), the report and the summary died of 2**64, the escapes
    # reached the terminal raw. Now the job ends as its program does, with its report.
    program = [sys.executable, str(PROGRAMS / "hostile.py")]
    # (as root, without the capability that passes by a sealed process: what any other user has)
    unprivileged = ["setpriv", "--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace"] if os.geteuid() == 0 else []
    for fail, code in (("0", 0), ("1", 1)):
        runs = tmp_path / f"runs{fail}"
        done = subprocess.run([*unprivileged, *ddlctl_cmd("launch", "-s", "one_device", "--runs-dir", str(runs),
                                                          "--", *program)],
                              capture_output=True, timeout=120, cwd=ROOT,
                              env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200", "HOSTILE_FAIL": fail})
        console = (done.stdout + done.stderr).decode("utf-8")  # (all UTF-8: a task's other bytes escaped)
        assert done.returncode == code, console[-3000:]
        assert not re.search("[\x1b\x07\x9b]", console), repr(console[-2000:])
        assert "title^[[2J^[[H^[]0;owned^G" in console and "<U+009B>31m" in console, console[-3000:]
        assert "lone \\x9b31m C1" in console, console[-3000:]
        # the host agent and the telemetry agent are sealed: no task writes their memory
        assert "mem agent refused: Permission denied" in console, console[-3000:]
        assert "mem telemetry refused: Permission denied" in console, console[-3000:]
        run_dir = only_run_dir(runs)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["tasks"][0]["steps"] == 8 and summary["skipped_lines"] >= 3, summary["tasks"]
        assert not processes_of_run(run_dir.name)
        report = run_ddlctl("report", str(run_dir), "--csv", str(tmp_path / f"csv{fail}"))
        assert report.returncode == 0 and "\x1b" not in report.stdout + report.stderr, report.stderr[-2000:]
    said = done.stderr.decode("utf-8", "replace")
    assert "✗ worker:0 on localhost failed" in said and "bad^[[2J^[[H" in said, said[-3000:]
