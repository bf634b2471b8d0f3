"""The live view: progress from the agents' step reports, windowed rates, the CPU column, and a
live region that redraws in place in a real terminal (tmux)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from ddlctl.console import live as live_module
from ddlctl.console.live import ConsoleLineWriter, LiveState, LiveView, WindowRate, job_progress
from ddlctl.host.stepfollow import StepFile
from tests.conftest import ROOT


def test_job_progress_is_the_furthest_task_and_the_declared_total():
    assert job_progress({}) == (0, None)
    assert job_progress({"chief:0": (120, 400), "worker:0": (0, None)}) == (120, 400)
    assert job_progress({"worker:0": (33, None), "worker:1": (35, None)}) == (35, None)


def test_a_burst_of_step_reports_does_not_make_an_absurd_rate():
    rate = WindowRate(window_s=5.0)
    # 10 steps/s, but two reports arrive 1 ms apart with 8 steps between them (ps closures)
    for t, count in ((0.0, 0), (4.0, 40), (4.001, 48), (8.0, 80), (12.0, 120)):
        rate.add(t, count)
    assert rate.rate == pytest.approx(10.0, rel=0.15)
    rate.add(12.5, 3)  # a restarted task counts from its checkpoint again: no negative rate
    assert rate.rate is None


def test_live_state_fills_the_cpu_column_from_samples_and_counts_steps():
    state = LiveState()
    state.update("h", {"type": "hello", "gpu_fields": []})
    state.update("h", {"type": "sample", "t": 100.0, "cpu": 90.0, "gpus": [],
                       "steps": {"chief:0": 10}, "procs": {"chief:0": [8.0, 1], "worker:1": [88.5, 1]}})
    state.update("h", {"type": "sample", "t": 106.0, "cpu": 91.0, "gpus": [],
                       "steps": {"chief:0": 70}, "procs": {"chief:0": [9.0, 1], "worker:1": [87.0, 1]}})
    state.progress({"chief:0": (70, 200)}, 106.0)
    assert state.tasks["worker:1"].cpu == 87.0 and state.tasks["chief:0"].rate.rate == pytest.approx(10.0)
    line = state.line()
    assert "steps 70/200" in line and "worker:1 0 steps cpu 87%" in line and "h cpu 91%" in line


def test_a_task_whose_steps_stop_is_shown_stalled_until_it_steps_again_but_not_once_finished():
    from rich.console import Console

    state = LiveState()
    for t, counts in ((0.0, {"worker:0": 0, "worker:1": 0}), (1.0, {"worker:0": 5, "worker:1": 5}),
                      (2.0, {"worker:0": 10, "worker:1": 9}), (13.0, {"worker:0": 10, "worker:1": 9})):
        state.update("h", {"type": "sample", "t": t, "gpus": [], "steps": counts})
    state.progress({"worker:0": (10, 10), "worker:1": (9, 10)}, 13.0)  # worker:0 reached its last step
    line = state.line()
    assert "worker:1 9 steps (none for 11s)" in line and "worker:0 10 steps |" in line + " |", line
    console = Console(record=True, width=120)
    console.print(state.table())
    assert "9 (none for 11s)" in console.export_text()
    state.update("h", {"type": "sample", "t": 14.0, "gpus": [], "steps": {"worker:0": 10, "worker:1": 10}})
    assert "none for" not in state.line(), "it stepped again"
    # work between steps (an evaluation's batches beat, ddlctl.beat) and a phase the program declared
    state.update("h", {"type": "sample", "t": 15.0, "gpus": [], "steps": {"worker:0": 10, "worker:1": 10}})
    state.activity({"worker:1": (0, None)})
    state.update("h", {"type": "sample", "t": 27.0, "gpus": [], "steps": {"worker:0": 10, "worker:1": 10}})
    state.activity({"worker:1": (6, None)})  # beats since its last step
    assert "worker:1 10 steps (at work, none for 13s)" in state.line(), state.line()
    state.update("h", {"type": "sample", "t": 40.0, "gpus": [], "steps": {"worker:0": 10, "worker:1": 10}})
    assert "worker:1 10 steps (none for 26s)" in state.line(), "no beat for 13 s: a stall again"
    state.activity({"worker:1": (7, "checkpoint")})
    assert "worker:1 10 steps (in checkpoint, none for 26s)" in state.line()
    fresh = LiveState()  # start-up (no step yet) is not a stall, however long
    fresh.update("h", {"type": "sample", "t": 0.0, "gpus": [], "steps": {"worker:0": 0}})
    fresh.update("h", {"type": "sample", "t": 60.0, "gpus": [], "steps": {"worker:0": 0}})
    assert "none for" not in fresh.line()


def test_the_host_agent_counts_steps_of_blocks_and_reads_the_declared_total(tmp_path):
    path = tmp_path / "steps.jsonl"
    follow = StepFile(str(path))
    assert follow.poll() == 0 and follow.total is None
    records = [{"step": 1, "steps": 8, "total": 64}, {"step": 9, "steps": 8, "total": 64}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 17, "ste')  # a half-written line
    assert follow.poll() == 16 and (follow.last, follow.total) == (16, 64)
    with path.open("a") as handle:  # the rest of the line, then a resumed run redoing steps 9..16
        handle.write('ps": 8, "total": 64}\n' + json.dumps({"step": 9, "steps": 8, "total": 64}) + "\n")
    assert follow.poll() == 32 and follow.last == 24


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def _terminal(data: str) -> list[str]:
    """What a terminal shows for ``data`` (screen and scrollback as one tall screen): text, CR, LF
    (as CR LF: the tty's ONLCR), cursor up and erase line, as rich writes them; other sequences dropped."""
    lines, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]+", data):
        if token == "\n":
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        elif token == "\r":
            col = 0
        elif token == "\x1b[1A":
            row = max(row - 1, 0)
        elif token == "\x1b[2K":
            lines[row] = ""
        elif not token.startswith("\x1b"):
            line = lines[row].ljust(col)
            lines[row] = line[:col] + token + line[col + len(token):]
            col += len(token)
    return [line.rstrip() for line in lines]


def test_lines_printed_above_a_region_that_changes_height_are_never_overwritten_nor_the_region_copied(monkeypatch):
    """Task output scrolls above the live region while its height changes; the region's redraw
    (its own thread) never runs between a print's cursor move and its write."""
    import io

    from rich.console import Console

    monkeypatch.setattr(live_module, "REFRESH_S", 0.0005)  # redraws as often as can be
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, height=500, color_system=None)
    view = LiveView(console)
    writer = ConsoleLineWriter(console, live=view)
    with view:
        for i in range(400):
            view.show_table = i % 3 != 0  # the region: a table and the bar, or the bar alone
            writer.write("worker:0", "h", [f"line {i}".encode()])
            if i % 50 == 0:
                time.sleep(0.01)
    shown = [line for line in _terminal(out.getvalue()) if line]
    assert shown == [f"[worker:0@h] line {i}" for i in range(400)], \
        [line for line in shown if not line.startswith("[worker:0@h] line")][:10]


@pytest.mark.cluster
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux) for a real terminal")
def test_in_a_terminal_the_live_region_redraws_in_place_above_scrolling_output(tmp_path):
    session = f"ddlctl-{uuid.uuid4().hex[:8]}"
    done = tmp_path / "exit-code"
    # paced (80 ms a step at least: 10 s of live display on any machine, for 120 steps of CPU; at 40 a
    # run beside four test workers and a busy loop ended before the ps worker's first CPU sample was shown)
    command = (f"cd {ROOT} && {sys.executable} -m ddlctl profile -s ps --workers 1 --runs-dir {tmp_path / 'runs'} "
               f"-- {sys.executable} -m ddlctl.workloads --steps 120 --batch-size 16 --min-step-ms 80; "
               f"echo $? > {done}; sleep 300")
    _tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "40", command)
    try:
        seen_bar = seen_cpu = None
        deadline = time.monotonic() + 240
        while not done.exists() and time.monotonic() < deadline:
            screen = _tmux("capture-pane", "-p", "-t", session)
            bar = re.search(r"training .* (\d+)/120 .*steps/s ETA \d+:\d\d", screen)
            if bar and int(bar.group(1)) > 0:
                seen_bar = bar.group(0)
            if re.search(r"worker:0\s+│\s+0\s+│\s+-\s+│\s+\d+", screen):  # a ps worker: no steps, CPU shown
                seen_cpu = True
            time.sleep(0.5)
        assert done.exists() and done.read_text().strip() == "0"
        scrollback = _tmux("capture-pane", "-p", "-t", session, "-S", "-", "-E", "-")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert seen_bar, "no progress bar with steps/total, rate and ETA was shown"
    assert seen_cpu, "the live table's CPU column was empty for a ps worker"
    # the live region was redrawn in place and removed at the end: no copy of it in the scrollback
    assert "ddlctl profile (live)" not in scrollback and "training ━" not in scrollback, scrollback
    progress_lines = re.findall(r"\[chief:0@localhost\] step (\d+)/120", scrollback)
    assert progress_lines and len(progress_lines) == len(set(progress_lines)), scrollback  # each line once
    assert "run " in scrollback and "work per worker" in scrollback  # the report follows
