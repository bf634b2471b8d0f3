"""Where a model-parallel step's time goes: TensorFlow's profiler on every stage task of a real
``--strategy model`` job, as micro-batching changes.

The same emulated devices as ``model_parallel.py`` (root: three stage tasks under cgroup CPU
quotas, 0.6, 0.6 and 0.3 CPUs; a memory cap; the built-in ``deep`` model, batch 512), one given
plan, for each ``--microbatches`` value: the job runs with ``--env DDLCTL_PROFILER_PORT=...`` (each
stage task serves TensorFlow's profiler), and once it steps, ``tf.profiler.experimental.client
.trace`` records ``--trace-ms`` of every stage at once. From the traces (XPlane protobufs, op events
on each task's ``tf_Compute`` threads) it prints, per micro-batch count:

- the chief's predicted and measured step (as ``stages.json`` and ``steps.jsonl`` say);
- per stage: its own work per step timed alone after training (``busy``, what the cost model
  predicts from) and how long it was active per step inside the pipeline (the union of its ops'
  intervals, updates included), so a stage slower in the pipeline than alone shows;
- the time per step when no stage ran any op (the step's boundary: dispatch, results, waits).

    sudo .venv/bin/python benchmarks/stage_trace.py [--partition 5,5,4] [--microbatches 1,4,8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: op events that are the executor's own bookkeeping, not an op's work
NOT_OPS = ("ExecutorState", "ThreadpoolListener", "Memory")


def op_intervals(path: Path) -> list[tuple[float, float]]:
    """(start ms, end ms) of every op a task ran in the trace (one ``.xplane.pb``)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    out = []
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                if names.get(event.metadata_id, "").startswith(NOT_OPS):
                    continue
                start = line.timestamp_ns * 1e-6 + event.offset_ps * 1e-9
                out.append((start, start + event.duration_ps * 1e-9))
    return sorted(out)


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals merged where they overlap."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def traced_run(counts: str, microbatches: int, args: argparse.Namespace, root: Path) -> dict:
    """One job with the profiler on its stage tasks; what the trace and the chief's files say."""
    folder = root / f"m{microbatches}"
    folder.mkdir()
    hosts = folder / "hosts.txt"
    fast, slow = args.quotas.split(",")
    hosts.write_text("localhost roles=chief\n"
                     f"127.0.0.1 roles=worker slots=2 memory={args.memory} cpu_quota={fast}\n"
                     f"::1 roles=worker slots=1 memory={args.memory} cpu_quota={slow}\n")
    job = subprocess.Popen(
        [sys.executable, "-m", "ddlctl", "launch", "-s", "model", "--hosts", str(hosts), "--no-telemetry",
         "--env", f"DDLCTL_PROFILER_PORT={args.port}",
         "--runs-dir", str(folder / "runs"), "--", sys.executable, "-m", "ddlctl.workloads", "--workload", "deep",
         "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--microbatches", str(microbatches),
         "--checkpoint-every", str(args.steps + 1), "--partition", counts],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    steps = None
    while time.monotonic() < deadline and job.poll() is None:  # trace once the job steps
        found = list((folder / "runs").glob("*/tasks/chief-0/steps.jsonl"))
        if found and len(found[0].read_text().splitlines()) > 10:
            steps = found[0]
            break
        time.sleep(0.5)
    if steps is None:
        job.kill()
        raise SystemExit(f"m={microbatches}: the job did not step:\n{job.communicate()[0][-3000:]}")
    stages = len([c for c in counts.split(",") if int(c)])
    services = ",".join(f"grpc://localhost:{args.port + i}" for i in range(stages))
    subprocess.run([sys.executable, "-c", "import sys, tensorflow as tf; tf.profiler.experimental.client.trace("
                    "sys.argv[1], sys.argv[2], int(sys.argv[3]))", services, str(folder / "trace"), str(args.trace_ms)],
                   capture_output=True, check=True)
    output, _ = job.communicate(timeout=600)
    if job.returncode != 0:
        raise SystemExit(f"m={microbatches}: ddlctl launch failed ({job.returncode}):\n{output[-3000:]}")
    run = next((folder / "runs").iterdir())
    records = [json.loads(line) for line in (run / "tasks" / "chief-0" / "steps.jsonl").read_text().splitlines()]
    plan = json.loads((run / "tasks" / "chief-0" / "stages.json").read_text())
    step = statistics.median(r["duration_s"] for r in records[5:]) * 1e3
    traces = sorted((folder / "trace").glob("plugins/profile/*/*.xplane.pb"), key=lambda p: p.stem)
    per_stage = [op_intervals(path) for path in traces]
    every = union([i for ops in per_stage for i in ops])
    span = every[-1][1] - every[0][0]
    idle = sum(b[0] - a[1] for a, b in zip(every, every[1:], strict=False))
    active = [sum(b - a for a, b in union(ops)) for ops in per_stage]
    return {"step": step, "predicted": (plan.get("predicted") or {}).get("step_s", 0) * 1e3,
            "busy": [b * 1e3 for b in plan["busy_s"]], "active": [a / span * step for a in active],
            "idle": idle / span * step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partition", default="5,5,4")
    parser.add_argument("--microbatches", default="1,4,8")
    parser.add_argument("--steps", type=int, default=200, help="steps of each job (the trace falls inside)")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--memory", default="40MiB")
    parser.add_argument("--quotas", default="0.6,0.3", metavar="FAST,SLOW")
    parser.add_argument("--trace-ms", type=int, default=1500)
    parser.add_argument("--port", type=int, default=7700, help="the stage tasks' profiler ports start here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (the stage devices are emulated with cgroup CPU quotas)")
    root = Path(tempfile.mkdtemp(prefix="ddlctl-stage-trace-"))
    print(f"plan [{args.partition}], quotas {args.quotas}, batch {args.batch_size}; per step, in ms")
    print(f"{'m':>2} {'predicted':>9} {'measured':>8} {'no op anywhere':>14}  "
          "per stage: busy alone -> active in the pipeline")
    for m in (int(v) for v in args.microbatches.split(",")):
        got = traced_run(args.partition, m, args, root)
        stages = ", ".join(f"{b:.0f} -> {a:.0f}" for b, a in zip(got["busy"], got["active"], strict=False))
        print(f"{m:>2} {got['predicted']:>9.1f} {got['step']:>8.1f} {got['idle']:>14.1f}  {stages}", flush=True)
    print(f"traces: {root}/m*/trace (TensorBoard's profile plugin opens them)")


if __name__ == "__main__":
    main()
