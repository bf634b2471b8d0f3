"""One console line for what many tasks say (pure: a fake clock, a byte buffer as the console)."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st

from ddlctl.console.collapse import CollapsingWriter
from ddlctl.console.output import PrefixedWriter
from ddlctl.contract.grouping import hosts_label, task_range


def test_task_names_become_ranges_by_role():
    assert task_range(["worker:0", "worker:1", "worker:2", "worker:5", "chief:0"]) == "chief:0,worker:0-2,5"
    assert task_range(["worker:3", "worker:1"]) == "worker:1,3"
    assert task_range([f"worker:{i}" for i in range(8)]) == "worker:0-7"
    assert task_range(["worker:10", "worker:9", "worker:11", "ps:0"]) == "ps:0,worker:9-11"
    assert hosts_label(["a", "a"]) == "a" and hosts_label(["a", "b", "a"]) == "2 hosts"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def console() -> tuple[io.BytesIO, CollapsingWriter, Clock]:
    out = io.BytesIO()
    clock = Clock()
    return out, CollapsingWriter(PrefixedWriter(out, color=False), window_s=0.5, clock=clock), clock


def test_the_same_line_from_eight_tasks_is_shown_once_with_their_range():
    out, writer, clock = console()
    for i in range(8):
        clock.now = i * 0.01
        writer.write(f"worker:{i}", "localhost", [b"WARNING: the same warning\n", f"own line {i}\n".encode()])
    assert out.getvalue() == b"", "held for the window"
    clock.now = 0.6
    writer.tick(clock.now)
    lines = out.getvalue().decode().splitlines()
    assert lines[0] == "[worker:0-7@localhost] WARNING: the same warning"
    assert lines[1:] == [f"[worker:{i}@localhost] own line {i}" for i in range(8)]
    assert writer.merged == 7


def test_lines_that_differ_are_never_merged_and_each_tasks_order_is_kept():
    out, writer, clock = console()
    writer.write("worker:0", "h1", [b"error: disk full\n", b"step 1\n"])
    writer.write("worker:1", "h2", [b"error: disk ful\n"])  # one character less: not the same
    writer.write("worker:1", "h2", [b"step 1\n"])
    writer.write("worker:2", "h1", [b"step 1\n", b"error: disk full\n"])  # its own order: step first
    writer.flush()
    assert out.getvalue().decode().splitlines() == [
        "[worker:0@h1] error: disk full",
        "[worker:1@h2] error: disk ful",
        "[worker:0-2@2 hosts] step 1",  # moved down after worker:1's own error
        "[worker:2@h1] error: disk full",  # not merged upwards: that would show it before worker:2's "step 1"
    ]
    writer.write("worker:0", "h1", [b"same\n"])
    writer.write("worker:3", "h2", [b"same\n"])
    writer.flush()
    assert out.getvalue().decode().splitlines()[-1] == "[worker:0,3@2 hosts] same"


def test_a_line_arriving_after_the_window_is_shown_again_and_a_task_repeating_itself_is_not_merged():
    out, writer, clock = console()
    writer.write("worker:0", "h", [b"tick\n", b"tick\n"])
    clock.now = 0.7
    writer.write("worker:1", "h", [b"tick\n"])  # the first window is over
    writer.tick(clock.now)
    clock.now = 1.3
    writer.tick(clock.now)
    assert out.getvalue().decode().splitlines() == ["[worker:0@h] tick", "[worker:0@h] tick", "[worker:1@h] tick"]


def test_ticks_release_only_the_lines_whose_window_has_passed():
    out, writer, clock = console()
    writer.write("worker:0", "h", [b"first\n"])
    clock.now = 0.4
    writer.write("worker:0", "h", [b"second\n"])
    clock.now = 0.55
    writer.tick(clock.now)
    assert out.getvalue() == b"[worker:0@h] first\n"
    clock.now = 0.45 + 0.5
    writer.tick(clock.now)
    assert out.getvalue().endswith(b"[worker:0@h] second\n")




class _Reference:
    """The first version of the collapsing writer (a scan of every held line per line), kept as
    the meaning the indexed one must keep."""

    def __init__(self, window_s: float) -> None:
        self.window_s, self.groups, self.shown = window_s, [], []

    def write(self, task: str, text: bytes, now: float) -> None:
        last = max((i for i, g in enumerate(self.groups) if task in g[2]), default=-1)
        for index, group in enumerate(self.groups):
            if group[0] != text or now - group[1] >= self.window_s or task in group[2]:
                continue
            if index < last and any(t in group[2] for h in self.groups[index + 1:last + 1] for t in h[2]):
                continue
            if index < last:
                self.groups.insert(last, self.groups.pop(index))
            group[2].append(task)
            break
        else:
            self.groups.append((text, now, [task]))
        self.tick(now)

    def tick(self, now: float) -> None:
        while self.groups and now - self.groups[0][1] >= self.window_s:
            text, _, tasks = self.groups.pop(0)
            self.shown.append((task_range(tasks), text))


@given(st.lists(st.tuples(st.sampled_from(["worker:0", "worker:1", "worker:2"]), st.sampled_from([b"a", b"b", b"c"]),
                          st.sampled_from([0.0, 0.0, 0.1, 0.3, 0.6])), max_size=40))
def test_the_indexed_writer_shows_what_a_scan_of_every_held_line_shows(writes):
    out, writer, clock = console()
    reference = _Reference(0.5)
    for task, text, dt in writes:
        clock.now += dt
        writer.write(task, "h", [text + b"\n"])
        reference.write(task, text, clock.now)
    clock.now += 1.0
    writer.tick(clock.now)
    reference.tick(clock.now)
    shown = [line.split("] ", 1) for line in out.getvalue().decode().splitlines()]
    assert [(who[1:].split("@")[0], text.encode()) for who, text in shown] == reference.shown


def test_a_flood_of_lines_is_held_in_bounded_numbers_and_shown_whole_in_order():
    """A task printing faster than MAX_HELD lines per window: its oldest lines are shown sooner, none
    lost, each placed without looking at every held one (100,000 lines took 300 s before)."""
    from ddlctl.console.collapse import MAX_HELD

    out, writer, clock = console()
    for i in range(20000):
        writer.write("worker:0", "h", [f"line {i}\n".encode(), b"\n"])
        writer.write("worker:1", "h", [f"line {i}\n".encode()])
        assert len(writer._groups) <= MAX_HELD
    writer.flush()
    lines = out.getvalue().decode().splitlines()
    assert lines[:3] == ["[worker:0-1@h] line 0", "[worker:0@h] ", "[worker:0-1@h] line 1"]
    assert len(lines) == 40000 and writer.merged == 20000


def test_a_job_of_one_task_holds_nothing_and_a_run_of_one_tasks_lines_is_one_write():
    class Counting(PrefixedWriter):
        def __init__(self, out: io.BytesIO) -> None:
            super().__init__(out, color=False)
            self.writes = 0

        def write(self, task, host, lines):  # noqa: ANN001
            self.writes += 1
            super().write(task, host, lines)

    out, clock = io.BytesIO(), Clock()
    inner = Counting(out)
    alone = CollapsingWriter(inner, window_s=0.5, clock=clock, tasks=1)
    alone.write("worker:0", "h", [b"a\n", b"b\n"])
    assert out.getvalue() == b"[worker:0@h] a\n[worker:0@h] b\n" and inner.writes == 1, "shown at once"
    out, inner = io.BytesIO(), Counting(io.BytesIO())
    many = CollapsingWriter(inner, window_s=0.5, clock=clock, tasks=2)
    many.write("worker:0", "h", [f"{i}\n".encode() for i in range(500)])
    many.write("worker:1", "h", [b"x\n"])
    many.flush()
    assert inner.writes == 2 and inner.stream.getvalue().count(b"\n") == 501
