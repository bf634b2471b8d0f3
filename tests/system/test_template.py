"""YAML templates: the shipped ones load, errors carry file:line."""

from __future__ import annotations

import pytest

from ddlctl.cluster.template import load_template
from ddlctl.contract.errors import ConfigError


def test_balance_worker_per_and_a_profile_relative_to_the_template(tmp_path):
    import json

    from tests.conftest import run_ddlctl

    (tmp_path / "prof.json").write_text(json.dumps({"kind": "ddlctl-cluster-profile", "hosts": {
        "a": {"speed": 120.0}, "b": {"speed": 40.0}}}))
    path = tmp_path / "t.yaml"
    path.write_text("strategy: mwms\nbalance: speed\nworker_per: host\nprofile: prof.json\n"
                    "hosts:\n  - host: a\n    gpus: 1\n  - host: b\n    gpus: 1\n")
    template = load_template(path)
    assert (template.defaults.balance, template.defaults.worker_per) == ("speed", "host")
    assert template.defaults.profile == str(tmp_path / "prof.json")
    done = run_ddlctl("launch", "--template", str(path), "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    envs = [t["env"] for t in json.loads(done.stdout)["tasks"]]
    assert [json.loads(e["DDLCTL_SPEEDS"]) for e in envs] == [[120.0, 40.0]] * 2
    off = run_ddlctl("launch", "--template", str(path), "--balance", "off", "--dry-run", "--json")
    assert all("DDLCTL_BALANCE" not in t["env"] for t in json.loads(off.stdout)["tasks"])
    path.write_text("balance: fast\nhosts: [a]\n")
    with pytest.raises(ConfigError, match=r"t.yaml:1: balance: 'fast' is not valid"):
        load_template(path)
