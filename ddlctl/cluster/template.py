"""YAML cluster templates (``cluster_templates/*.yaml``), validated on load.

A template describes hosts and may carry launch defaults that command-line options override::

    description: One machine, chief + 2 workers + 1 ps
    strategy: ps          # optional launch defaults: strategy, workers, ps, evaluator, env,
                          # balance, worker_per, profile (a file of ddlctl check --bench --save)
    workers: 2
    ps: 1
    defaults:             # fields applied to every host unless the host sets them
      gpus: 0
    hosts:
      - localhost                     # [user@]host as a plain string, or a mapping:
      - {host: node1, user: ubuntu, gpus: 4, roles: [worker]}

Every error names ``file:line`` of the offending entry and what was expected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ddlctl.cluster.fields import HOST_KEYS, check_unique, make_host, split_target
from ddlctl.cluster.model import Cluster, Host
from ddlctl.contract import envvars
from ddlctl.contract.errors import ConfigError
from ddlctl.contract.strategies import STRATEGIES

CHOICES: dict[str, tuple[str, ...]] = {"balance": ("off", "speed"), "worker_per": ("auto", "gpu", "host")}

TOP_KEYS = ("description", "strategy", "workers", "ps", "evaluator", "env", "balance", "worker_per", "profile",
            "defaults", "hosts")


@dataclass(frozen=True)
class LaunchDefaults:
    """Launch options a template sets; ``None`` means "not set by the template"."""

    strategy: str | None = None
    workers: int | None = None
    ps: int | None = None
    evaluator: bool | None = None
    env: dict[str, str] = field(default_factory=dict)
    description: str = ""
    balance: str | None = None
    worker_per: str | None = None
    profile: str | None = None  # a cluster profile of ddlctl check --bench (path resolved from the template's folder)


@dataclass(frozen=True)
class Template:
    """A loaded template: the cluster and the launch defaults it carries."""

    cluster: Cluster
    defaults: LaunchDefaults


class _Reader:
    """Turns PyYAML nodes into values while keeping ``file:line`` for every error."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.loader = yaml.SafeLoader(text)

    def where(self, node: yaml.Node) -> str:
        return f"{self.source}:{node.start_mark.line + 1}"

    def root(self) -> yaml.Node | None:
        try:
            return self.loader.get_single_node()
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise ConfigError(f"{self.source}{line}: not valid YAML: {problem}") from None

    def scalar(self, node: yaml.Node, what: str) -> object:
        if not isinstance(node, yaml.ScalarNode):
            raise ConfigError(f"{self.where(node)}: {what} must be a single value")
        return self.loader.construct_object(node, deep=True)

    def mapping(self, node: yaml.Node, what: str) -> list[tuple[str, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise ConfigError(f"{self.where(node)}: {what} must be a mapping (key: value)")
        items: list[tuple[str, yaml.Node]] = []
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(self.scalar(key_node, "a key"))
            if key in seen:
                raise ConfigError(f"{self.where(key_node)}: {key!r} given twice in {what}")
            seen.add(key)
            items.append((key, value_node))
        return items

    def host_value(self, key: str, node: yaml.Node) -> object:
        if key == "roles" and isinstance(node, yaml.SequenceNode):
            return [self.scalar(n, "a role") for n in node.value]
        return self.scalar(node, key)


def _int_option(value: object, key: str, where: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{where}: {key}: {value!r} is not valid", f"{key} must be an integer >= {low}")
    return value


def parse_template(text: str, source: str = "<template>") -> Template:
    """Parse template text; errors name ``source:line``."""
    reader = _Reader(text, source)
    root = reader.root()
    if root is None:
        raise ConfigError(f"{source}: the template is empty", "it needs at least a 'hosts:' list")
    top = dict(reader.mapping(root, "the template"))
    for key, node in top.items():
        if key not in TOP_KEYS:
            raise ConfigError(f"{reader.where(node)}: unknown key {key!r}",
                              "expected one of: " + ", ".join(TOP_KEYS))
    if "hosts" not in top:
        raise ConfigError(f"{source}: the template has no 'hosts:' list")

    base: dict[str, object] = {}
    if "defaults" in top:
        for key, node in reader.mapping(top["defaults"], "defaults"):
            if key not in HOST_KEYS:
                raise ConfigError(f"{reader.where(node)}: unknown host key {key!r} in defaults",
                                  "expected one of: " + ", ".join(HOST_KEYS))
            base[key] = reader.host_value(key, node)

    hosts_node = top["hosts"]
    if not isinstance(hosts_node, yaml.SequenceNode) or not hosts_node.value:
        raise ConfigError(f"{reader.where(hosts_node)}: 'hosts' must be a non-empty list")
    hosts: list[Host] = []
    for item in hosts_node.value:
        where = reader.where(item)
        fields = dict(base)
        if isinstance(item, yaml.ScalarNode):
            target = str(reader.scalar(item, "a host"))
        else:
            entries = dict(reader.mapping(item, "a host entry"))
            if "host" not in entries:
                raise ConfigError(f"{where}: host entry without 'host:'",
                                  "write '- host: NAME' or just '- NAME'")
            target = str(reader.scalar(entries.pop("host"), "host"))
            for key, node in entries.items():
                if key not in HOST_KEYS:
                    raise ConfigError(f"{reader.where(node)}: unknown host key {key!r}",
                                      "expected one of: host, " + ", ".join(HOST_KEYS))
                fields[key] = reader.host_value(key, node)
        user, name = split_target(target, where)
        if user is not None:
            fields.pop("user", None)
        hosts.append(make_host(name, user, fields, where))
    check_unique(hosts)

    defaults: dict[str, object] = {}
    if "strategy" in top:
        strategy = reader.scalar(top["strategy"], "strategy")
        if strategy not in STRATEGIES:
            raise ConfigError(f"{reader.where(top['strategy'])}: unknown strategy {strategy!r}",
                              "expected one of: " + ", ".join(STRATEGIES))
        defaults["strategy"] = strategy
    for key, low in (("workers", 1), ("ps", 0)):
        if key in top:
            defaults[key] = _int_option(reader.scalar(top[key], key), key,
                                        reader.where(top[key]), low)
    if "evaluator" in top:
        value = reader.scalar(top["evaluator"], "evaluator")
        if not isinstance(value, bool):
            raise ConfigError(f"{reader.where(top['evaluator'])}: evaluator must be true or false")
        defaults["evaluator"] = value
    if "env" in top:
        defaults["env"] = {}
        for key, node in reader.mapping(top["env"], "env"):
            value = str(reader.scalar(node, key))
            problem = envvars.env_entry_problem(key, value)
            if problem is not None:
                raise ConfigError(f"{reader.where(node)}: env: {problem}")
            defaults["env"][key] = value
    if "description" in top:
        defaults["description"] = str(reader.scalar(top["description"], "description"))
    for key, choices in CHOICES.items():
        if key in top:
            value = reader.scalar(top[key], key)
            if value not in choices:
                raise ConfigError(f"{reader.where(top[key])}: {key}: {value!r} is not valid",
                                  "expected one of: " + ", ".join(choices))
            defaults[key] = value
    if "profile" in top:
        profile = Path(str(reader.scalar(top["profile"], "profile"))).expanduser()
        if not profile.is_absolute() and not source.startswith("<"):
            profile = Path(source).parent / profile
        defaults["profile"] = str(profile)
    return Template(Cluster(hosts=tuple(hosts), source=source), LaunchDefaults(**defaults))


def load_template(path: str | Path) -> Template:
    """Read and parse a template file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"template {str(path)!r} does not exist",
                          "ready templates are in cluster_templates/") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read template {str(path)!r}: {exc}") from None
    return parse_template(text, str(path))
