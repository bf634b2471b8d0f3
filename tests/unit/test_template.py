"""YAML templates: the shipped ones load, errors carry file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlctl.cluster.template import load_template, parse_template
from ddlctl.contract.errors import ConfigError

TEMPLATES = sorted((Path(__file__).resolve().parents[2] / "cluster_templates").glob("*.yaml"))


def test_required_templates_exist():
    names = {p.name for p in TEMPLATES}
    assert {"localhost-ps.yaml", "localhost-mwms.yaml", "homogeneous.yaml",
            "heterogeneous.yaml"} <= names


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_shipped_templates_load(path):
    template = load_template(path)
    assert template.cluster.hosts
    assert template.defaults.strategy in ("ps", "mwms", "model")


def test_homogeneous_is_4_hosts_by_4_gpus():
    cluster = load_template(next(p for p in TEMPLATES if p.name == "homogeneous.yaml")).cluster
    assert [(h.gpus, h.slots, h.user) for h in cluster.hosts] == [(4, 4, "ubuntu")] * 4


def test_heterogeneous_has_mixed_gpus_and_cpu_ps_host():
    cluster = load_template(next(p for p in TEMPLATES if p.name == "heterogeneous.yaml")).cluster
    assert len({h.gpus for h in cluster.hosts}) > 2
    ps_hosts = [h for h in cluster.hosts if "ps" in h.roles]
    assert ps_hosts and all(h.gpus == 0 for h in ps_hosts)


def test_defaults_apply_and_hosts_override():
    template = parse_template("""
strategy: ps
workers: 3
defaults: {gpus: 2, user: alice}
hosts:
  - a
  - {host: bob@b, gpus: 0}
env: {NCCL_DEBUG: INFO}
""", "t.yaml")
    a, b = template.cluster.hosts
    assert (a.user, a.gpus, a.slots) == ("alice", 2, 2)
    assert (b.user, b.gpus, b.slots) == ("bob", 0, 1)
    assert template.defaults.workers == 3 and template.defaults.env == {"NCCL_DEBUG": "INFO"}


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("hosts:\n  - a\nstrategi: ps\n", ["t.yaml:3", "unknown key 'strategi'"]),
        ("hosts:\n  - host: a\n    gpu: 4\n", ["t.yaml:3", "unknown host key 'gpu'"]),
        ("hosts:\n  - host: a\n    gpus: four\n", ["t.yaml:2", "gpus='four'"]),
        ("hosts:\n  - host: a\n    roles: [chief, boss]\n", ["t.yaml:2", "roles="]),
        ("hosts:\n  - a\n  - a\n", ["t.yaml:3", "already listed at t.yaml:2"]),
        ("strategy: horovod\nhosts: [a]\n", ["t.yaml:1", "unknown strategy 'horovod'"]),
        ("workers: 0\nhosts: [a]\n", ["t.yaml:1", "workers"]),
        ("hosts: [a\n", ["t.yaml:", "not valid YAML"]),
        ("hosts: []\n", ["t.yaml:1", "non-empty list"]),
        ("description: x\n", ["t.yaml", "no 'hosts:'"]),
        ("", ["t.yaml", "empty"]),
        ("hosts:\n  - {gpus: 2}\n", ["t.yaml:2", "without 'host:'"]),
        ("hosts: [a]\nenv:\n  OK: 1\n  A=B: 2\n", ["t.yaml:4", "env: 'A=B' is not a variable name"]),
        ('hosts: [a]\nenv:\n  TOKEN: "x\\0y"\n', ["t.yaml:3", "the value of TOKEN holds a NUL byte"]),
    ],
)
def test_template_errors(text, fragments):
    with pytest.raises(ConfigError) as info:
        parse_template(text, "t.yaml")
    for fragment in fragments:
        assert fragment in str(info.value)


