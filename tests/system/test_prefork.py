"""TensorFlow tasks forked from a zygote that imported TensorFlow once (ddlctl.host.prefork and
.zygote): each runs as ``python script.py`` would, as its agent's own child; a zygote that cannot
import falls back to the plain start; ``DDLCTL_PREFORK=0`` turns it off."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ddlctl.cluster.model import Host
from ddlctl.host import prefork
from ddlctl.planning.plan import TaskSpec
from ddlctl.transport.local import open_local_session
from tests.conftest import processes_of_run

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
HOST = Host(name="localhost")


def spec(name: str, argv: tuple[str, ...], task_dir: Path, env: dict[str, str] | None = None) -> TaskSpec:
    return TaskSpec(name=name, role=name.split(":")[0], index=int(name.split(":")[1]), host=HOST, port=None,
                    kind="program", argv=argv, env={"DDLCTL_TASK_DIR": str(task_dir), "DDLCTL_TASK": name,
                                                    "DDLCTL_RUN_ID": "prefork-test", **(env or {})},
                    unset_env=(), workdir=str(task_dir.parent), task_dir=str(task_dir), gpus=None, tf_config=None)


def output(task) -> bytes:  # noqa: ANN001
    data = b""
    while (chunk := task.read()) not in (None, b""):
        data += chunk
    return data


def nothing_left(run_id: str, within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while processes_of_run(run_id):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def said(data: bytes) -> dict:
    return json.loads(next(line for line in data.splitlines() if line.startswith(b"{")))


def test_which_commands_fork_and_which_tasks_share_a_zygote(tmp_path):
    program = tmp_path / "train.py"
    program.write_text("import os\nfrom tensorflow import keras\n")
    plain = tmp_path / "plain.py"
    plain.write_text("import torch  # a tensorflow-free program: 'import tensorflow' in a comment\n")
    py = sys.executable
    assert prefork.command_form([py, "-u", "train.py", "--x"]) == ((py, "-u"), "script", "train.py")
    assert prefork.command_form([py, "-m", "ddlctl.workloads"]) == ((py,), "-m", "ddlctl.workloads")
    assert prefork.command_form(["env", "python3", "train.py"]) is None
    assert prefork.command_form([py, "-c", "import tensorflow"]) is None
    assert prefork.command_form([py, "-X", "importtime", "train.py"]) is None
    assert prefork.forkable([py, "train.py"], {}, str(tmp_path)) is not prefork.gpu_host()
    assert not prefork.forkable([py, "plain.py"], {}, str(tmp_path))
    assert not prefork.forkable([py, "missing.py"], {}, str(tmp_path))
    assert not prefork.forkable([py, "train.py"], {"DDLCTL_PREFORK": "0"}, str(tmp_path))
    assert not prefork.forkable([py, "-m", "ddlctl.host.telemetry"], {}, None)
    # --bench: the device measurement imports TensorFlow (forked); the link measurements do not
    bench = [py, "-m", "ddlctl.task.devbench"]
    assert prefork.forkable([*bench, "devices", "--seconds", "1"], {}, None) is not prefork.gpu_host()
    assert not prefork.forkable([*bench, "serve"], {}, None)
    assert not prefork.forkable([*bench, "connect", "h:1"], {}, None)
    assert not prefork.forkable([*bench], {}, None)
    # a program that sets its own environment may do so before its imports read it: not forked
    for line in ('os.environ["KERAS_BACKEND"] = "jax"', "os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')",
                 "environ.update(A='1')", "os.putenv('A', '1')"):
        (tmp_path / "sets.py").write_text(f"import os\n{line}\nimport keras\n")
        assert not prefork.forkable([py, "sets.py"], {}, str(tmp_path)), line
    (tmp_path / "reads.py").write_text("import os\nif os.environ['A'] == '1':\n    import tensorflow\n")
    assert prefork.forkable([py, "reads.py"], {}, str(tmp_path)) is not prefork.gpu_host()
    # python -m MODULE: the module's file (and its packages' __init__.py) where the task's Python finds it
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__init__.py").write_text("")
    (tmp_path / "trainer" / "task.py").write_text("import tensorflow as tf\n")
    (tmp_path / "trainer" / "__main__.py").write_text("import json\n")
    (tmp_path / "src" / "nspkg").mkdir(parents=True)  # a namespace package (no __init__.py), on PYTHONPATH
    (tmp_path / "src" / "nspkg" / "job.py").write_text("import keras\n")
    assert prefork.module_files("trainer.task", str(tmp_path), {}) == [
        str(tmp_path / "trainer" / "__init__.py"), str(tmp_path / "trainer" / "task.py")]
    assert prefork.forkable([py, "-m", "trainer.task"], {}, str(tmp_path)) is not prefork.gpu_host()
    assert not prefork.forkable([py, "-m", "trainer"], {}, str(tmp_path)), "its __main__.py imports no TensorFlow"
    assert prefork.forkable([py, "-m", "nspkg.job"], {"PYTHONPATH": "src"}, str(tmp_path)) is not prefork.gpu_host()
    assert not prefork.forkable([py, "-m", "nspkg.job"], {}, str(tmp_path))
    assert not prefork.forkable([py, "-m", "trainer.task"], {"PYTHONSAFEPATH": "1"}, str(tmp_path)), "not its folder"
    assert not prefork.forkable([py, "-m", "json.tool"], {}, str(tmp_path)), "installed: not ddlctl's to read"
    (tmp_path / "trainer" / "__init__.py").write_text("import os\nos.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n")
    assert not prefork.forkable([py, "-m", "trainer.task"], {}, str(tmp_path)), "its package sets the environment"
    # what ddlctl's own modules set before importing TensorFlow, their zygote imports with
    env = {"A": "1"}
    prefork.import_environment([py, "-m", "ddlctl.task.server"], env)
    assert env == {"A": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env = {"TF_CPP_MIN_LOG_LEVEL": "0"}
    prefork.import_environment([py, "-m", "ddlctl.workloads"], env)
    assert env == {"TF_CPP_MIN_LOG_LEVEL": "0"}, "the user's choice stands"
    env = {}
    prefork.import_environment([py, "train.py"], env)
    assert env == {}
    worker = {"TF_CONFIG": '{"task": {"type": "worker", "index": 0}}', "DDLCTL_TASK": "worker:0", "A": "1"}
    ps = {"TF_CONFIG": '{"task": {"type": "ps", "index": 0}}', "DDLCTL_TASK": "ps:0", "A": "1",
          "CUDA_VISIBLE_DEVICES": "", "PYTHONSAFEPATH": "1"}
    assert prefork.zygote_key([py, "train.py"], worker) == prefork.zygote_key([py, "-m", "ddlctl.workloads"], ps)
    assert prefork.zygote_key([py, "train.py"], worker) != prefork.zygote_key([py, "train.py"], {**worker, "A": "2"})
    assert prefork.zygote_key([py, "train.py"], worker) != prefork.zygote_key([py, "-u", "train.py"], worker)
    legacy = {**worker, "TF_USE_LEGACY_KERAS": "1"}  # read when TensorFlow is imported: its own zygote
    assert prefork.zygote_key([py, "train.py"], worker) != prefork.zygote_key([py, "train.py"], legacy)
    # under ps, the servers (workers, ps) and the program (the chief) of one host share a zygote: one
    # TensorFlow import for all of them (the built-in workload as a command; before, the program's
    # DDLCTL_AUTO_STEPS, the model.fit hook's switch, gave it a zygote of its own)
    from ddlctl.cluster.model import local_cluster
    from ddlctl.planning.plan import LaunchRequest, make_plan

    for command in ((py, "-m", "ddlctl.workloads"), None):
        req = LaunchRequest(strategy="ps", run_id="r1", run_dir=str(tmp_path), local_python=py,
                            default_workdir=str(tmp_path), workers=2, command=command)
        keys = set()
        for task in make_plan(local_cluster(3), req, {}).tasks:
            env = dict(task.env)
            prefork.import_environment(list(task.argv), env)
            keys.add(prefork.zygote_key(list(task.argv), env))
        assert len(keys) == 1, (command, keys)
    # an interpreter given relative to the task's folder (".venv/bin/python") is the one there
    relative = os.path.relpath(py, tmp_path)
    assert prefork.zygote_key([relative, "train.py"], worker, str(tmp_path)) == \
        prefork.zygote_key([py, "train.py"], worker)


def test_forked_tasks_run_as_python_would_start_them_and_are_the_agents_children(tmp_path):
    if prefork.gpu_host():
        return  # (a GPU host starts every task the plain way)
    session = open_local_session(HOST, "prefork-test", tmp_path / "agents")
    program = str(PROGRAMS / "forked.py")
    try:
        tasks = {name: session.start(spec(name, (sys.executable, program, *args), tmp_path / name.replace(":", "-")), 5)
                 for name, args in (("worker:0", ("exit", "3")), ("worker:1", ("raise",)), ("worker:2", ("sleep",)))}
        assert session.wait_for(lambda: all(t.pids().get("task_pid") for t in tasks.values()), 120)
        # an environment longer than the room the zygote kept for one: the fork runs the command itself
        big = {"DDLCTL_DEVICES": json.dumps([{"name": f"worker:{i}", "speed": 1.0} for i in range(1000)])}
        argv = (sys.executable, program, "exit", "4")
        tasks["worker:3"] = session.start(spec("worker:3", argv, tmp_path / "worker-3", big), 5)
        # an interpreter given relative to the task's folder: forked too, by the same zygote
        relative = (os.path.relpath(sys.executable, tmp_path), program, "exit", "5")
        tasks["worker:4"] = session.start(spec("worker:4", relative, tmp_path / "worker-4"), 5)
        # a script that does not compile: Python's own report of it (no traceback, no zygote frames)
        broken = tmp_path / "broken.py"
        broken.write_text("import tensorflow as tf\n\nx = (\n")
        tasks["worker:5"] = session.start(spec("worker:5", (sys.executable, str(broken)), tmp_path / "worker-5"), 5)
        # Ctrl-C in the program: Python's report of the KeyboardInterrupt (its frames alone), then
        # death by SIGINT (as Python ends after an uncaught one)
        interrupted = tmp_path / "interrupted.py"
        interrupted.write_text("import os, signal, time\nif os.environ.get('NEVER'):\n    import tensorflow\n"
                               "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\n")
        tasks["worker:10"] = session.start(spec("worker:10", (sys.executable, str(interrupted)),
                                                tmp_path / "worker-10"), 5)
        # a program run as a module (python -m package.module), forked too
        (tmp_path / "usermod").mkdir()
        (tmp_path / "usermod" / "__init__.py").write_text("")
        (tmp_path / "usermod" / "job.py").write_text((PROGRAMS / "forked.py").read_text())
        module = (sys.executable, "-m", "usermod.job", "exit", "8")
        tasks["worker:7"] = session.start(spec("worker:7", module, tmp_path / "worker-7"), 5)
        # a task without a folder of its own runs in its agent's, forked or not
        homeless = dataclasses.replace(spec("worker:8", (sys.executable, program, "exit", "9"), tmp_path / "worker-8"),
                                       workdir=None)
        tasks["worker:8"] = session.start(homeless, 5)
        # PYTHONPATH relative to the task's folder (the zygote's is another): its modules import
        (tmp_path / "lib").mkdir()
        (tmp_path / "lib" / "prefork_helper.py").write_text("")
        tasks["worker:6"] = session.start(spec("worker:6", (sys.executable, program, "import"), tmp_path / "worker-6",
                                               {"PYTHONPATH": "lib"}), 5)
        # what importing TensorFlow prints (its start-up notices) comes when the program imports it,
        # as in a plain start; the zygote printed it, once, before the fork
        notices = tmp_path / "notices.py"
        notices.write_text("print('before', flush=True)\nimport tensorflow as tf\nprint('after', flush=True)\n")
        tasks["worker:11"] = session.start(spec("worker:11", (sys.executable, str(notices)), tmp_path / "worker-11"), 5)
        # the agent's MALLOC_TOP_PAD_ reaches a forked task (its zygote's malloc read it at start)
        malloc = (sys.executable, program, "malloc")
        tasks["worker:9"] = session.start(spec("worker:9", malloc, tmp_path / "worker-9"), 5)
        assert session.wait_for(lambda: all(tasks[f"worker:{i}"].poll() for i in (0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11)),
                                120)
        outs = {name: output(task) for name, task in tasks.items() if name != "worker:2"}  # (all there is)
        # freed memory kept: the second round of allocations faults nothing in (glibc's default, as
        # Python started without ddlctl has it, hands it back and faults it all in again)
        kept = json.loads(outs["worker:9"].splitlines()[-1])
        default = subprocess.run([sys.executable, str(PROGRAMS / "malloc_faults.py")], capture_output=True,
                                 timeout=60, env={k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")})
        given_back = json.loads(default.stdout)
        assert given_back["second"] > 0.8 * given_back["first"] > 4000, given_back
        assert kept["first"] > 4000 and kept["second"] < 0.05 * kept["first"], kept
        plain = subprocess.run([sys.executable, str(broken)], capture_output=True, timeout=120)
        assert tasks["worker:5"].poll().code == plain.returncode == 1
        assert outs["worker:5"] == plain.stderr and outs["worker:5"].startswith(f'  File "{broken}", line 3'.encode())
        assert json.loads((tmp_path / "worker-5" / "pid.json").read_text())["forked"] is True
        # (Python started with SIGINT ignored keeps ignoring it, as under a shell's `&`: the suite
        # run in the background; the plain start is given the default a terminal gives)
        plain = subprocess.run([sys.executable, str(interrupted)], capture_output=True, timeout=60,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        assert plain.returncode == -signal.SIGINT and tasks["worker:10"].poll().signal == signal.SIGINT
        assert outs["worker:10"] == plain.stderr and plain.stderr.endswith(b"KeyboardInterrupt\n"), outs["worker:10"]
        assert json.loads((tmp_path / "worker-10" / "pid.json").read_text())["forked"] is True
        plain = subprocess.run([sys.executable, str(notices)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=120, env={**os.environ, "DDLCTL_TASK": "worker:11"})
        glog = re.compile(rb"^([IWEF])\d{4} [\d:.]+\s+\d+ ", re.M)  # (time and thread id: the zygote's)
        assert glog.sub(rb"\1 ", outs["worker:11"]) == glog.sub(rb"\1 ", plain.stdout), \
            (outs["worker:11"], plain.stdout)
        assert plain.stdout.startswith(b"before\n") and plain.stdout.endswith(b"after\n") and len(plain.stdout) > 13
        assert json.loads((tmp_path / "worker-11" / "pid.json").read_text())["forked"] is True
        assert tasks["worker:6"].poll().code == 7, outs["worker:6"]
        assert tasks["worker:8"].poll().code == 9 and said(outs["worker:8"])["already"]
        agents_folder = psutil.Process(tasks["worker:8"].pids()["agent_pid"]).cwd()
        assert said(outs["worker:8"])["cwd"] == agents_folder != "/"
        as_module = said(outs["worker:7"])
        assert tasks["worker:7"].poll().code == 8 and as_module["already"] and as_module["name"] == "__main__"
        assert as_module["argv"] == [str(tmp_path / "usermod" / "job.py"), "exit", "8"]
        assert as_module["path0"] == str(tmp_path)
        imported = json.loads(outs["worker:6"].splitlines()[-1])
        assert imported["helper"] == str(tmp_path / "lib" / "prefork_helper.py")
        assert str(tmp_path / "lib") in imported["path"] and "//lib" not in imported["path"]
        # an exception's traceback starts at the program's own frame, as Python's does
        assert outs["worker:1"].split(b"Traceback (most recent call last):\n")[1].startswith(
            f'  File "{program}", line '.encode()), outs["worker:1"]
        assert b"zygote" not in outs["worker:1"] and b"<string>" not in outs["worker:1"]
        assert tasks["worker:4"].poll().code == 5 and said(outs["worker:4"])["already"], outs["worker:4"]
        assert json.loads((tmp_path / "worker-4" / "pid.json").read_text())["forked"] is True
        assert tasks["worker:0"].poll().code == 3, outs
        assert tasks["worker:1"].poll().code == 1 and b"RuntimeError: boom from the forked task" in outs["worker:1"]
        first, second = said(outs["worker:0"]), said(outs["worker:1"])
        agent = tasks["worker:0"].pids()["agent_pid"]
        for name, seen in (("worker:0", first), ("worker:1", second)):
            assert seen["already"], "TensorFlow came with the fork"
            assert seen["name"] == "__main__" and seen["task"] == name and seen["ppid"] == agent
            assert seen["cwd"] == str(tmp_path) and seen["path0"] == str(PROGRAMS)
            assert seen["tmp"] == str(tmp_path / name.replace(":", "-") / "tmp") and seen["stdin"] == ""
            assert seen["sum"] == 9.0
            # what the zygote's import made is frozen (its collections skip it), the collector on
            assert seen["frozen"] > 100_000 and seen["collector"] is True, seen["frozen"]
            assert json.loads((tmp_path / name.replace(":", "-") / "pid.json").read_text())["forked"] is True
        assert first["argv"] == [program, "exit", "3"] and second["argv"] == [program, "raise"]
        assert first["random"] != second["random"], "each task draws its own random numbers"
        exec_ed = said(outs["worker:3"])
        assert tasks["worker:3"].poll().code == 4 and not exec_ed["already"], "a fresh interpreter: exec"
        assert exec_ed["frozen"] == 0 and exec_ed["collector"] is True  # (nothing of a zygote's)
        assert exec_ed["pid"] == tasks["worker:3"].pids()["task_pid"] and exec_ed["task"] == "worker:3"
        assert "longer than the zygote's room" in (tmp_path / "worker-3" / "fork-fallback.txt").read_text()
        # what other processes read of a forked task: its own environment and command line
        sleeper = psutil.Process(tasks["worker:2"].pids()["task_pid"])
        assert sleeper.environ()["DDLCTL_TASK"] == "worker:2" and "DDLCTL_ZYGOTE_ROOM" not in sleeper.environ()
        assert [a for a in sleeper.cmdline() if a] == [sys.executable, program, "sleep"]
        assert sleeper.ppid() == agent and os.getpgid(sleeper.pid) == sleeper.pid
        zygotes = [p for p in psutil.Process(agent).children() if "ddlctl.task.zygote" in " ".join(p.cmdline())]
        # tasks of one interpreter and environment share one zygote (worker:6's PYTHONPATH: one of its own)
        assert len(zygotes) == 2, zygotes
        tasks["worker:2"].send("TERM")
        assert session.wait_for(lambda: tasks["worker:2"].poll() is not None, 20)
        assert tasks["worker:2"].poll().signal == signal.SIGTERM
    finally:
        session.shutdown()
        session.close()
    assert nothing_left("prefork-test")


def test_a_zygote_that_cannot_import_tensorflow_leaves_its_tasks_to_start_the_plain_way(tmp_path):
    broken = tmp_path / "site" / "tensorflow"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('this TensorFlow is broken on purpose')\n")
    session = open_local_session(HOST, "prefork-test", tmp_path / "agents")
    program = str(PROGRAMS / "forked_fallback.py")
    try:
        env = {"PYTHONPATH": str(tmp_path / "site")}
        tasks = {"worker:0": session.start(spec("worker:0", (sys.executable, program), tmp_path / "w0", env), 5),
                 "worker:1": session.start(spec("worker:1", (sys.executable, program), tmp_path / "w1",
                                                {"DDLCTL_PREFORK": "0"}), 5)}
        assert session.wait_for(lambda: all(t.poll() for t in tasks.values()), 60)
        for name, task in tasks.items():
            assert task.poll().code == 0 and output(task) == b"ran plain False\n", name
        started = json.loads((tmp_path / "w0" / "pid.json").read_text())
        assert started["forked"] is False or prefork.gpu_host()
        if not prefork.gpu_host():
            assert "this TensorFlow is broken on purpose" in started["fork_note"]
        assert json.loads((tmp_path / "w1" / "pid.json").read_text())["forked"] is False
    finally:
        session.shutdown()
        session.close()
    assert nothing_left("prefork-test")


def test_a_shutdown_while_the_zygote_imports_starts_nothing_and_leaves_nothing(tmp_path):
    if prefork.gpu_host():
        return
    session = open_local_session(HOST, "prefork-test", tmp_path / "agents")
    program = str(PROGRAMS / "forked.py")
    try:
        task = session.start(spec("worker:0", (sys.executable, program, "sleep"), tmp_path / "w0"), 5)
        session.shutdown()  # at once: its zygote is still importing TensorFlow
        assert session.wait_for(lambda: task.poll() is not None, 30)
        assert task.poll().code == 143 and b"not started: stopped while its zygote imported" in output(task)
    finally:
        session.close()
    assert nothing_left("prefork-test")


def test_a_task_whose_zygote_still_imports_tensorflow_is_at_work_by_the_zygotes_cpu(tmp_path):
    # (a loaded host or a slow disk: the import may outlast a startup timeout; the task is starting)
    if prefork.gpu_host():
        return
    from ddlctl.supervise.hangs.preparing import BUSY_CPU, BUSY_IO, at_work

    session = open_local_session(HOST, "prefork-test", tmp_path / "agents")
    try:
        task = session.start(spec("worker:0", (sys.executable, str(PROGRAMS / "forked.py"), "sleep"), tmp_path / "w0"),
                             5)
        looks = []
        for _ in range(2):
            session.request_dump(["worker:0"])
            assert session.wait_for(lambda: session.dump_of("worker:0") is not None, 10)
            looks.append(session.dump_of("worker:0"))
            time.sleep(1.0)
        assert [look.get("forking") for look in looks] == [True, True], looks
        work = at_work("worker:0", *looks)
        assert work is not None and work.where == "not started yet: its host's zygote imports TensorFlow for it"
        # the zygote's own figures (the task has no process yet), judged by the watch's rule: a busy
        # CPU or reading; on a loaded machine (four test workers on two cores) an import can get less
        # than a quarter of a CPU while it reads TensorFlow's files (seen: 23% and 1.7 MB)
        assert work.cpu is not None and work.cpu > 0.05, work
        assert work.cpu >= BUSY_CPU or work.io >= BUSY_IO, work
        assert session.wait_for(lambda: task.pids(), 60), "then forked"
        session.request_dump(["worker:0"])
        assert session.wait_for(lambda: session.dump_of("worker:0") is not None, 10)
        assert "forking" not in session.dump_of("worker:0")
    finally:
        session.shutdown()
        session.close()
    assert nothing_left("prefork-test")
