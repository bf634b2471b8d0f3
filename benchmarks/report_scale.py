"""Report at scale: a generated run directory with 1,000,000 step records and 8 hosts x 8 GPUs x
1 hour of telemetry at 2 Hz, rendered by ``ddlctl report``. Target: at most half the time Python's
json module alone needs to parse those files, and under 1 GiB.

Measures, in one run, side by side: the json-only parse, ``ddlctl report`` (full render) and
``ddlctl report --json``: wall time and peak RSS of each process tree.

    .venv/bin/python benchmarks/report_scale.py [--steps 1000000] [--hosts 8] [--gpus 8] [--hours 1]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ddlctl.contract.telemetry import GPU_FIELDS  # noqa: E402

T0 = 1_760_000_000.0

#: The floor to beat: Python's json module parsing every JSON-lines file of the run, line by line.
JSON_ONLY = ("import json, pathlib, sys\n"
             "for path in pathlib.Path(sys.argv[1]).rglob('*.jsonl'):\n"
             "    with open(path, 'rb') as handle:\n"
             "        records = [json.loads(line) for line in handle if line.strip()]\n")


def generate(root: Path, steps: int, hosts: int, gpus: int, hours: float, hz: float) -> Path:
    run = root / "run-scale"
    tasks_per_host = gpus
    n_tasks = hosts * tasks_per_host
    per_task = steps // n_tasks
    rng = random.Random(0)
    plan_tasks = []
    for h in range(hosts):
        for g in range(tasks_per_host):
            name = f"worker:{h * tasks_per_host + g}"
            plan_tasks.append({"name": name, "host": f"node{h}", "role": "worker"})
            folder = run / "tasks" / name.replace(":", "-")
            folder.mkdir(parents=True)
            t = T0
            lines = []
            for step in range(1, per_task + 1):
                d = 0.2 + rng.random() * 0.02
                lines.append(f'{{"task":"{name}","step":{step},"start_us":{int(t * 1e6)},"duration_s":{d:.6f},'
                             f'"samples":32,"input_s":0.01,"sync_s":0.15}}\n')
                t += d
            (folder / "steps.jsonl").write_text("".join(lines))
    (run / "telemetry").mkdir()
    samples = int(hours * 3600 * hz)
    for h in range(hosts):
        lines = [json.dumps({"type": "hello", "host": f"node{h}", "interval": 1 / hz, "gpu_note": None,
                             "gpu_fields": list(GPU_FIELDS),
                             "gpus": [{"index": i, "name": "H100", "memory_total_bytes": 80 * 2**30}
                                      for i in range(gpus)]}) + "\n"]
        for s in range(samples):  # the agent's format: one array per GPU, in gpu_fields order
            gpu = ",".join(f'[{i},{rng.randint(80, 100)},40,70.5,{60 * 2**30},{80 * 2**30},550.0,1980,60,0,1000,2000]'
                           for i in range(gpus))
            procs = ",".join(f'"worker:{h * gpus + i}":[95.0,4000000000]' for i in range(gpus))
            lines.append(f'{{"type":"sample","t":{T0 + s / hz:.3f},"cpu":80.0,"mem_used":100000000000,'
                         f'"mem_total":500000000000,"net_sent":{s * 1000},"net_recv":{s * 2000},'
                         f'"procs":{{{procs}}},"gpus":[{gpu}],"steps":{{}}}}\n')
        (run / "telemetry" / f"node{h}.jsonl").write_text("".join(lines))
    (run / "plan.json").write_text(json.dumps({"run_id": "scale", "strategy": "mwms", "tasks": plan_tasks,
                                               "cluster": {"hosts": []}, "request": {}}))
    return run


def measure(cmd: list[str]) -> tuple[float, float]:
    """(seconds, peak MiB of the whole process tree: the command and its parsing workers)."""
    start = time.monotonic()
    proc = psutil.Popen(cmd, stdout=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None:
        try:
            tree = [proc, *proc.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.02)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed")
    return seconds, peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--hz", type=float, default=2.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ddlctl-report-bench-"))
    try:
        t = time.monotonic()
        run = generate(root, args.steps, args.hosts, args.gpus, args.hours, args.hz)
        size = sum(p.stat().st_size for p in run.rglob("*") if p.is_file()) / 2**20
        print(f"generated {args.steps:,} step records, {args.hosts}x{args.gpus} GPUs x {args.hours} h at "
              f"{args.hz:g} Hz ({size:,.0f} MiB) in {time.monotonic() - t:.1f}s")
        rows = [("json module only", measure([sys.executable, "-c", JSON_ONLY, str(run)])),
                ("ddlctl report (render)", measure([sys.executable, "-m", "ddlctl", "report", str(run)])),
                ("ddlctl report --json", measure([sys.executable, "-m", "ddlctl", "report", str(run), "--json"]))]
        baseline = rows[0][1][0]
        print(f"{'command':<26} {'seconds':>8} {'peak MiB':>9} {'vs json only':>13} {'vs 1 GiB':>9}")
        for name, (seconds, rss) in rows:
            print(f"{name:<26} {seconds:>8.2f} {rss:>9.0f} {seconds / baseline:>13.2f} {rss / 1024:>9.2f}")
        print("target: ddlctl report at most 0.5 x the json-only parse, under 1 GiB")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
