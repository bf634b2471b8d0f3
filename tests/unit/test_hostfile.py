"""The hosts-file grammar: examples, every error path, and property-based round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddlctl.cluster.hostfile import parse_hosts, parse_line
from ddlctl.cluster.model import ROLES
from ddlctl.contract.errors import ConfigError


def test_deepspeed_and_horovod_hostfiles_parse_unchanged():
    cluster = parse_hosts("worker-1 slots=4\nworker-2 slots=4\n", "hostfile")
    assert [h.name for h in cluster.hosts] == ["worker-1", "worker-2"]
    assert [h.slots for h in cluster.hosts] == [4, 4]
    assert cluster.total_slots == 8


def test_every_field_comments_and_blank_lines():
    text = """
# GPU nodes
ubuntu@node1 slots=2 gpus=4 port=2222 roles=chief,worker python=/opt/py/bin/python workdir="/data/my runs"  # trailing

10.0.0.7 gpus=2
[::1]
"""
    cluster = parse_hosts(text, "hosts.txt")
    first, second, third = cluster.hosts
    assert (first.user, first.name, first.slots, first.gpus, first.port) == ("ubuntu", "node1", 2, 4, 2222)
    assert first.roles == ("chief", "worker")
    assert first.python == "/opt/py/bin/python" and first.workdir == "/data/my runs"
    assert first.source == "hosts.txt:3"
    assert second.slots == 2, "slots default to the GPU count"
    assert third.name == "::1" and third.slots == 1 and third.is_local


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("node1 slot=4", ["hosts.txt:1", "unknown key 'slot'", "node1 slot=4", "slots"]),
        ("node1\nnode2 slots=zero", ["hosts.txt:2", "slots='zero'", "integer"]),
        ("node1 slots=0", ["hosts.txt:1", "slots=0", ">= 1"]),
        ("node1 gpus=-1", ["hosts.txt:1", "gpus=-1"]),
        ("node1 port=70000", ["hosts.txt:1", "port=70000", "65535"]),
        ("node1 roles=chief,boss", ["hosts.txt:1", "roles=", "chief,worker,ps,evaluator"]),
        ("node1 4", ["hosts.txt:1", "'4' is not key=value"]),
        ("slots=4", ["hosts.txt:1", "expected a host name first"]),
        ("node1 slots=1 slots=2", ["hosts.txt:1", "slots= given twice"]),
        ('node1 workdir="/unterminated', ["hosts.txt:1", "No closing quotation"]),
        ("no/de", ["hosts.txt:1", "invalid host name 'no/de'"]),
        ("bad user@node", ["hosts.txt:1"]),
        ("b@d@node", ["hosts.txt:1", "invalid user name"]),
        ("node1\n# again\nnode1 slots=2", ["hosts.txt:3", "already listed at hosts.txt:1"]),
        ("# only comments\n\n", ["hosts.txt", "no hosts listed"]),
        ("node1 cpus=1-0", ["hosts.txt:1", "cpus='1-0' is not valid", "0-3"]),
        ("node1 cpus=x", ["hosts.txt:1", "cpus='x' is not valid"]),
        ("node1 cpus=,", ["hosts.txt:1", "cpus=',' is not valid"]),
        ("node1 cpus=0-9999999", ["hosts.txt:1", "cpus='0-9999999' is not valid"]),  # (was 15 s, 714 MiB)
    ],
)
def test_errors_name_file_line_and_what_is_expected(text, fragments):
    with pytest.raises(ConfigError) as info:
        parse_hosts(text, "hosts.txt")
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message


def test_cpus_lists_and_ranges():
    hosts = parse_hosts("a cpus=3\nb cpus=0-2,5\nc cpus=4,1-2\nd\n", "h").hosts
    assert [h.cpus for h in hosts] == [(3,), (0, 1, 2, 5), (1, 2, 4), None]


def test_cpu_ranges_render_what_cpus_parses():
    from ddlctl.cluster.fields import parse_cpus
    from ddlctl.host.cgroup import cpu_ranges

    for text in ("0", "0-3", "0-1,4", "1,3,5-7"):
        assert cpu_ranges(parse_cpus(text, "x")) == text


def test_same_name_on_other_ssh_port_is_another_host():
    cluster = parse_hosts("127.0.0.1 port=2201\n127.0.0.1 port=2202\n", "h")
    assert len(cluster.hosts) == 2


# -- property-based ------------------------------------------------------------------------

names = st.from_regex(r"\A[a-z][a-z0-9-]{0,10}[a-z0-9]\Z")
users = st.from_regex(r"\A[a-z_][a-z0-9_.-]{0,8}\Z")
paths = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp")),
                min_size=1, max_size=20)


@st.composite
def host_lines(draw):
    fields = {}
    user = draw(st.none() | users)
    name = draw(names)
    if draw(st.booleans()):
        fields["gpus"] = draw(st.integers(0, 16))
    if draw(st.booleans()):
        fields["slots"] = draw(st.integers(1, 64))
    if draw(st.booleans()):
        fields["port"] = draw(st.integers(1, 65535))
    if draw(st.booleans()):
        fields["roles"] = draw(st.lists(st.sampled_from(ROLES), min_size=1, max_size=4, unique=True))
    if draw(st.booleans()):
        fields["workdir"] = draw(paths)
    return user, name, fields


def _quote(value: str) -> str:
    import shlex

    return shlex.quote(value)


@given(host_lines())
def test_round_trip_of_any_valid_line(line):
    user, name, fields = line
    parts = [f"{user}@{name}" if user else name]
    for key, value in fields.items():
        rendered = ",".join(value) if key == "roles" else str(value)
        parts.append(f"{key}={_quote(rendered)}")
    host = parse_line(" ".join(parts) + "  # comment", "f:1")
    assert host is not None
    assert (host.user, host.name) == (user, name)
    assert host.gpus == fields.get("gpus", 0)
    assert host.slots == fields.get("slots", max(1, fields.get("gpus", 0)))
    assert host.port == fields.get("port", 22)
    assert host.roles == tuple(fields.get("roles", ()))
    assert host.workdir == fields.get("workdir")


@given(st.text(max_size=80))
def test_any_text_parses_or_gives_a_config_error(text):
    try:
        parse_hosts(text, "fuzz.txt")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.txt")
