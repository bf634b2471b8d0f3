"""Root cause extraction from a task's output."""

from ddlctl.diagnose.rootcause import last_traceback
from tests.unit.test_rootcause import LOG


def test_a_syntax_error_in_the_script_is_its_report_and_a_bug_in_the_program(tmp_path):
    """Python reports a syntax error in the script it runs without a traceback: its report is the
    root cause, and the task failed of a bug in its program (not retried under --restart-on fault)."""
    import subprocess
    import sys

    from ddlctl.supervise.policy import classify
    from ddlctl.transport.base import ExitStatus

    script = tmp_path / "train.py"
    script.write_text("import os\n\nx = (\n")
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    text = "starting\n" + ran.stderr
    block = last_traceback(text)
    assert block[0].strip() == f'File "{script}", line 3' and block[-1].startswith("SyntaxError: ")
    fault = classify("worker:0", ExitStatus(code=ran.returncode), text, "mwms", alive=set(), known={"worker:0"})
    assert (fault.cause, fault.detail) == ("traceback", f"exit code 1: a syntax error in {script} at line 3")
    # a traceback after it is the later error; output without one after it leaves it the cause
    assert last_traceback(text + LOG)[-1] == "ValueError: second"
    assert last_traceback(text + "a line of a peer's\n") == block
    fault = classify("worker:0", ExitStatus(code=0), text, "mwms", alive=set(), known={"worker:0"})
    assert fault.cause == "exit"
