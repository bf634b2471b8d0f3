"""Line splitting and prefixing of task output."""

from __future__ import annotations

import contextlib
import io
import re

from hypothesis import given
from hypothesis import strategies as st

from ddlctl.console.output import LineSplitter, PrefixedWriter


def test_partial_lines_are_held_until_complete():
    s = LineSplitter()
    assert s.feed(b"hel", 0.0) == []
    assert s.feed(b"lo\nwor", 0.1) == [b"hello\n"]
    assert s.feed(b"ld\n", 0.2) == [b"world\n"]


def test_carriage_return_progress_updates_stay_whole():
    s = LineSplitter()
    assert s.feed(b"10%\r20%\r30", 0.0) == [b"10%\r", b"20%\r"]
    assert s.flush() == [b"30"]


def test_crlf_split_across_chunks_is_one_terminator():
    s = LineSplitter()
    assert s.feed(b"a\r", 0.0) == []
    assert s.feed(b"\nb\n", 0.0) == [b"a\r\n", b"b\n"]


def test_stale_partial_line_is_released_and_huge_one_cut():
    s = LineSplitter(max_partial=10)
    s.feed(b"prompt> ", 1.0)
    assert s.flush_stale(2.9) == []
    assert s.feed(b"g", 2.95) == [] and s.flush_stale(2.99) == [], "held from its first byte, not the last"
    assert s.flush_stale(3.0) == [b"prompt> g"]
    assert s.feed(b"x" * 12, 2.0) == [b"x" * 12]


@given(st.binary(max_size=300), st.lists(st.integers(1, 50), max_size=20))
def test_any_chunking_gives_back_every_byte_in_order(data, cuts):
    s = LineSplitter()
    out = []
    pos = 0
    for cut in cuts:
        out += s.feed(data[pos:pos + cut], 0.0)
        pos += cut
    out += s.feed(data[pos:], 0.0)
    out += s.flush()
    assert b"".join(out) == data


@given(st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\r", b"\r\n", b"\x00"]), max_size=60),
       st.lists(st.integers(1, 7), max_size=30))
def test_any_chunking_gives_the_lines_of_the_whole(pieces, cuts):
    data = b"".join(pieces)
    s = LineSplitter()
    out, pos = [], 0
    for cut in cuts:
        out += s.feed(data[pos:pos + cut], 0.0)
        pos += cut
    out += s.feed(data[pos:], 0.0) + s.flush()
    whole = re.findall(rb"[^\r\n]*(?:\r\n|\n|\r)|[^\r\n]+$", data)
    assert out == whole


def test_a_long_line_without_a_newline_is_cut_at_the_limit_in_one_pass():
    """A program that writes 1 MB without a newline: 64 KiB pieces, then the rest; each chunk is
    looked at once (a search over the held tail at every chunk took minutes for 200 KB)."""
    s = LineSplitter()
    out = []
    for _ in range(256):
        out += s.feed(b"x" * 4096, 0.0)
    out += s.feed(b"y\n", 0.0)
    assert [len(line) for line in out] == [65536] * 16 + [2]
    assert b"".join(out) == b"x" * (1 << 20) + b"y\n"


def test_prefix_names_task_and_host_without_colour_off_terminal():
    stream = io.BytesIO()
    writer = PrefixedWriter(stream)
    writer.write("worker:1", "node3", [b"step 1\n", b"50%\r"])
    assert stream.getvalue() == b"[worker:1@node3] step 1\n[worker:1@node3] 50%\n"


def test_tensorflow_startup_notices_are_recognised_and_nothing_else():
    from pathlib import Path

    from ddlctl.diagnose.tfnoise import is_startup_noise

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "tf221"
    noise = (fixtures / "startup_noise.log").read_bytes().splitlines()
    keep = (fixtures / "not_noise.log").read_bytes().splitlines()
    assert len(noise) >= 6 and all(is_startup_noise(line) for line in noise)
    assert keep and not any(is_startup_noise(line) for line in keep)
    # in a block: each notice found wherever it stands (its marks looked for first), none where none is
    from ddlctl.diagnose.tfnoise import noise_in

    assert all(noise_in(b"\n".join([*keep, line, *keep])) and noise_in(line) for line in noise)
    assert not noise_in(b"\n".join(keep))


def test_quiet_writer_leaves_noise_off_the_console_and_says_so_once():
    import io

    from ddlctl.console.output import PrefixedWriter, QuietWriter
    from ddlctl.diagnose.tfnoise import is_startup_noise

    out, said = io.BytesIO(), []
    writer = QuietWriter(PrefixedWriter(out, color=False), is_startup_noise, lambda: said.append(1))
    banner = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    writer.write("worker:0", "h", [banner, b"step 1\n"])
    writer.write("worker:1", "h", [banner])
    assert out.getvalue() == b"[worker:0@h] step 1\n" and said == [1] and writer.hidden == 2


def test_control_characters_from_tasks_are_shown_not_obeyed():
    from ddlctl.console.output import visible

    forged = (b"\x1b[1A\x1b[2K\x1b[32mddlctl: job succeeded\x1b[0m\x1b]52;c;cm0gLXJmIH4=\x07\tdone\x7f "
              b"\xc2\x9b2J caf\xc3\xa9")
    shown = visible(forged)
    assert shown == (b"^[[1A^[[2K^[[32mddlctl: job succeeded^[[0m^[]52;c;cm0gLXJmIH4=^G\tdone^? <U+009B>2J "
                     b"caf\xc3\xa9"), "controls visible, tab and UTF-8 kept"
    colored = visible(forged, keep_colors=True)
    assert colored.startswith(b"^[[1A^[[2K\x1b[32mddlctl: job succeeded\x1b[0m^[]52;")
    out = io.BytesIO()
    PrefixedWriter(out, color=False).write("worker:0", "h", [b"\x1b[2Jhi\r\n"])
    assert out.getvalue() == b"[worker:0@h] ^[[2Jhi\n"


@given(st.binary(max_size=200))
def test_no_control_character_but_tab_survives(data):
    from ddlctl.console.output import visible

    shown = visible(data)
    assert not any(b < 0x20 and b != 0x09 or b == 0x7f for b in shown)
    text = shown.decode("utf-8")  # (a lone 0x9B, CSI to an 8-bit terminal, is shown escaped)
    assert not any(0x80 <= ord(c) <= 0x9f for c in text)
    with contextlib.suppress(UnicodeDecodeError):
        data.decode("utf-8")
        assert text.count("\\x") == data.count(b"\\x"), "valid UTF-8 is not escaped"


@given(st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"x", b"\r").replace(b"y", b"\n")), max_size=8))
def test_the_splitter_cuts_any_stream_into_whole_lines_losing_nothing(chunks):
    """Each line it gives is one line with its one terminator (\\n, \\r\\n or \\r), as a scan for
    them would cut it; with what it still holds, the stream whole."""
    line = re.compile(rb"[^\r\n]*(?:\r\n|\n|\r)")
    splitter, lines = LineSplitter(), []
    for chunk in chunks:
        lines += splitter.feed(chunk, 0.0)
    assert all(line.fullmatch(one) for one in lines), lines
    assert b"".join(lines + splitter.flush()) == b"".join(chunks), "nothing lost, nothing added"


@given(st.lists(st.tuples(st.sampled_from([b"plain text", b"caf\xc3\xa9", b"\x1b[31mred", b"tab\there", b"\x9b",
                                           b"", b"x" * 50]),
                          st.sampled_from([b"\n", b"\r\n", b"\r", b""])), max_size=12), st.booleans())
def test_a_block_of_lines_is_written_as_each_line_alone_would_be(lines, colors):
    """The one-scan path for plain blocks writes exactly what line-by-line writing does."""
    raw = [text + end for text, end in lines]
    block, each = io.BytesIO(), io.BytesIO()
    PrefixedWriter(block, color=colors, task_colors=colors).write("worker:0", "h", raw)
    one = PrefixedWriter(each, color=colors, task_colors=colors)
    for line in raw:
        one.write("worker:0", "h", [line])
    assert block.getvalue() == each.getvalue()


def test_known_notices_are_left_out_whenever_they_come_and_a_block_without_one_passes_whole():
    from ddlctl.console.output import QuietWriter
    from ddlctl.diagnose.tfnoise import is_startup_noise, noise_in

    notices = [b"I0000 00:00:1795887105.418929    8258 generator_dataset_op.cc:213] Memory patch applied: "
               b"M_TRIM_THRESHOLD=128 kb was set.\n",
               b"W0000 00:00:1795887105.427049    8258 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not "
               b"be optimized because the dataset does not implement the AsGraphDefInternal() method\n"]
    out, said = io.BytesIO(), []
    quiet = QuietWriter(PrefixedWriter(out, color=False), is_startup_noise, lambda: said.append(1), in_block=noise_in)
    quiet.write("worker:0", "h", [b"step 1\n", b"step 2\n"])
    quiet.write("worker:0", "h", [b"step 3\n", *notices, b"step 4\n"])
    assert out.getvalue().count(b"step") == 4 and b"dataset" not in out.getvalue()
    assert quiet.hidden == 2 and said == [1]


def test_bytes_that_are_not_utf8_are_shown_escaped():
    from ddlctl.console.output import visible

    assert visible(b"a\x9b31m b\xff caf\xc3\xa9") == b"a\\x9b31m b\\xff caf\xc3\xa9"


def test_a_task_log_the_disk_refuses_keeps_the_tail_in_memory_and_says_so_once(tmp_path):
    """/dev/full refuses every write with ENOSPC, as a full disk does (the kernel's own error)."""
    from ddlctl.supervise.tasklog import KEPT_BYTES, TaskLog

    said = []
    log = TaskLog("/dev/full", said.append, "its output is still shown")
    log.write(b"Traceback (most recent call last):\n")
    for i in range(40000):  # (more than the tail kept)
        log.write(f"line {i}\n".encode())
    log.write(b"OSError: [Errno 28] No space left on device\n")
    [sentence] = said  # (the free space is that of /dev's file system)
    assert sentence.startswith("cannot write /dev/full: No space left on device (")
    assert sentence.endswith(" free on its disk): its output is still shown")
    tail = log.tail()
    assert tail.endswith("line 39999\nOSError: [Errno 28] No space left on device\n")
    assert len(tail) == KEPT_BYTES and "line 0\n" not in tail  # bounded: the oldest went
    log.close()
    # a log the disk takes keeps everything in the file and nothing in memory
    fine = TaskLog(tmp_path / "tasks" / "worker-0" / "output.log", said.append)
    fine.write(b"a\nb\n")
    fine.close()
    assert (tmp_path / "tasks" / "worker-0" / "output.log").read_bytes() == b"a\nb\n" and fine.tail() == "a\nb\n"
    assert len(said) == 1 and fine.failure is None


def test_step_records_the_disk_refuses_stop_without_stopping_the_program(capsys):
    from ddlctl.task.steps import StepRecorder

    recorder = StepRecorder("/dev/full", "worker:0")
    for step in range(1, 4):  # (the first write is refused: line-buffered, every record is written at once)
        recorder.record(step, 0.0, 0.01, 32)
    recorder.close()
    assert recorder.count == 3
    assert capsys.readouterr().err.count("ddlctl.step: cannot write /dev/full: No space left on device") == 1
