"""Task output at the pipe's speed: a program that writes N lines of 100 bytes as fast as it can,
run alone with its output to a file, and under ``ddlctl launch -s one_device`` (ddlctl's own
output to a file: every line through the host agent, the controller's line splitting, collapsing
and control-character check, into the task's ``output.log`` and onto ddlctl's stdout), side by
side in interleaved rounds (by hand; not part of CI).

Lossless is checked each round: the log and the console each hold every line. Printed: medians of
the wall time of each, their ratio (the target: ddlctl at most 2.5x the program alone), and
ddlctl's own CPU-seconds (the controller and its host agent). Each round also runs both with no
output at all: what ddlctl's start and end cost (its zygote imports TensorFlow for any Python
program), so that the output's own cost is printed too (each less its no-output time).

With ``--ssh`` (as root, OpenSSH installed) the task runs on an sshd test host of this machine
(``ddlctl.testing.sshd``): every line also crosses an SSH channel.

    .venv/bin/python benchmarks/output_throughput.py --lines 1000000 --rounds 3 [--ssh]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAM = ("import sys\n"
           "line = ('x' * 90 + ' {:08d}\\n')\n"
           "write = sys.stdout.write\n"
           "for i in range(int(sys.argv[1])):\n"
           "    write(line.format(i))\n")


def alone(program: Path, lines: int, out: Path) -> float:
    """Wall seconds of the program writing to a file by itself."""
    started = time.perf_counter()
    with out.open("wb") as handle:
        subprocess.run([sys.executable, str(program), str(lines)], stdout=handle, check=True)
    return time.perf_counter() - started


def under_ddlctl(program: Path, lines: int, runs: Path, out: Path, hosts: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall seconds, ddlctl's CPU-seconds) of the program under ``ddlctl launch`` (``hosts``: its
    ``--hosts`` option); checks that the task's log and ddlctl's console each hold every line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with out.open("wb") as handle:
        done = subprocess.run([sys.executable, "-m", "ddlctl", "launch", "-s", "one_device", "--no-telemetry",
                               *hosts, "--runs-dir", str(runs), "--", sys.executable, str(program), str(lines)],
                              stdout=handle, stderr=subprocess.PIPE, check=False, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(done.stderr.decode(errors="replace")[-2000:])
    run = next(p for p in runs.iterdir() if p.is_dir())
    logged = sum(1 for line in (run / "tasks" / "worker-0" / "output.log").open("rb") if line.startswith(b"x"))
    shown = sum(1 for line in out.open("rb") if b"] xxxx" in line)
    if logged != lines or shown != lines:
        raise SystemExit(f"lost lines: {lines} written, {logged} in the log, {shown} on the console")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ssh", action="store_true", help="run the task on an sshd test host of this machine")
    args = parser.parse_args()
    walls: dict[str, list[float]] = {"alone": [], "ddlctl": []}
    cpus: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        program = folder / "lines.py"
        program.write_text(PROGRAM)
        hosts: tuple[str, ...] = ()
        env: dict[str, str] = {}
        cluster = None
        if args.ssh:
            from ddlctl.testing.sshd import SshTestCluster

            cluster = SshTestCluster(folder / "ssh", 1)
            hosts, env = ("--hosts", str(cluster.hosts_file(folder / "hosts.txt"))), cluster.env
        walls["alone0"], walls["ddlctl0"] = [], []
        for round_ in range(args.rounds):
            walls["alone"].append(alone(program, args.lines, folder / "alone.txt"))
            walls["alone0"].append(alone(program, 0, folder / "alone.txt"))
            runs = folder / f"runs{round_}"
            runs.mkdir(mode=0o700)
            wall, cpu = under_ddlctl(program, args.lines, runs, folder / "console.txt", hosts, env)
            walls["ddlctl"].append(wall)
            cpus.append(cpu)
            runs = folder / f"empty{round_}"
            runs.mkdir(mode=0o700)
            walls["ddlctl0"].append(under_ddlctl(program, 0, runs, folder / "console.txt", hosts, env)[0])
        if cluster is not None:
            cluster.stop()
    alone_s, ddlctl_s = statistics.median(walls["alone"]), statistics.median(walls["ddlctl"])
    fixed_alone, fixed_ddlctl = statistics.median(walls["alone0"]), statistics.median(walls["ddlctl0"])
    print(f"{args.lines:,} lines of 100 bytes, {args.rounds} rounds (medians){', over SSH' if args.ssh else ''}")
    print(f"  program alone, to a file: {alone_s:.2f} s  ({', '.join(f'{w:.2f}' for w in walls['alone'])})")
    print(f"  under ddlctl launch:      {ddlctl_s:.2f} s  ({', '.join(f'{w:.2f}' for w in walls['ddlctl'])}); "
          f"CPU {statistics.median(cpus):.2f} s (program, agent, controller)")
    print(f"  ddlctl / alone: {ddlctl_s / alone_s:.2f}x (target <= 2.5x), every line in the log and on the console")
    print(f"  with no output: alone {fixed_alone:.2f} s, ddlctl {fixed_ddlctl:.2f} s (start and end); the output's own "
          f"cost: {ddlctl_s - fixed_ddlctl:.2f} s vs {alone_s - fixed_alone:.2f} s = "
          f"{(ddlctl_s - fixed_ddlctl) / (alone_s - fixed_alone):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
