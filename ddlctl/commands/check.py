"""``ddlctl check``: pre-flight every host in parallel and show what each can run."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

import ddlctl
from ddlctl.cluster.source import load_cluster
from ddlctl.commands.preflight import HostReport, host_warnings, probe_transports, with_mismatch
from ddlctl.console import closed_stdout as stdoutgone
from ddlctl.contract.errors import ConfigError
from ddlctl.transport.base import Transport
from ddlctl.transport.local import LocalTransport


def gather_slurm(python: str | None = None) -> list[HostReport]:
    """Reports for every node of the Slurm allocation ddlctl runs in, each probed in a job step."""
    from ddlctl.cluster.slurm import read_allocation
    from ddlctl.transport.slurm import slurm_transports

    allocation = read_allocation()
    cluster, _, _ = load_cluster(None, None, 1, allocation, python)
    return probe_transports(slurm_transports(cluster.hosts, allocation), cluster.hosts)


def gather(hosts: str | None, template: str | None, ssh: object | None) -> list[HostReport]:
    """Reports for every host of the cluster (unreachable hosts included, with their reason)."""
    from ddlctl.transport.ssh import SshOptions, SshTransport, connect_each

    cluster, _, _ = load_cluster(hosts, template, 1)
    transports: dict[str, Transport] = {h.label: LocalTransport(h) for h in cluster.hosts if h.is_local}
    errors: dict[str, str] = {}
    remote = [h for h in cluster.hosts if not h.is_local]
    if remote:
        for label, result in connect_each(remote, ssh if isinstance(ssh, SshOptions) else SshOptions()).items():
            if isinstance(result, Exception):
                errors[label] = result.message  # type: ignore[attr-defined]
            else:
                transports[label] = SshTransport(result, ssh if isinstance(ssh, SshOptions) else None)
    try:
        reachable = [h for h in cluster.hosts if h.label in transports]
        probed = {r.host: r for r in probe_transports(transports, reachable)}
    finally:
        for transport in transports.values():
            transport.close()
    return [probed.get(h.label) or HostReport(h.label, h.source, error=errors[h.label], spec=h)
            for h in cluster.hosts]


def _gpus(report: HostReport) -> str:
    gpus = report.facts.get("gpus") or []
    if not gpus:
        return str(report.facts.get("gpu_note") or "no GPU")
    names = sorted({g["name"] for g in gpus})  # type: ignore[index]
    memory = gpus[0].get("memory_total_bytes")  # type: ignore[union-attr]
    size = f" {memory / 2**30:.0f} GiB" if memory else ""
    return f"{len(gpus)} x {', '.join(names)}{size} (driver {report.facts.get('driver')})"


def _data_cpus(report: HostReport) -> object:
    """The CPUs a host's data workers may use: its ``cpus=``, else all it has (None: unknown)."""
    host = report.spec
    return len(host.cpus) if host is not None and host.cpus else report.facts.get("cpus")


def what_it_runs(report: HostReport) -> str:
    """What the host takes, by its ``roles=`` and ``slots=``: trainers, and on a ``roles=data`` host
    its data workers (the tf.data service) and the CPUs they share (pure)."""
    host = report.spec
    if host is None:
        return "-"
    trains = [r for r in host.roles if r != "data"]
    said = [f"{'any role' if not host.roles else ', '.join(trains)} ({host.slots} slot{'s' * (host.slots != 1)})"] \
        if trains or not host.roles else []
    if "data" in host.roles:
        cpus = _data_cpus(report)
        on = f" on {cpus} CPU{'s' * (cpus != 1)}" if isinstance(cpus, int) else ""
        said.append(f"data: {host.slots} data worker{'s' * (host.slots != 1)}{on} (tf.data service)")
    return "; ".join(said)


def data_warnings(report: HostReport) -> list[str]:
    """What a ``roles=data`` host should be told (pure): data workers that share fewer CPUs than
    there are of them; GPUs that no task of a data-only host uses."""
    host = report.spec
    if host is None or "data" not in host.roles or not report.reachable:
        return []
    warnings = []
    cpus = _data_cpus(report)
    if isinstance(cpus, int) and host.slots > cpus:
        warnings.append(f"slots={host.slots} data workers share {cpus} CPU{'s' * (cpus != 1)}: each makes input at "
                        f"a fraction of a core (an input pipeline uses a core or more): slots={cpus} or fewer")
    gpus = report.facts.get("gpus")
    count = len(gpus) if isinstance(gpus, list) else host.gpus
    if host.roles == ("data",) and count:
        warnings.append(f"its {count} GPU(s) stay idle: data workers make input on CPUs (roles=data,worker trains "
                        "there too)")
    return warnings


def render(reports: list[HostReport], console: Console) -> None:
    table = Table(title=f"ddlctl check (controller ddlctl {ddlctl.__version__})", title_justify="left")
    for column in ("host", "status", "runs", "python", "tensorflow", "tf-keras", "ddlctl on host", "GPUs", "problems"):
        table.add_column(column, overflow="fold")
    for r in reports:
        f = r.facts
        installed = f.get("ddlctl_installed")
        ddl = "-" if not r.reachable else (str(installed) if installed else "not installed")
        if installed and installed != ddlctl.__version__:
            ddl += f" (≠ {ddlctl.__version__}; tasks use the controller's, shipped)"
        status = Text("ok", style="green") if r.usable else Text("unreachable" if not r.reachable else "unusable",
                                                                  style="red")
        table.add_row(r.host, status, what_it_runs(r), str(f.get("python", "-")), str(f.get("tensorflow") or "-"),
                      str(f.get("tf_keras") or "-"), ddl, _gpus(r) if r.reachable else "-",
                      "; ".join(r.problems) or "-")
    console.print(table)
    bad = sum(not r.usable for r in reports)
    console.print(f"{len(reports) - bad} of {len(reports)} host(s) usable")
    for r in reports:
        for warning in [*host_warnings(r.facts), *data_warnings(r)] if r.reachable else ():
            console.print(f"warning: {r.host}: {warning}", style="yellow", highlight=False)
    for note in dict.fromkeys(note for r in reports for note in r.notes):  # (about the hosts together: once)
        console.print(f"warning: {note}", style="yellow", highlight=False)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f} MiB/s"


def _latency(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f} ms"


def render_profile(profile: object, console: Console) -> None:
    """The measured device speeds and links of ``check --bench``."""
    from ddlctl.commands.bench import ClusterProfile

    assert isinstance(profile, ClusterProfile)
    fastest = max(h.speed for h in profile.hosts.values())
    table = Table(title="measured devices (matmul throughput in each host's TensorFlow) and controller links",
                  title_justify="left")
    for column in ("host", "devices", "GFLOP/s per device", "relative", "latency", "to host", "from host"):
        table.add_column(column, justify="left" if column in ("host", "devices") else "right")
    for label, h in profile.hosts.items():
        kinds = sorted({str(d.get("kind")) for d in h.devices})
        table.add_row(label, f"{len(h.devices)} x {'/'.join(kinds)}", f"{h.speed:,.1f}", f"{h.speed / fastest:.2f}",
                      _latency(h.latency_s), _rate(h.to_host_bytes_per_s), _rate(h.from_host_bytes_per_s))
    console.print(table)
    if profile.links:
        links = Table(title="host-to-host links (direct TCP between the hosts)", title_justify="left")
        for column in ("from", "to", "latency", "bandwidth"):
            links.add_column(column, justify="left" if column in ("from", "to") else "right")
        for link in profile.links:
            links.add_row(link["from"], link["to"], _latency(link["latency_s"]), _rate(link["bandwidth_bytes_per_s"]))
        console.print(links)


def check(hosts: str | None, template: str | None, ssh: object | None, json_out: bool, out: Console,
          bench: bool = False, bench_seconds: float = 1.0, save: str | None = None, slurm: bool = False,
          python: str | None = None) -> int:
    """Run ``ddlctl check``; 0 when every host is usable, 1 otherwise. With ``bench``: measure
    every host's devices and links instead (and ``save`` the cluster profile). With ``slurm``: the
    nodes of the allocation ddlctl runs in, through srun."""
    if slurm and (hosts or template):
        raise ConfigError("check --slurm checks the allocation's nodes: drop "
                          + ", ".join(o for o, v in (("--hosts", hosts), ("--template", template)) if v))
    if bench:
        from ddlctl.commands.bench import bench as run_bench
        from ddlctl.commands.bench import save_profile

        allocation = None
        if slurm:
            from ddlctl.cluster.slurm import read_allocation

            allocation = read_allocation()
        profile = run_bench(hosts, template, ssh, bench_seconds, allocation)
        if save:
            save_profile(profile, save)
        if json_out:
            stdoutgone.write(json.dumps(profile.to_dict(), indent=1) + "\n")
        else:
            render_profile(profile, out)
            if save:
                out.print(f"saved the cluster profile to {save} (use it with: ddlctl launch --balance speed "
                          f"--speeds {save})")
        return 0
    reports = with_mismatch(gather_slurm(python) if slurm else gather(hosts, template, ssh))
    if json_out:
        stdoutgone.write(json.dumps([{**r.to_dict(), "runs": what_it_runs(r),
                                      "warnings": [*r.warnings, *data_warnings(r)]} for r in reports], indent=1) + "\n")
    else:
        render(reports, out)
    return 0 if all(r.usable for r in reports) else 1
