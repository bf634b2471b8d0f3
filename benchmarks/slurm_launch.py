"""Start-up through Slurm: ``ddlctl launch --slurm`` vs a hand-written ``srun`` of the same processes
(and vs ddlctl's SSH transport), on 1 and 3 nodes of a real Slurm cluster on this machine.

The cluster is the test suite's (ddlctl/testing/slurm.py: one slurmctld, three slurmd, munge); the SSH
hosts are the suite's sshd test hosts. Every task runs ``python ready.py MODE``, which prints
``ready`` once it runs the user's code: MODE ``plain`` right away, MODE ``tf`` after ``import
tensorflow`` (what a real task does first). Figures, median of --repeats runs, seconds from the
command's start:

* ``srun``: ``srun -N n --ntasks-per-node=1 python ready.py MODE`` inside the allocation, until
  every task printed ``ready`` (what a person would write by hand, without TF_CONFIG or ports);
* ``ddlctl started``: ``ddlctl launch --slurm -s mwms -- python ready.py MODE`` until its "started
  N task(s)" line (every task's process exists: allocation read, one agent step per node with the
  port probe, TF_CONFIG, start);
* ``ddlctl ready``: the same run until every task printed ``ready``;
* ``ssh ready``: ``ddlctl launch --hosts`` on n sshd test hosts, until every task printed ``ready``.

Both ddlctl runs keep their defaults (telemetry agent per node on). The allocation exists before
the clock starts (``salloc`` runs this script's inner part), as it does for a user inside salloc.

Run as root:  .venv/bin/python benchmarks/slurm_launch.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

READY = "import sys\nif sys.argv[1] == 'tf':\n    import tensorflow  # noqa: F401\nprint('ready', flush=True)\n"


def until_ready(cmd: list[str], env: dict[str, str], count: int, marker: str | None = None) -> tuple[float, float]:
    """(seconds until ``marker`` was printed, or NaN; seconds until ``count`` lines ended in 'ready')."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None
    seen, ready, lines = float("nan"), 0, []
    ready_at = float("nan")
    for line in proc.stdout:
        lines.append(line)
        if marker and marker in line and seen != seen:
            seen = time.monotonic() - start
        if line.rstrip().endswith("ready"):
            ready += 1
            if ready == count:
                ready_at = time.monotonic() - start
    if proc.wait() != 0 or ready < count:
        raise SystemExit(f"{cmd[:6]}... failed ({proc.returncode}, {ready} ready):\n{''.join(lines[-30:])}")
    return seen, ready_at


def inner(args: argparse.Namespace) -> None:
    """Inside ``salloc -N n``: hand srun and ddlctl --slurm, printed as JSON."""
    n = int(os.environ["SLURM_JOB_NUM_NODES"])
    env = {k: v for k, v in {**os.environ, "NO_COLOR": "1"}.items() if k != "PYTHONDONTWRITEBYTECODE"}
    program = str(Path(args.workdir) / "ready.py")
    results: dict[str, dict[str, list[float]]] = {}
    for mode in ("plain", "tf"):
        row: dict[str, list[float]] = {"srun": [], "started": [], "ready": []}
        for _ in range(args.repeats):
            row["srun"].append(until_ready(["srun", f"-N{n}", "--ntasks-per-node=1", "--overlap", sys.executable,
                                            program, mode], env, n)[1])
            started, ready = until_ready([sys.executable, "-m", "ddlctl", "launch", "--slurm", "-s", "mwms",
                                          "--runs-dir", f"{args.workdir}/runs", "--", sys.executable, program, mode],
                                         env, n, marker="started ")
            row["started"].append(started)
            row["ready"].append(ready)
        results[mode] = row
    print("RESULT " + json.dumps(results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(args)
        return
    from ddlctl.testing.slurm import SlurmCluster, unavailable_reason
    from ddlctl.testing.sshd import SshTestCluster

    why = unavailable_reason()
    if why:
        raise SystemExit(why)
    root = Path(tempfile.mkdtemp(prefix="ddlctl-slurm-bench-"))
    (root / "ready.py").write_text(READY)
    slurm = SlurmCluster(root / "slurm")
    ssh = SshTestCluster(root / "ssh", 3)
    table = []
    try:
        slurm.start()
        for n in (1, 3):
            done = subprocess.run(["salloc", f"-N{n}", "--ntasks-per-node=1", "--quiet", sys.executable, __file__,
                                   "--inner", "--workdir", str(root), "--repeats", str(args.repeats)],
                                  capture_output=True, text=True, env=slurm.env, cwd=ROOT)
            line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                raise SystemExit(f"the inner benchmark failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            results = json.loads(line[len("RESULT "):])
            hosts_file = ssh.hosts_file(root / f"hosts{n}.txt", ssh.hosts[:n])
            env = {k: v for k, v in {**ssh.env, "NO_COLOR": "1"}.items() if k != "PYTHONDONTWRITEBYTECODE"}
            for mode in ("plain", "tf"):
                over_ssh = [until_ready([sys.executable, "-m", "ddlctl", "launch", "--hosts", str(hosts_file), "-s",
                                         "mwms", "--runs-dir", str(root / "runs-ssh"), "--", sys.executable,
                                         str(root / "ready.py"), mode], env, n)[1] for _ in range(args.repeats)]
                row = {k: statistics.median(v) for k, v in results[mode].items()}
                table.append((n, mode, row["srun"], row["started"], row["ready"], statistics.median(over_ssh)))
    finally:
        ssh.stop()
        slurm.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nmedian of {args.repeats} runs, seconds; Slurm 22.05 (3 slurmd) and sshd hosts on this machine")
    print(f"{'nodes':>5} {'task':>6} {'srun':>6} {'ddlctl started':>15} {'ddlctl ready':>13} {'ssh ready':>10} "
          f"{'ready/srun':>11} {'started/srun':>13} {'ready/ssh':>10}")
    for n, mode, srun_s, started, ready, ssh_s in table:
        print(f"{n:>5} {mode:>6} {srun_s:>6.2f} {started:>15.2f} {ready:>13.2f} {ssh_s:>10.2f} "
              f"{ready / srun_s:>11.2f} {started / srun_s:>13.2f} {ready / ssh_s:>10.2f}")


if __name__ == "__main__":
    main()
