"""The per-task watchdog, with real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil

WATCHDOG = [sys.executable, "-m", "ddlctl.runtime.watchdog"]


def start(*cmd: str, grace: float = 1.0, pidfile=None) -> subprocess.Popen:
    args = [*WATCHDOG, "--grace", str(grace)]
    if pidfile:
        args += ["--pidfile", str(pidfile)]
    return subprocess.Popen([*args, "--", *cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


def finish(proc: subprocess.Popen) -> bytes:
    """Wait with the control pipe still open (closing it would mean "controller gone")."""
    proc.wait(timeout=20)
    return proc.stdout.read()


def test_exit_code_and_output_pass_through():
    proc = start("sh", "-c", "echo hello; exit 7")
    out = finish(proc)
    assert proc.returncode == 7 and out == b"hello\n"


def test_killed_by_signal_is_reported_as_that_signal():
    proc = start("sh", "-c", "kill -KILL $$")
    finish(proc)
    assert proc.returncode == -9


def test_missing_program_is_127_with_a_message():
    proc = start("no-such-program-xyz")
    out = finish(proc)
    assert proc.returncode == 127 and b"cannot start 'no-such-program-xyz'" in out


def test_controller_gone_means_term_then_kill(tmp_path):
    pidfile = tmp_path / "pid.json"
    proc = start("sh", "-c", "trap '' TERM; echo ready; sleep 60 & wait; sleep 60", grace=1.0,
                 pidfile=pidfile)
    assert proc.stdout.readline() == b"ready\n"
    task_pgid = json.loads(pidfile.read_text())["task_pgid"]
    started = time.monotonic()
    proc.stdin.close()  # as if ddlctl died
    proc.wait(timeout=20)
    assert time.monotonic() - started < 5
    time.sleep(0.2)
    left = [p for p in psutil.process_iter() if _pgid(p) == task_pgid]
    assert left == []


def test_term_control_line_forwards_and_leftovers_are_swept(tmp_path):
    pidfile = tmp_path / "pid.json"
    proc = start("sh", "-c", "sleep 300 & echo ready; wait", pidfile=pidfile)
    assert proc.stdout.readline() == b"ready\n"
    task_pgid = json.loads(pidfile.read_text())["task_pgid"]
    proc.stdin.write(b"TERM\n")
    proc.stdin.flush()
    proc.wait(timeout=20)
    assert proc.returncode == -15
    time.sleep(0.2)
    assert [p for p in psutil.process_iter() if _pgid(p) == task_pgid] == []


def _pgid(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid) if proc.status() != psutil.STATUS_ZOMBIE else None
    except (ProcessLookupError, psutil.NoSuchProcess):
        return None
