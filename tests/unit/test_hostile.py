"""What a task or a host sends is data: the frame parser, the session's frame handling, the agent's
step follower and the report's step reader, with the inputs found to break them (issue 59) and
with arbitrary ones (hypothesis, bounded examples). Each either takes a value or refuses it; none
raises anything else, loops, or grows without bound."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddlctl.cluster.model import Host
from ddlctl.contract.wire import MAGIC, MAX_HEADER, MAX_PAYLOAD, FrameReader, GarbledFrame, Kind, encode_frame
from ddlctl.host.stepfollow import LINE_MAX, STEP_MAX, PhaseFile, StepFile
from ddlctl.planning.plan import TaskSpec
from ddlctl.report.stepfile import read_steps
from ddlctl.transport.session import HostSession

FUZZ = settings(max_examples=150, deadline=None,  # (under CI load generation is slow: no health check on speed)
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])

# JSON values of any shape, the numbers among them at the edges of their types
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats(allow_nan=False)
    | st.sampled_from([-9, 0, 1, 2**53, 2**63, 1e999]) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


class Stream:
    """A session's stream with nothing behind it: what is fed is what the agent 'sent'."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.sent = b""

    def fileno(self) -> int:
        return -1

    def read(self) -> bytes | None:
        return self.data.pop(0) if self.data else None

    def write(self, data: bytes) -> None:
        self.sent += data

    def errors(self) -> str:
        return ""

    def abandon(self) -> None:
        pass

    def close(self) -> None:
        pass

    def ended(self) -> str:
        return ""


OPEN: list[HostSession] = []


@pytest.fixture(autouse=True)
def _close_sessions() -> object:
    yield
    while OPEN:  # (a signalled agent's session drains its stream in a thread until it is closed)
        OPEN.pop().close()


def session_with(*names: str) -> tuple[HostSession, Stream]:
    while OPEN:  # (each hypothesis example opens one: the one before is done)
        OPEN.pop().close()
    stream = Stream()
    host = Host("h1")
    session = HostSession(host, stream, ())
    OPEN.append(session)
    for name in names:
        session.start(TaskSpec(name=name, role=name.split(":")[0], index=int(name.split(":")[1]), host=host,
                               port=None, kind="program", argv=("python", "t.py"), env={}, unset_env=(),
                               workdir="/w", task_dir="/w/t", gpus=None, tf_config=None), 1.0)
    stream.data.append(MAGIC)
    session.pump()
    return session, stream


def feed(session: HostSession, stream: Stream, *frames: bytes) -> None:
    stream.data.extend(frames)
    session.pump()


@pytest.mark.parametrize("line", [b'{"n": -9}', b"[1]", b'{"n": 1e999}', b'{"n": 1.5}', b'{"n": true}', b"\xff",
                                  b"[" * 100000, b'{"n": ' + b"9" * 5000 + b"}"])
def test_a_header_that_is_not_a_frame_costs_the_session_not_the_controller(line):
    # before: {"n": -9} appended the same frame forever; [1] and 1e999 raised past pump()
    session, stream = session_with("worker:0")
    feed(session, stream, line + b"\n")
    assert session.lost and session.lost.startswith("garbled data from the host agent: "), session.lost
    assert session._tasks["worker:0"].status.lost  # its task is reported as on a lost host


def test_a_header_line_longer_than_the_bound_is_refused_before_it_ends():
    reader = FrameReader()
    reader.feed(MAGIC)
    reader.feed(b'{"k": "out", "x": "' + b"a" * (MAX_HEADER // 2))
    with pytest.raises(GarbledFrame, match="longer than"):
        reader.feed(b"a" * (MAX_HEADER // 2 + 10))


@pytest.mark.parametrize("header", [
    {"k": Kind.EXIT, "task": "worker:0", "signal": "9x"},
    {"k": Kind.EXIT, "task": "worker:0", "signal": 99},
    {"k": Kind.EXIT, "task": "worker:0", "code": 1e400},
    {"k": Kind.EXIT, "task": "worker:0", "code": 0, "t": "soon"},
    {"k": Kind.EXIT, "task": "worker:0", "signal": 9, "oom": {"not": "evidence"}},
    {"k": Kind.STEPS, "counts": [1]},
    {"k": Kind.STEPS, "counts": {"worker:0": "many"}},
    {"k": Kind.STEPS, "counts": {"worker:0": 2**63}},
    {"k": Kind.STEPS, "t": 1e999, "counts": {}},
    {"k": Kind.SIGNALLED, "sig": 99},
    {"k": Kind.STARTED, "task": "worker:0", "task_pid": -1},
])
def test_a_frame_whose_fields_break_their_types_costs_the_session(header):
    session, stream = session_with("worker:0")
    before = session.step_counts()
    feed(session, stream, json.dumps(header).replace("Infinity", "1e999").encode() + b"\n")
    assert session.lost and "garbled data from the host agent" in session.lost or \
        header["k"] == Kind.SIGNALLED and "received signal 99" in session.lost, session.lost
    assert session.step_counts() == before


def test_a_host_speaks_for_its_own_tasks_only():
    # before: a steps frame from any session set the step counts of any task (a hang hidden)
    session, stream = session_with("worker:0")
    feed(session, stream, encode_frame({"k": Kind.STEPS, "t": 1.0, "counts": {"worker:0": 3, "worker:1": 99}}),
         encode_frame({"k": Kind.EXIT, "task": "worker:1", "code": 0}),
         encode_frame({"k": Kind.DUMP, "task": "worker:0", "procs": [], "stacks": "made up"}),
         encode_frame({"k": Kind.LS, "id": 7, "files": {}}),
         encode_frame({"k": Kind.PORTS, "ports": {"worker:0": 1}}))
    assert not session.lost
    assert {name: count for name, (count, _t) in session.step_counts().items()} == {"worker:0": 3}
    assert session.dump_of("worker:0") is None and not session._replies and session.ports_reply is None


@FUZZ
@given(st.binary(max_size=400), st.integers(1, 64))
def test_arbitrary_bytes_are_frames_or_refused(data, piece):
    reader = FrameReader()
    stream = MAGIC + data
    try:
        for at in range(0, len(stream), piece):
            for header, payload in reader.feed(stream[at:at + piece]):
                assert isinstance(header, dict) and 0 <= header.get("n", 0) <= MAX_PAYLOAD
                assert len(payload) == header.get("n", 0)
    except GarbledFrame:
        pass


@FUZZ
@given(st.sampled_from([Kind.OUT, Kind.EXIT, Kind.STARTED, Kind.START_FAILED, Kind.STEPS, Kind.DUMP, Kind.PORTS,
                        Kind.LS, Kind.DATA, Kind.FILE_ERROR, Kind.SIGNALLED, Kind.HELLO, Kind.BEAT, "?"]),
       st.dictionaries(st.sampled_from(["task", "code", "signal", "t", "oom", "counts", "last", "totals", "open",
                                        "activity", "credits", "procs", "stacks", "wchan", "ports", "id", "files",
                                        "sig", "task_pid", "note", "error", "cpu_s", "io_bytes"]), JSON, max_size=6),
       st.sampled_from(["worker:0", "worker:1"]))
def test_any_frame_is_taken_or_costs_its_session(kind, fields, task):
    session, stream = session_with("worker:0")
    session.request_dump(["worker:0"])
    header = {**fields, "k": kind}
    if "task" in fields:
        header["task"] = task
    feed(session, stream, json.dumps(header).encode() + b"\n")
    assert session.lost is None or session.lost.startswith(("garbled data from the host agent: ",
                                                            "its host agent received "))
    for count, when in session.step_counts().values():
        assert 0 <= count <= 2**53 and math.isfinite(when)


def steps_file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "steps.jsonl"
    path.write_bytes(data)
    return path


def test_an_infinite_or_huge_step_is_a_bad_record_for_the_agent_and_the_report(tmp_path):
    # before: Infinity ended the host agent (and every task of its host) with OverflowError, and a
    # step of 2**63 ended `ddlctl report` and the launch's summary
    good = b'{"task": "worker:0", "step": %d, "start_us": 1, "duration_s": 0.5}\n'
    path = steps_file(tmp_path, good % 1 + b'{"step": Infinity, "start_us": 1, "duration_s": 1}\n'
                      + good.replace(b"%d", str(2**63).encode()) + b'{"step": 1e300}\n' + good % 2)
    follower = StepFile(str(path))
    assert follower.poll() == 5 and follower.last == 2 and follower.skipped == 3
    steps = read_steps(path, "worker:0")
    assert list(steps.step) == [1, 2] and steps.bad_lines == 3


def test_a_line_without_end_is_read_once_and_passed_over(tmp_path):
    # before: an unterminated tail was read whole at every poll
    path = steps_file(tmp_path, b'{"step": 1}\n' + b"x" * (LINE_MAX + 10))
    follower = StepFile(str(path))
    assert follower.poll() == 1 and follower.offset == path.stat().st_size
    with path.open("ab") as out:
        out.write(b"x" * 100 + b'\n{"step": 2}\n')
    assert follower.poll() == 2 and follower.last == 2 and follower.skipped == 1


@FUZZ
@given(st.lists(JSON | st.binary(max_size=30), max_size=8))
def test_any_step_file_is_read_without_error_by_the_agent_and_the_report(tmp_path, records):
    folder = tmp_path  # (the same file, rewritten for each example)
    data = b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records)
    path = steps_file(folder, data)
    follower, phases = StepFile(str(path)), PhaseFile(str(path))
    assert 0 <= follower.poll() <= STEP_MAX and 0 <= follower.last <= STEP_MAX
    phases.poll()
    steps = read_steps(path, "worker:0")
    assert len(steps.step) + steps.bad_lines <= len(records) + data.count(b"\n")
    assert all(abs(v) <= 2**62 for v in steps.step)



def test_a_working_folder_a_shared_group_may_write_is_unsafe_a_private_groups_is_not(tmp_path):
    # before: 0775 was accepted whatever the group (the runs-dir check refuses group write)
    import grp
    import os
    import pwd

    from ddlctl.host.tasks import unsafe_folder

    folder = tmp_path / "exp"
    folder.mkdir()
    folder.chmod(0o775)
    me = pwd.getpwuid(os.getuid())
    own = [p for p in pwd.getpwall() if p.pw_gid == me.pw_gid and p.pw_uid != me.pw_uid]
    assert (unsafe_folder(str(folder)) is None) == (folder.stat().st_gid == me.pw_gid and not own
                                                   and set(grp.getgrgid(me.pw_gid).gr_mem) <= {me.pw_name})
    shared = [g for g in grp.getgrall() if g.gr_gid != me.pw_gid]
    if os.getuid() == 0 and shared:  # (only root may give a folder to another group)
        os.chown(folder, -1, shared[0].gr_gid)
        assert "its group" in unsafe_folder(str(folder))
        folder.chmod(0o755)
        assert unsafe_folder(str(folder)) is None


def test_a_host_whose_ssh_config_says_proxyjump_proxycommand_or_hostkeyalias_is_refused_not_reached_directly(
        tmp_path):
    # before: they were ignored: ddlctl connected straight to HostName (and with HostKeyAlias plus
    # --accept-new-host-keys recorded whatever answered there)
    from ddlctl.contract.errors import ConfigError
    from ddlctl.transport.options import SshOptions
    from ddlctl.transport.ssh import resolve_target

    config = tmp_path / "config"
    config.write_text("Host jumped\n  HostName 10.0.0.5\n  ProxyJump bastion\nHost aliased\n  HostKeyAlias other\n"
                      "Host piped\n  ProxyCommand ssh -W %h:%p gw\nHost plain\n  HostName 10.0.0.6\n")
    options = SshOptions(ssh_config=str(config))
    for name, option in (("jumped", "ProxyJump"), ("aliased", "HostKeyAlias"), ("piped", "ProxyCommand")):
        with pytest.raises(ConfigError, match=f"{option} .* applies to host {name}, and ddlctl does not follow"):
            resolve_target(Host(name), options)
    assert resolve_target(Host("plain"), options).hostname == "10.0.0.6"


HOSTILE = "x\x1b[2J\x1b]52;c;aWQ=\x07\u202eevil\x9b31m\rend"


def test_every_renderer_shows_hostile_strings_as_text_and_styles_as_styles():
    # before: the failure block printed a task's traceback with rich Text: ESC (clear the screen,
    # OSC 52 to the clipboard) reached the terminal raw; so did names in tables and notices
    import io

    from rich.table import Table
    from rich.text import Text

    from ddlctl.console.live import LiveState
    from ddlctl.console.safe import SafeConsole
    from ddlctl.report.render import render_failure
    from ddlctl.supervise.results import Failure

    out = io.StringIO()
    console = SafeConsole(file=out, force_terminal=True, color_system="standard", width=300)
    render_failure(Failure(reason="exited", message=f"exit code 1 {HOSTILE}", task=f"worker:0{HOSTILE}",
                           host=HOSTILE, traceback=(f"RuntimeError: {HOSTILE}",), log=f"/runs/{HOSTILE}"), console)
    table = Table(title=HOSTILE)
    table.add_column(HOSTILE)
    table.add_row(Text(HOSTILE, style="red"))
    console.print(table)
    console.print(f"ddlctl: {HOSTILE}", style="bold")
    state = LiveState()
    state.update(HOSTILE, {"type": "sample", "t": 1.0, "cpu": 5, "steps": {HOSTILE: 3},
                           "procs": {HOSTILE: [1.0]}, "gpus": []})
    console.print(state.table())
    written = out.getvalue()
    # (rich itself drops BEL and CR from a Text: where it kept them, they are shown too)
    assert written.count("x^[[2J^[]52;c;aWQ=") >= 9 and written.count("<U+202E>evil<U+009B>31m") >= 9, written
    assert "^G<U+202E>evil<U+009B>31m^Mend" in written
    assert "\x1b[1;31m" in written or "\x1b[31m" in written, "rich's own colours still pass"
    without_styles = re.sub("\x1b\\[[0-9;]*m", "", written)
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]", without_styles), repr(without_styles)


@FUZZ
@given(st.lists(st.fixed_dictionaries({"type": st.sampled_from(["sample", "hello", "error", "x"]),
                                       "t": JSON | st.floats(0, 2e9)},
                                      optional={"cpu": JSON, "gpus": JSON, "procs": JSON, "host": JSON,
                                                "gpu_fields": JSON, "interval": JSON, "mem_used": JSON,
                                                "net_sent": JSON, "gpu_note": JSON}) | JSON, max_size=6))
def test_any_telemetry_file_is_read_or_its_lines_counted_bad(tmp_path, records):
    # a host's telemetry is data: GPU names, task names and every reading come from it
    from ddlctl.report.hosts import read_telemetry

    path = tmp_path / "h1.jsonl"
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records))
    series = read_telemetry(path)
    assert series.bad_lines <= len(records)


def test_a_csv_cell_is_never_a_formula_and_never_a_control_character():
    from ddlctl.contract.shown import csv_cell

    assert csv_cell("=HYPERLINK(\"http://x\")") == "'=HYPERLINK(\"http://x\")"
    assert [csv_cell(v) for v in ("+1", "-2+3", "@SUM(A1)", "\tx")] == ["'+1", "'-2+3", "'@SUM(A1)", "'\tx"]
    assert [csv_cell(v) for v in ("-", "worker:0", 3, -1.5, None, "a\x1bb")] == ["-", "worker:0", 3, -1.5, None,
                                                                                "a^[b"]


def test_frames_as_the_agent_writes_them_are_all_taken():
    # the other side of the bounds: every field the host agent sends, at its real shape (an OOM
    # kill's evidence is text; a task's executable may be unknown), costs nothing
    session, stream = session_with("worker:0", "worker:1")
    session.request_dump(["worker:1"])
    session._ports_asked = True  # (as check_ports asks, without its wait)
    feed(session, stream,
         encode_frame({"k": Kind.HELLO, "pid": 7, "t": 1.5, "probe": None}),
         encode_frame({"k": Kind.STARTED, "task": "worker:0", "t": 1.5, "agent_pid": 7, "task_pid": 8,
                       "task_pgid": 8, "ssh_connection": None, "forked": True, "executable": None,
                       "note": "starting in /home/me"}),
         encode_frame({"k": Kind.OUT, "task": "worker:0"}, b"hello\n"),
         encode_frame({"k": Kind.STEPS, "t": 2.0, "counts": {"worker:0": 5}, "last": {"worker:0": 5},
                       "totals": {"worker:0": 10}, "credits": {"worker:0": {"worker:1": 5}},
                       "activity": {"worker:0": 2}, "open": {"worker:0": "eval"}}),
         encode_frame({"k": Kind.LISTENING, "task": "worker:0", "t": 2.0}),
         encode_frame({"k": Kind.DUMP, "task": "worker:1", "procs": [[9, "S", "python"]], "stacks": "", "wchan": {},
                       "cpu_s": 0.5, "io_bytes": 10, "at": 3.0}),
         encode_frame({"k": Kind.PORTS, "id": None, "ports": {"worker:1": 23456}}),
         encode_frame({"k": Kind.EXIT, "task": "worker:0", "t": 3.0, "code": None, "signal": 9,
                       "oom": "the kernel's OOM killer, for its memory (oom-kill: ... pid=8)"}),
         encode_frame({"k": Kind.START_FAILED, "task": "worker:1", "error": "cannot start 'x'", "code": 127}),
         encode_frame({"k": Kind.BEAT, "t": 4.0}))
    assert session.lost is None
    assert session.step_counts()["worker:0"][0] == 5 and session.credits() == {"worker:0": {"worker:1": 5}}
    assert session._tasks["worker:0"].poll().signal == 9 and "OOM" in session._tasks["worker:0"].poll().oom
    assert session.dump_of("worker:1")["cpu_s"] == 0.5 and session.ports_reply["ports"] == {"worker:1": 23456}
    assert session._tasks["worker:1"].poll().code == 127


def test_stop_reads_no_record_larger_than_ddlctl_writes(tmp_path, monkeypatch):
    # before: plan.json and submit.json were read whole, whatever their size
    from ddlctl.commands import stop
    from ddlctl.contract import runfolder
    from ddlctl.contract.errors import ConfigError

    monkeypatch.setattr(runfolder, "RECORD_MAX", 1 << 10)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    (run_dir / "submit.json").write_text(json.dumps({"job_id": "4242", "pad": "x" * 2000}))
    (run_dir / "submit.json").chmod(0o600)
    with pytest.raises(ConfigError, match="larger than"):
        stop.slurm_targets(run_dir)
    (run_dir / "submit.json").write_text(json.dumps({"job_id": "4242"}))
    assert stop.slurm_targets(run_dir) == (["4242"], "job")


def test_the_report_reads_a_record_file_up_to_its_last_part_and_says_what_it_left(tmp_path, monkeypatch):
    # before: steps.jsonl and telemetry files were read whole, whatever size a program made them
    from ddlctl.contract import runfolder
    from ddlctl.report.stepfile import read_steps

    path = tmp_path / "steps.jsonl"
    lines = [json.dumps({"step": i, "start_us": i * 1000, "duration_s": 0.001}) + "\n" for i in range(1, 501)]
    path.write_text("".join(lines))
    monkeypatch.setattr(runfolder, "RECORDS_READ_MAX", 4096)
    steps = read_steps(path, "worker:0")
    assert steps.bad_lines == 0, "read from a line's start"
    assert steps.step[-1] == 500 and 4096 - 60 < sum(map(len, lines[-len(steps.step):])) <= 4096
    assert steps.unread_bytes == path.stat().st_size - sum(map(len, lines[-len(steps.step):]))
    data, unread = runfolder.read_last(path, 1 << 20)
    assert unread == 0 and data == path.read_bytes()


def test_gpu_readings_without_a_gpus_number_are_bad_lines_not_a_crash(tmp_path):
    # found by the fuzz test above: a sample whose GPU rows were empty raised KeyError in the report
    from ddlctl.report.hosts import read_telemetry

    path = tmp_path / "h1.jsonl"
    path.write_text(json.dumps({"type": "sample", "t": 0.0, "gpus": [[]]}) + "\n"
                    + json.dumps({"type": "sample", "t": 1.0, "cpu": 50.0}) + "\n")
    series = read_telemetry(path)
    assert series.bad_lines == 1 and series.gpus == {} and list(series.cpu) == [50.0]
