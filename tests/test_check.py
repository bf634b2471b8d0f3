"""``ddlctl check`` on a machine where another user is logged in: it warns, naming them, since
the TensorFlow servers of a run accept any connection (a real login record, written for the test)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_ddlctl

UTMP = Path("/var/run/utmp")


@pytest.fixture
def someone_else_logged_in():
    if os.geteuid() != 0:
        pytest.skip("writing the system's login records needs root (CI runs as root)")
    saved = UTMP.read_bytes() if UTMP.exists() else None
    record = (f"[7] [{os.getpid()}] [ts/9] [ddlctl-other] [pts/9       ] [10.0.0.5            ] "
              "[10.0.0.5       ] [2026-11-25T10:00:00,000000+00:00]\n")
    done = subprocess.run(["utmpdump", "-r"], input=record.encode(), capture_output=True, check=True)
    UTMP.write_bytes((saved or b"") + done.stdout)
    try:
        yield "ddlctl-other"
    finally:
        if saved is None:
            UTMP.unlink()
        else:
            UTMP.write_bytes(saved)


def test_check_warns_when_other_users_are_logged_in(tmp_path, someone_else_logged_in):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost\n")
    done = run_ddlctl("check", "--hosts", str(hosts), "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    [report] = json.loads(done.stdout)
    assert someone_else_logged_in in report["logged_in"] and report["usable"]
    [warning] = report["warnings"]
    assert f"other users are logged in ({someone_else_logged_in})" in warning and "unauthenticated" in warning
    shown = run_ddlctl("check", "--hosts", str(hosts), timeout=120)
    assert shown.returncode == 0 and f"warning: localhost: other users are logged in ({someone_else_logged_in})" \
        in " ".join(shown.stdout.split())
