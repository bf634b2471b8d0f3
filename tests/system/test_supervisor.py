"""The real Supervisor, driven by fake host agents (ddlctl/testing/fakeagents.py): every decision path of
the loop in milliseconds, no process, no TensorFlow. The real-process tests (test_faults,
test_ssh_faults, test_slurm) prove the wiring; these prove the behaviour, path by path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_supervisor_and_these_fakes_need_no_tensorflow(tmp_path):
    code = ("import sys; sys.modules['tensorflow'] = None\n"
            "from pathlib import Path\n"
            "from ddlctl.testing.fakeagents import World\n"
            "w = World('mwms', hosts=('a', 'b'), workers=2)\n"
            "w.at(1.0, w.kill, 'worker:1')\n"
            f"result, _ = w.run(Path({str(tmp_path)!r}), max_restarts=1)\n"
            "assert result.ok and 'tensorflow' not in {m for m in sys.modules if sys.modules[m] is not None}\n"
            "print('RESTARTS', len(result.restarts))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert "RESTARTS 1" in done.stdout
