"""Shared helpers: run the real ``ddlctl`` command, find processes a run left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddlctl.testing.run import ROOT, ddlctl_cmd, only_run_dir, processes_of_run, run_ddlctl  # noqa: F401 - the tests import them here

PROGRAMS = Path(__file__).resolve().parent / "programs"

# pytest rewrites the asserts of every test module it collects (5-6 CPU-seconds for this suite, in
# each pytest-xdist worker and again in the timing part's process) and caches the result only where
# Python writes bytecode: under PYTHONDONTWRITEBYTECODE=1 (this machine kind's environment) every
# collection rewrote them all again. pytest's own process writes its cache; what it starts (ddlctl,
# TensorFlow tasks) still has the variable and writes nothing.
sys.dont_write_bytecode = False


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    path = tmp_path / "runs"
    path.mkdir()
    return path


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MiB file system (tmpfs; root), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=700", "tmpfs", str(disk)], check=True)
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    """Under CI (``CI=true``), a skipped test is a failure: every capability the suite skips without
    (root, openssh-server, tmux, Slurm, a writable cgroup) is one that ``.ci/run`` installs, so a skip
    there means the feature went untested, not that it was unavailable."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where everything this test needs is installed: {reason}"


#: Test files that take longest (each starts many TensorFlow clusters; measured in the parallel part,
#: see docs/testing.md), longest first. Workers take whole files (``--dist loadfile``) in collection
#: order (``--no-loadscope-reorder``): the long files start first and a short one ends each worker's
#: share. (pytest-xdist's own order, by number of tests, left these, which have few tests, for last.)
LONGEST_FIRST = ("test_hangs_real.py", "test_model_parallel.py", "test_faults.py", "test_launch_local.py",
                 "test_ssh_faults.py", "test_slurm.py", "test_ssh.py", "test_compare.py", "test_partition.py",
                 "test_profile.py", "test_prefork.py", "test_heterogeneous.py", "test_cli.py", "test_console.py",
                 "test_hostagent.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long files first (see :data:`LONGEST_FIRST`); the order inside each file is kept."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
