"""Start-up fan-out: ddlctl launch vs a sequential ssh loop vs pdsh, on 1, 4 and 16 SSH hosts.

Each "host" is a real sshd on its own loopback address (ddlctl/testing/sshd.py). The command on every host
is ``true``. Figures (median of --repeats runs, seconds):

* ``ddlctl started``: from ``ddlctl launch`` to its "started N task(s)" line (every task's
  process has been started on its host: connections, host probe, ports, code bundle, exec);
* ``ddlctl total``: the whole ``ddlctl launch`` until it returned (tasks finished, files
  collected, summary printed);
* ``ssh loop``: ``for h in hosts: ssh h true`` one after another;
* ``pdsh``: ``pdsh -R ssh -w hosts true`` (parallel);
* ``pdsh agent``: pdsh running what ddlctl starts on every host (its Python host agent, from the
  code bundle, with the launch probe): the floor for any launcher that runs Python there. In this
  benchmark every "host" shares this machine's cores, so remote start-up costs add up here where
  on real hosts they would run side by side.

Run as root (sshd needs it):  .venv/bin/python benchmarks/launch_fanout.py [--sizes 1,4,16]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ddlctl.testing.sshd import SshTestCluster  # noqa: E402


def timed(cmd: list[str], env: dict[str, str], marker: str | None = None) -> tuple[float, float]:
    """(seconds until ``marker`` appeared on stderr, or total; total seconds)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    seen = None
    lines = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if marker and seen is None and marker in line:
            seen = time.monotonic() - start
    proc.wait()
    total = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]}... failed with {proc.returncode}:\n{''.join(lines[-30:])}")
    return (seen if seen is not None else total), total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if not shutil.which("pdsh"):
        raise SystemExit("pdsh is not installed: apt-get install -y pdsh")
    root = Path(tempfile.mkdtemp(prefix="ddlctl-bench-"))
    cluster = SshTestCluster(root, max(sizes), same_port=True)
    # as on any machine where Python has run once: bytecode caches written and used
    env = {k: v for k, v in {**cluster.env, "NO_COLOR": "1"}.items() if k != "PYTHONDONTWRITEBYTECODE"}
    port = cluster.hosts[0].port
    ssh_opts = ["-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={cluster.home}/.ssh/known_hosts",
                "-i", str(cluster.user_key), "-p", str(port)]
    rows = []
    try:
        for n in sizes:
            hosts = cluster.hosts[:n]
            hosts_file = cluster.hosts_file(root / f"hosts{n}.txt", hosts)
            ddl_start, ddl_total, loop, pdsh, pdsh_agent = [], [], [], [], []
            for _ in range(args.repeats):
                started, total = timed([sys.executable, "-m", "ddlctl", "launch", "--hosts", str(hosts_file),
                                        "--strategy", "mwms", "--runs-dir", str(root / "runs"), "--", "true"],
                                       env, marker="started ")
                ddl_start.append(started)
                ddl_total.append(total)
                t0 = time.monotonic()
                for h in hosts:
                    subprocess.run(["ssh", *ssh_opts, f"root@{h.address}", "true"], check=True, env=env)
                loop.append(time.monotonic() - t0)
                pdsh_env = {**env, "PDSH_SSH_ARGS_APPEND": " ".join(ssh_opts)}
                pdsh.append(timed(["pdsh", "-R", "ssh", "-l", "root", "-w",
                                   ",".join(h.address for h in hosts), "true"], pdsh_env)[1])
                bundle = max((Path.home() / ".ddlctl" / "code").glob("ddlctl-*.zip"), key=lambda p: p.stat().st_mtime)
                agent = f"env PYTHONPATH={bundle} {sys.executable} -m ddlctl.host.agent --ports 1 </dev/null"
                pdsh_agent.append(timed(["pdsh", "-R", "ssh", "-l", "root", "-w",
                                         ",".join(h.address for h in hosts), agent], pdsh_env)[1])
            rows.append((n, *(statistics.median(v) for v in (ddl_start, ddl_total, loop, pdsh, pdsh_agent))))
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nmedian of {args.repeats} runs, seconds; each host a real sshd on loopback, command `true`")
    print(f"{'hosts':>5} {'ddlctl started':>15} {'ddlctl total':>13} {'ssh loop':>9} {'pdsh':>7} "
          f"{'pdsh agent':>11} {'started/pdsh':>13} {'total/pdsh':>11} {'started/pdsh agent':>19}")
    for n, started, total, loop_s, pdsh_s, agent_s in rows:
        print(f"{n:>5} {started:>15.2f} {total:>13.2f} {loop_s:>9.2f} {pdsh_s:>7.2f} {agent_s:>11.2f} "
              f"{started / pdsh_s:>13.2f} {total / pdsh_s:>11.2f} {started / agent_s:>19.2f}")
    if len(rows) > 1:
        (n0, s0, _, l0, p0, _), (n1, s1, _, l1, p1, _) = rows[0], rows[-1]
        print(f"growth {n0}->{n1} hosts: ddlctl started x{s1 / s0:.2f}, ssh loop x{l1 / l0:.2f}, "
              f"pdsh x{p1 / p0:.2f}")


if __name__ == "__main__":
    main()
