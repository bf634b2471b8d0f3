"""One console line for what many tasks say (pure: a fake clock, a byte buffer as the console)."""

from __future__ import annotations


def test_a_real_job_shows_what_every_task_says_once_and_verbose_shows_every_line(tmp_path):
    import sys

    from tests.conftest import PROGRAMS, run_ddlctl

    def program(name: str) -> list[str]:  # the tasks print once all three are up (see the program)
        (tmp_path / f"barrier-{name}").mkdir()
        return ["--", sys.executable, str(PROGRAMS / "say_the_same.py"), str(tmp_path / f"barrier-{name}")]

    done = run_ddlctl("launch", "-s", "mwms", "--workers", "3", "--no-telemetry", "--runs-dir", str(tmp_path / "a"),
                      *program("a"), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines.count("[worker:0-2@localhost] WARNING: the same warning from every task") == 1, done.stdout
    assert lines.count("[worker:0-2@localhost] done") == 1, done.stdout
    assert sorted(line for line in lines if "says this" in line) == [
        f"[worker:{i}@localhost] only worker:{i} says this" for i in range(3)]
    verbose = run_ddlctl("launch", "-s", "mwms", "--workers", "3", "--no-telemetry", "--verbose", "--runs-dir",
                         str(tmp_path / "b"), *program("b"), timeout=120)
    assert verbose.returncode == 0, verbose.stderr[-2000:]
    assert sorted(line for line in verbose.stdout.splitlines() if "WARNING: the same" in line) == [
        f"[worker:{i}@localhost] WARNING: the same warning from every task" for i in range(3)]
    for run in ("a", "b"):  # the logs keep every line of every task
        logs = sorted((tmp_path / run).glob("*/tasks/worker-*/output.log"))
        assert len(logs) == 3 and all("WARNING: the same warning" in p.read_text() for p in logs)
