"""The unit lane: no process is started and TensorFlow is not imported (``pytest tests/unit``, first in
CI, what a contributor runs after every edit). A test here that starts a process fails, naming it:
such a test belongs in ``tests/system``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a unit test started a process: move it to tests/system")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)


@pytest.fixture(autouse=True, scope="session")
def _no_tensorflow() -> object:
    yield
    assert "tensorflow" not in sys.modules, "a unit test imported TensorFlow: move it to tests/system"
