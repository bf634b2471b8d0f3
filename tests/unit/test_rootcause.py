"""Root cause extraction from a task's output."""

from ddlctl.diagnose.rootcause import last_traceback, read_tail, tail_lines

LOG = """starting
Traceback (most recent call last):
  File "a.py", line 1, in <module>
KeyError: 'first'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "a.py", line 3, in <module>
    boom()
  File "a.py", line 2, in boom
    raise ValueError("second")
ValueError: second
cleanup line
"""


def test_last_traceback_is_the_final_exception():
    block = last_traceback(LOG)
    assert block[0] == "Traceback (most recent call last):"
    assert block[-1] == "ValueError: second"
    assert 'raise ValueError("second")' in "\n".join(block)
    assert "KeyError" not in "\n".join(block)


def test_no_traceback_gives_tail():
    assert last_traceback("just\nlines\n") == []
    assert tail_lines("a\n\nb\nc\n", 2) == ["b", "c"]


def test_read_tail_limits_bytes(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"x" * 1000 + b"END\xff")
    text = read_tail(path, max_bytes=10)
    assert text.endswith("END\ufffd") and len(text) == 10
    assert read_tail(tmp_path / "missing") == ""




def test_a_traceback_after_output_that_did_not_end_its_line_is_found():
    log = 'loading\ndataset? Traceback (most recent call last):\n  File "r.py", line 1, in <module>\nEOFError: EOF\n'
    assert last_traceback(log) == ["Traceback (most recent call last):", '  File "r.py", line 1, in <module>',
                                   "EOFError: EOF"]
