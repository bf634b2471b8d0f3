"""Placement of tasks on hosts and the per-task launch specification (TF_CONFIG, env, argv).

Placement rules (also in docs/strategies.md):

* ``ps``: one chief on the first host that accepts it (a host with ``roles=chief`` is preferred);
  ``--ps`` tasks (default 1) round-robin over hosts with ``roles=ps`` if any, else over every host;
  ``--workers`` (default: every worker slot) fill hosts' slots in file order; the evaluator goes to a
  host with ``roles=evaluator`` if any, else the last host.
* ``mwms``: ``--workers`` (default: one per host) placed one per host in file order, then a second
  per host while slots allow, and so on; worker 0 is the chief.
* ``--worker-per gpu`` (mwms default when worker hosts have different GPU counts, since
  MultiWorkerMirroredStrategy needs the same number of GPUs in every worker): one worker per GPU,
  each with one GPU in ``CUDA_VISIBLE_DEVICES`` (``slots=`` workers on CPU-only hosts); a 4 + 2 GPU
  cluster gets 6 equal workers. Under mwms a plan whose workers would hold different GPU counts is
  refused with the reason.
* ``mirrored``, ``central_storage``, ``one_device``: one process on the only host.
* GPUs: worker tasks sharing a host with ``gpus=N`` get disjoint ``CUDA_VISIBLE_DEVICES`` (a
  contiguous split, or one GPU each round-robin when there are more tasks than GPUs); ``ps`` tasks
  get no GPU, and go to CPU-only hosts when the cluster has some (and no host says ``roles=ps``).

Everything here is pure: the same inputs give the same plan, so ``--dry-run`` shows exactly what
``launch`` will start.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from ddlctl.cluster.model import Cluster, Host
from ddlctl.contract import envvars
from ddlctl.contract.errors import PlanError
from ddlctl.contract.rundir import REMOTE_ROOT
from ddlctl.contract.strategies import (
    MULTI_HOST_STRATEGIES,
    SERVER_STRATEGIES,
    facts_of,
)
from ddlctl.planning.dataservice import DATA_ROLES, data_argv, data_env, service_address
from ddlctl.planning.gpus import GROWTH_VAR, sharing_a_gpu
from ddlctl.planning.placement import layout
from ddlctl.planning.request import BALANCE, SECRET_MARKERS, LaunchRequest, Placement


@dataclass(frozen=True)
class TaskSpec:
    """Everything needed to start one process of the job.

    ``kind`` is ``"program"`` (the user's command or the built-in workload), ``"server"``
    (a ``tf.distribute.Server`` that ddlctl runs for ps-strategy workers and ps tasks) or
    ``"agent"`` (the per-host telemetry agent; agents live in :attr:`Plan.agents`).
    ``env`` holds only what ddlctl sets on top of the host's environment; ``unset_env`` what it
    removes. ``port`` is 0 when not yet chosen (a dry run on remote hosts), None when unused.
    """

    name: str
    role: str
    index: int
    host: Host
    port: int | None
    kind: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    unset_env: tuple[str, ...]
    workdir: str
    task_dir: str
    gpus: tuple[int, ...] | None
    tf_config: Mapping[str, object] | None

    @property
    def dir_name(self) -> str:
        """Folder name under ``tasks/`` (``worker-1``): from the name, which a task keeps when
        workers leave the job and its TF_CONFIG index changes."""
        return self.name.replace(":", "-")

    @property
    def address(self) -> str | None:
        return None if self.port is None else f"{_address_host(self.host)}:{self.port}"


@dataclass(frozen=True)
class Plan:
    """The whole job: strategy, cluster and one :class:`TaskSpec` per process."""

    run_id: str
    run_dir: str
    strategy: str
    cluster: Cluster
    tasks: tuple[TaskSpec, ...]
    request: LaunchRequest
    agents: tuple[TaskSpec, ...] = ()

    @property
    def hosts(self) -> tuple[Host, ...]:
        """Hosts that run at least one task, in cluster order."""
        used = {t.host for t in self.tasks}
        return tuple(h for h in self.cluster.hosts if h in used)

    def task(self, name: str) -> TaskSpec:
        """The task called ``name`` (``KeyError`` if the plan has none)."""
        for task in self.tasks:
            if task.name == name:
                return task
        raise KeyError(f"no task {name!r} in the plan")

    def program_tasks(self) -> tuple[TaskSpec, ...]:
        """Tasks that run the user's program (or the built-in workload)."""
        return tuple(t for t in self.tasks if t.kind == "program")

    def to_dict(self, redact: bool = True) -> dict[str, object]:
        """JSON-ready form (``plan.json``, ``--dry-run --json``), secrets redacted."""
        req = asdict(self.request)
        given = tuple(self.request.env)
        req["env"] = redact_env(self.request.env, given) if redact else dict(self.request.env)

        def task_dict(t: TaskSpec) -> dict[str, object]:
            return {
                "name": t.name,
                "role": t.role,
                "index": t.index,
                "host": t.host.label,
                "port": t.port,
                "kind": t.kind,
                "argv": list(t.argv),
                "env": redact_env(t.env, given) if redact else dict(t.env),
                "unset_env": list(t.unset_env),
                "workdir": t.workdir,
                "task_dir": t.task_dir,
                "gpus": None if t.gpus is None else list(t.gpus),
                "tf_config": t.tf_config,
            }

        return {
            "run_id": self.run_id,
            "run_dir": self.run_dir,
            "strategy": self.strategy,
            "cluster": {"source": self.cluster.source,
                        "hosts": [_host_dict(h) for h in self.cluster.hosts]},
            "request": req,
            "tasks": [task_dict(t) for t in self.tasks],
            "agents": [task_dict(t) for t in self.agents],
        }


def _host_dict(host: Host) -> dict[str, object]:
    data = asdict(host)
    data["roles"] = list(host.roles)
    return data


def redact_env(env: Mapping[str, str], given: Iterable[str] = ()) -> dict[str, str]:
    """Copy of ``env`` with ``***`` for the value of every key the user ``given`` (``--env``,
    a template's ``env:``: whatever its name, a value may be a password) and of secret-looking
    keys. ddlctl's own variables (``DDLCTL_*``, ``TF_CONFIG``...) stay readable."""
    given = set(given)
    return {k: ("***" if k in given or any(m in k.upper() for m in SECRET_MARKERS) else v) for k, v in env.items()}


def address_of(host: Host) -> str:
    """How other tasks reach ``host`` (as written in TF_CONFIG, without the port)."""
    return _address_host(host)


def _address_host(host: Host) -> str:
    """How other tasks reach this host in TF_CONFIG (``cluster.addresses`` sets ``address`` for this
    machine when remote hosts must reach it, and for SSH aliases)."""
    if host.is_local and not host.address:
        return "localhost"
    address = host.address or host.name
    return f"[{address}]" if ":" in address else address


#: Appended to a server task's name for the port its profiler serves on (``--trace``).
PROFILER_PORT_SUFFIX = "@profiler"


def profiler_tasks(placements: Sequence[Placement], request: LaunchRequest) -> list[Placement]:
    """The server tasks whose profiler the chief traces over ``--trace`` (ps workers and ps, stages)."""
    if (request.trace is None and not request.trace_auto) or request.strategy not in SERVER_STRATEGIES:
        return []
    return [p for p in placements if p.role in ("worker", "ps")]


def needs_port(placement: Placement, strategy: str) -> bool:
    """Whether the task listens on a TensorFlow port (a member of the cluster spec, or the tf.data
    service's dispatcher or a data worker)."""
    return placement.role in DATA_ROLES or strategy in MULTI_HOST_STRATEGIES and placement.role != "evaluator"


def tf_config_cluster(placements: Sequence[Placement], ports: Mapping[str, int]) -> dict[str, list[str]]:
    """The ``cluster`` part of TF_CONFIG: role -> ["host:port", ...] in index order."""
    cluster: dict[str, list[str]] = {}
    for p in placements:
        if p.role == "evaluator" or p.role in DATA_ROLES:
            continue
        cluster.setdefault(p.role, []).append(f"{_address_host(p.host)}:{ports.get(p.name, 0)}")
    return cluster


def task_python(host: Host, request: LaunchRequest) -> str:
    """The Python a task of ``request`` runs under on ``host``."""
    return host.python or (request.local_python if host.is_local else "python3")


#: A command's first word that means "this host's Python".
BARE_PYTHONS = frozenset({"python", "python3"})


def command_on(host: Host, request: LaunchRequest) -> tuple[str, ...]:
    """The user's command on ``host``: a bare ``python`` or ``python3`` as its first word is the
    host's ``python=`` when the hosts file gives one (on this machine without one:
    ``request.command_python_here``, ddlctl's own interpreter when it runs from an environment no
    other has replaced on PATH); anything else as given."""
    command = tuple(request.command)
    if command and command[0] in BARE_PYTHONS:
        python = host.python or (request.command_python_here if host.is_local else None)
        if python:
            return (python, *command[1:])
    return command


def python_note(plan: Plan) -> str | None:
    """One line saying what a bare ``python`` of the command runs as, where it is not PATH's."""
    command = plan.request.command
    if not command or command[0] not in BARE_PYTHONS:
        return None
    given: dict[tuple[str, str], list[str]] = {}
    for task in plan.program_tasks():
        if task.argv and task.argv[0] != command[0]:
            why = "python= in the hosts file" if task.host.python else "ddlctl's environment: no other is active"
            hosts = given.setdefault((task.argv[0], why), [])
            if task.host.label not in hosts:
                hosts.append(task.host.label)
    if not given:
        return None
    runs = "; ".join(f"{python} on {', '.join(hosts)} ({why})" for (python, why), hosts in given.items())
    return f"'{command[0]}' in the command is run as {runs}; give a path after -- to run another"


def common_env(request: LaunchRequest) -> dict[str, str]:
    """What the environment of every task of ``request`` holds (``--env`` included): the part a
    host agent's zygote is chosen by (:func:`ddlctl.host.prefork.zygote_key`), so that another
    task of the launch given it (``--bench``'s measurements) is forked from the tasks' zygote."""
    env = {"PYTHONUNBUFFERED": "1", envvars.RUN_ID: request.run_id, envvars.STRATEGY: request.strategy}
    if request.strategy in MULTI_HOST_STRATEGIES and request.command and request.legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    if request.command and request.auto_steps:  # transports put the model.fit hook on PYTHONPATH
        # (a ps server never fits, but given the same environment as the program beside it,
        # it is forked from that program's zygote: one TensorFlow import less on its host)
        env[envvars.AUTO_STEPS] = "1"
    if not request.prefork:
        env[envvars.PREFORK] = "0"
    if request.trace is not None:
        env[envvars.TRACE_STEPS] = "{}-{}".format(*request.trace)
    elif request.trace_auto:
        env[envvars.TRACE_STEPS] = "auto"
    return {**env, **request.env}


def make_plan(cluster: Cluster, request: LaunchRequest, ports: Mapping[str, int]) -> Plan:
    """The full plan. ``ports`` maps task names to the free port chosen on their host (0: later)."""
    placements = layout(cluster, request)
    check_balance(placements, request)
    strategy = request.strategy
    multi = strategy in MULTI_HOST_STRATEGIES
    spec_cluster = tf_config_cluster(placements, ports) if multi else None
    n_workers = sum(1 for p in placements if p.role == "worker")
    service = service_address(placements, ports, _address_host)  # (the tf.data service's, if any)
    shared_gpus = sharing_a_gpu((p.name, p.host.label, p.host.gpus or 0, p.gpus) for p in placements)
    # --trace under ps: where each server's profiler serves (the chief traces them all)
    profiled = {q.name: f"{_address_host(q.host)}:{ports[q.name + PROFILER_PORT_SUFFIX]}"
                for q in profiler_tasks(placements, request) if ports.get(q.name + PROFILER_PORT_SUFFIX)}
    tasks: list[TaskSpec] = []
    for p in placements:
        python = task_python(p.host, request)
        server = strategy in SERVER_STRATEGIES and p.role in ("worker", "ps") or p.role in DATA_ROLES
        if p.role in DATA_ROLES:
            argv: tuple[str, ...] = data_argv(python)
        elif server:
            argv = (python, "-m", "ddlctl.task.server")
        elif request.command:
            argv = command_on(p.host, request)
        else:
            argv = (python, "-m", "ddlctl.workloads", *request.workload_args)
        tf_config = None
        if spec_cluster is not None and p.role not in DATA_ROLES:
            tf_config = {"cluster": spec_cluster, "task": {"type": p.role, "index": p.index}}
        task_dir = f"{request.run_dir}/tasks/{p.role}-{p.index}" if p.host.is_local \
            else f"{REMOTE_ROOT}/runs/{request.run_id}/tasks/{p.role}-{p.index}"
        env: dict[str, str] = {
            envvars.TASK: p.name,
            envvars.TASK_DIR: task_dir,
            envvars.NUM_WORKERS: str(n_workers),
            envvars.RESTART_COUNT: "0",
            envvars.CHECKPOINT_DIR: checkpoint_dir(request, p.host),
        }
        if tf_config is not None:
            env["TF_CONFIG"] = json.dumps(tf_config, sort_keys=True)
        if p.role == "ps":
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif p.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, p.gpus))
        if p.name in shared_gpus:  # (a GPU another task sees: each takes memory as it needs it)
            env[GROWTH_VAR] = "true"
        if facts_of(strategy).stages and p.role == "chief":  # what the chief plans its stages over
            env[envvars.DEVICES] = json.dumps([
                {"name": w.name, "speed": device_speed(w.host, p.host, request), "memory_bytes": w.host.memory_bytes,
                 "gflops": request.speeds.get(w.host.label) if request.speeds else None}
                for w in placements if w.role == "worker"])
        if server and p.name in profiled:
            env[envvars.PROFILER_SERVE] = profiled[p.name].rpartition(":")[2]
        elif p.role == "chief" and profiled:
            env[envvars.PROFILER_ADDRESSES] = json.dumps(profiled, sort_keys=True)
        if request.balance == "speed" and p.role == "worker":
            env[envvars.BALANCE] = "speed"
            if request.speeds:
                env[envvars.SPEEDS] = json.dumps([request.speeds[w.host.label] for w in placements
                                                   if w.role == "worker"])
        env.update(data_env(p, f"{_address_host(p.host)}:{ports.get(p.name, 0)}", service))
        env.update(common_env(request))
        tasks.append(TaskSpec(
            name=p.name,
            role=p.role,
            index=p.index,
            host=p.host,
            port=ports.get(p.name, 0) if needs_port(p, strategy) else None,
            kind="server" if server else "program",
            argv=argv,
            env=env,
            unset_env=() if multi and p.role not in DATA_ROLES else ("TF_CONFIG",),
            workdir=p.host.workdir or request.default_workdir,
            task_dir=task_dir,
            gpus=p.gpus,
            tf_config=tf_config,
        ))
    agents = make_agents(tasks, request) if request.telemetry else ()
    return Plan(run_id=request.run_id, run_dir=request.run_dir, strategy=strategy,
                cluster=cluster, tasks=tuple(tasks), request=request, agents=agents)


def device_speed(host: Host, reference: Host, request: LaunchRequest) -> float:
    """A device's speed for model-parallel planning: measured (``--speeds``, relative to the host that
    profiles the model, else to the fastest), else the host's declared ``speed=``."""
    if not request.speeds:
        return host.speed
    base = request.speeds.get(reference.label) or max(request.speeds.values())
    return request.speeds[host.label] / base


def check_balance(placements: Sequence[Placement], request: LaunchRequest) -> None:
    """``--balance speed`` applies to mwms workers holding at most one device each, and speeds from a
    profile must cover every worker host."""
    if request.balance not in BALANCE:
        raise PlanError(f"unknown --balance {request.balance!r}", "expected one of: " + ", ".join(BALANCE))
    _require_speeds([p for p in placements if p.role == "worker"], request)
    if request.balance == "off":
        return
    if facts_of(request.strategy).asynchronous:
        raise PlanError("--balance speed does not apply to ps: it is asynchronous and balances itself (a faster "
                        "worker runs more steps; the report's 'work per worker' shows each worker's share)")
    if not facts_of(request.strategy).batch_split:
        raise PlanError(f"--balance speed applies to mwms, not {request.strategy}")
    workers = [p for p in placements if p.role == "worker"]
    crowded = [p for p in workers if p.gpus and len(p.gpus) > 1]
    if crowded:
        raise PlanError(f"--balance speed splits the batch per worker, but {crowded[0].name} on "
                        f"{crowded[0].host.label} holds {len(crowded[0].gpus or ())} GPUs",
                        "add --worker-per gpu (one worker per GPU)")


def _require_speeds(workers: Sequence[Placement], request: LaunchRequest) -> None:
    """A speeds profile must cover every worker's host."""
    missing = sorted({p.host.label for p in workers if p.host.label not in request.speeds}) if request.speeds else []
    if missing:
        raise PlanError(f"the speeds profile has no speed for {', '.join(missing)}",
                        "measure them with 'ddlctl check --bench --save FILE', or leave --speeds out")


def checkpoint_dir(request: LaunchRequest, host: Host) -> str:
    """The run's checkpoint folder on ``host``: it outlives restarts. Local hosts: the run
    directory's ``checkpoints/``; remote hosts: ``~/.ddlctl/runs/<run-id>/checkpoints``."""
    if host.is_local:
        return f"{request.run_dir}/checkpoints"
    return f"{REMOTE_ROOT}/runs/{request.run_id}/checkpoints"


def retarget(spec: TaskSpec, ports: Mapping[str, int]) -> TaskSpec:
    """``spec`` with the cluster members named in ``ports`` (by their TF_CONFIG name, ``worker:1``)
    moved to those ports (its own port and every address in its TF_CONFIG), for a group restarted
    after a port was taken."""
    if spec.tf_config is None:
        return spec
    cluster = {}
    for role, addresses in spec.tf_config["cluster"].items():  # type: ignore[union-attr]
        moved = []
        for index, address in enumerate(addresses):
            port = ports.get(f"{role}:{index}")
            moved.append(address if port is None else f"{address.rsplit(':', 1)[0]}:{port}")
        cluster[role] = moved
    tf_config = {**spec.tf_config, "cluster": cluster}
    env = {**spec.env, "TF_CONFIG": json.dumps(tf_config, sort_keys=True)}
    port = ports.get(f"{spec.role}:{spec.index}", spec.port) if spec.port is not None else None
    return dataclasses.replace(spec, tf_config=tf_config, env=env, port=port)


def profiler_ports(spec: TaskSpec) -> dict[str, int]:
    """The profiler port ddlctl planned for ``spec`` (``--trace``, a ps server), by its pseudo-task
    name ``<task>@profiler`` (what the ports are re-checked by); empty if none."""
    port = spec.env.get(envvars.PROFILER_SERVE, "")
    return {spec.name + PROFILER_PORT_SUFFIX: int(port)} if port.isdigit() else {}


def reprofile(spec: TaskSpec, moved: Mapping[str, int]) -> TaskSpec:
    """``spec`` with the profiler ports in ``moved`` (``<task>@profiler`` -> port) changed: its own
    (``DDLCTL_PROFILER_SERVE``) and those a ps chief traces (``DDLCTL_PROFILER_ADDRESSES``)."""
    env = dict(spec.env)
    own = moved.get(spec.name + PROFILER_PORT_SUFFIX)
    if own is not None and envvars.PROFILER_SERVE in env:
        env[envvars.PROFILER_SERVE] = str(own)
    if envvars.PROFILER_ADDRESSES in env:
        addresses = json.loads(env[envvars.PROFILER_ADDRESSES])
        for task, address in list(addresses.items()):
            port = moved.get(task + PROFILER_PORT_SUFFIX)
            if port is not None:
                addresses[task] = f"{address.rsplit(':', 1)[0]}:{port}"
        env[envvars.PROFILER_ADDRESSES] = json.dumps(addresses, sort_keys=True)
    return dataclasses.replace(spec, env=env) if env != spec.env else spec


def regroup(specs: Sequence[TaskSpec], members: Sequence[str]) -> list[TaskSpec]:
    """The specs of the workers ``members`` (in order) for a cluster of just them, after others
    left the job (mwms, ``--min-workers``): each TF_CONFIG lists the members' addresses and gives
    the task its position there as index; ``DDLCTL_NUM_WORKERS`` counts them; ``--balance speed``
    speeds keep the members' own. ddlctl's task names (and folders) stay as they were."""
    by_name = {s.name: s for s in specs}
    addresses = [by_name[n].address for n in members]
    regrouped = []
    for index, name in enumerate(members):
        spec = by_name[name]
        env = {**spec.env, envvars.NUM_WORKERS: str(len(members))}
        tf_config = None
        if spec.tf_config is not None:
            tf_config = {**spec.tf_config, "cluster": {**spec.tf_config["cluster"], "worker": addresses},  # type: ignore[dict-item]
                         "task": {"type": spec.role, "index": index}}
            env["TF_CONFIG"] = json.dumps(tf_config, sort_keys=True)
        if envvars.SPEEDS in env:
            speeds = json.loads(env[envvars.SPEEDS])
            env[envvars.SPEEDS] = json.dumps([speeds[by_name[n].index] for n in members])  # by current index
        regrouped.append(dataclasses.replace(spec, index=index, env=env, tf_config=tf_config))
    return regrouped


def make_agents(tasks: Sequence[TaskSpec], request: LaunchRequest) -> tuple[TaskSpec, ...]:
    """One telemetry agent per host that runs tasks, following its tasks' processes and its program
    tasks' step files."""
    hosts: list[Host] = []
    for task in tasks:
        if task.host not in hosts:
            hosts.append(task.host)
    agents = []
    for index, host in enumerate(hosts):
        python = host.python or (request.local_python if host.is_local else "python3")
        watch = [f"--{'watch' if t.kind == 'program' else 'task'}={t.name}={t.task_dir}"
                 for t in tasks if t.host == host and t.kind != "agent"]
        argv = (python, "-m", "ddlctl.host.telemetry", "--host", host.label, "--run-id", request.run_id,
                "--interval", f"{request.sample_interval_s:g}", *watch)
        task_dir = f"{request.run_dir}/telemetry/agent-{index}" if host.is_local \
            else f"{REMOTE_ROOT}/runs/{request.run_id}/telemetry/agent-{index}"
        agents.append(TaskSpec(
            name=f"agent:{index}", role="agent", index=index, host=host, port=None, kind="agent",
            argv=argv, env={"PYTHONUNBUFFERED": "1", envvars.RUN_ID: request.run_id,
                            envvars.TASK: f"agent:{index}"},
            unset_env=(), workdir=host.workdir or request.default_workdir, task_dir=task_dir,
            gpus=None, tf_config=None))
    return tuple(agents)
