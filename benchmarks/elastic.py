"""A host lost for good, side by side in one run (by hand; not part of CI; needs root and sshd).

Three real sshd test hosts (``ddlctl/testing/sshd.py``), mwms with the built-in workload, one worker each.
The same job runs three times:

* **fault-free**: the cold start (ddlctl start -> first step), wall time and final accuracy;
* **by hand**: at a third of the run one host is lost for good (its sessions and sshd killed): the
  job fails (exit 255); it is then resubmitted on the two remaining hosts, resuming from the first
  run's checkpoint (``--checkpoint-dir``), as a user would do, with no time lost in between (a
  lower bound for a person);
* **elastic**: the same loss under ``--min-workers 2``: the job trains on with two workers; the host
  is back (sshd started) a while later and is taken back at the next checkpoint.

Printed: time from the loss to training again (target <= cold start + 5 s, beyond
``--host-timeout``), time from the host's return to training at full size (target <= 60 s),
goodput and wall time of each, and final accuracy against the fault-free run's (target within 1
point).

    .venv/bin/python benchmarks/elastic.py --steps 6000 --back-after 5
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddlctl.testing.faults import Job, step_count, wait_for  # noqa: E402
from ddlctl.testing.sshd import SshTestCluster  # noqa: E402

REMOTE_RUNS = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ddlctl" / "runs"  # the test hosts' login
BATCH = 96  # split evenly over 3 workers and over 2


def steps_of(run_dir: Path) -> list[dict]:
    """Worker 0's step records (collected into the run directory at the end)."""
    path = run_dir / "tasks" / "worker-0" / "steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def first_step_after(run_dir: Path, moment: float) -> float | None:
    """When worker 0 began its first step after ``moment`` (epoch seconds)."""
    starts = [r["start_us"] / 1e6 for r in steps_of(run_dir)]
    later = [s for s in starts if s > moment]
    return min(later) if later else None


def remote_steps(job: Job) -> int:
    return step_count(REMOTE_RUNS / job.run_dir.name / "tasks" / "worker-0" / "steps.jsonl")


def accuracy(run_dir: Path) -> float:
    return float(json.loads((run_dir / "tasks" / "worker-0" / "result.json").read_text())["accuracy"])


def launch(cluster: SshTestCluster, root: Path, name: str, hosts: list, steps: int, *extra: str,
           command: tuple[str, ...] = ()) -> Job:
    runs = root / name / "runs"
    runs.mkdir(parents=True)
    hosts_file = cluster.hosts_file(root / name / "hosts.txt", hosts)
    tail = ("--", *command) if command else ("--steps", str(steps), "--batch-size", str(BATCH))
    return Job(runs, "--hosts", str(hosts_file), "-s", "mwms", "--no-telemetry", "--grace", "2",
               "--startup-timeout", "180", *extra, *tail, env=cluster.env)


def summary(job: Job) -> dict:
    return json.loads((job.run_dir / "summary.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6000,
                        help="steps of each run (enough for the host to be back before the end)")
    parser.add_argument("--host-timeout", type=float, default=5.0, help="--host-timeout of the faulty runs")
    parser.add_argument("--back-after", type=float, default=5.0,
                        help="seconds after the elastic job trains on with two workers before the host is back")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ddlctl-elastic-"))
    cluster = SshTestCluster(root / "hosts", 3)
    lost = cluster.hosts[2]
    rows: dict[str, dict] = {}
    try:
        # fault-free
        started = time.time()
        job = launch(cluster, root, "clean", cluster.hosts, args.steps)
        assert job.wait(3600) == 0, job.stderr()[-3000:]
        first = steps_of(job.run_dir)[0]["start_us"] / 1e6
        rows["fault-free"] = {"wall": summary(job)["wall_time_s"], "goodput": summary(job)["goodput"],
                              "accuracy": accuracy(job.run_dir), "cold": first - started}
        print(f"fault-free: cold start {first - started:.1f}s", flush=True)

        # by hand: the job fails, then is resubmitted on the two hosts left from its checkpoint
        job = launch(cluster, root, "manual", cluster.hosts, args.steps, "--host-timeout", str(args.host_timeout))
        wait_for(lambda: remote_steps(job) >= args.steps // 3 or job.proc.poll() is not None, 1800, "a third")
        lost.drop_connections(stop_listener=True)
        loss = time.time()
        assert job.wait(600) == 255, job.stderr()[-3000:]
        failed_wall = summary(job)["wall_time_s"]
        checkpoints = REMOTE_RUNS / job.run_dir.name / "checkpoints"
        again = launch(cluster, root, "resubmitted", cluster.hosts[:2], args.steps, command=(
            sys.executable, "-m", "ddlctl.workloads", "--steps", str(args.steps), "--batch-size", str(BATCH),
            "--checkpoint-dir", str(checkpoints)))
        assert again.wait(3600) == 0, again.stderr()[-3000:]
        lost.start()
        back = first_step_after(again.run_dir, loss)
        rows["by hand"] = {"wall": failed_wall + summary(again)["wall_time_s"],
                           "goodput": None, "accuracy": accuracy(again.run_dir),
                           "training_again": None if back is None else back - loss}

        # elastic: trains on with two workers, takes the host back when it returns
        job = launch(cluster, root, "elastic", cluster.hosts, args.steps, "--host-timeout", str(args.host_timeout),
                     "--min-workers", "2", "--max-restarts", "1", "--rejoin-after", "5")
        wait_for(lambda: remote_steps(job) >= args.steps // 3 or job.proc.poll() is not None, 1800, "a third")
        lost.drop_connections(stop_listener=True)
        loss = time.time()
        wait_for(lambda: "started worker:0, worker:1 again" in job.stderr() or job.proc.poll() is not None, 600,
                 "two workers to start again")
        time.sleep(args.back_after)
        lost.start()
        returned = time.time()
        assert job.wait(3600) == 0, job.stderr()[-3000:]
        records = steps_of(job.run_dir)
        restarts = summary(job)["restarts"]
        grow = next((r for r in restarts if r["cause"] == "grow"), None)
        full = first_step_after(job.run_dir, grow["time"]) if grow else None
        shrunk = first_step_after(job.run_dir, loss)
        rows["elastic"] = {"wall": summary(job)["wall_time_s"], "goodput": summary(job)["goodput"],
                           "accuracy": accuracy(job.run_dir), "steps": len(records),
                           "training_again": None if shrunk is None else shrunk - loss,
                           "full_size_again": None if full is None else full - returned}
    finally:
        cluster.stop()

    def f(value, spec: str = ".1f") -> str:  # noqa: ANN001
        return "-" if value is None else format(value, spec)

    cold = rows["fault-free"]["cold"]
    base = rows["fault-free"]["accuracy"]
    print(f"\nmwms, 3 sshd hosts, {args.steps} steps of batch {BATCH}, host lost at a third, "
          f"--host-timeout {args.host_timeout:g}s")
    print(f"{'run':<11} {'wall s':>7} {'goodput':>8} {'accuracy':>9} {'vs clean':>9} {'training again s':>17} "
          f"{'full size again s':>18}")
    for name, row in rows.items():
        print(f"{name:<11} {f(row['wall']):>7} {f(row['goodput'], '.3f'):>8} {f(row['accuracy'], '.4f'):>9} "
              f"{f(row['accuracy'] - base, '+.4f'):>9} {f(row.get('training_again')):>17} "
              f"{f(row.get('full_size_again')):>18}")
    elastic = rows["elastic"]
    again = elastic.get("training_again")
    print(f"\ncold start {cold:.1f}s; elastic training again {f(again)}s after the loss, of which "
          f"{args.host_timeout:g}s --host-timeout: {f(None if again is None else again - args.host_timeout)}s "
          f"beyond it (target <= cold start + 5 = {cold + 5:.1f}s)")
    print(f"full size again {f(elastic.get('full_size_again'))}s after the host was back (target <= 60 s); "
          f"elastic wall / by hand: {f(elastic['wall'] / rows['by hand']['wall'], '.2f')}x")
    print(f"(run directories under {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
