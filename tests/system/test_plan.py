"""Placement rules and per-task specs, checked on the pure planning functions."""

from __future__ import annotations

import json


def test_dry_run_of_a_mixed_cluster_writes_no_localhost(tmp_path):
    from tests.conftest import run_ddlctl

    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost slots=2\n127.0.0.2 slots=2\n")
    done = run_ddlctl("launch", "--hosts", str(hosts), "-s", "ps", "--dry-run", "--json", timeout=60)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    addresses = [a for t in plan["tasks"] if t["tf_config"] for group in t["tf_config"]["cluster"].values()
                 for a in group]
    assert addresses and not any(a.startswith("localhost") for a in addresses)
    assert any(a.startswith("127.0.0.1:") for a in addresses) and any(a.startswith("127.0.0.2:") for a in addresses)
