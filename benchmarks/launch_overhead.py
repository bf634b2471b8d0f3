"""Launch overhead: a parameter-server job (chief + 2 workers + 1 ps) under ``ddlctl launch`` vs a
hand-written launcher that writes TF_CONFIG and starts the same four processes, in one run.

The program is the same for both: the chief runs ``python -m ddlctl.workloads --steps N`` (a custom
ps training loop, without checkpoints), workers and the ps run a ``tf.distribute.Server``. The hand
launcher is what a person writes without ddlctl: pick four free ports, start the servers and the
chief with their TF_CONFIG, wait for the chief, kill the servers. ddlctl runs it as its built-in
workload (``ddlctl launch -s ps --steps N``, the README's main job). Wall time is measured from
starting the launcher to its exit, for interleaved rounds (hand, ddlctl, ddlctl --no-telemetry,
and the same program given as a command after ``--``, which gets TF_USE_LEGACY_KERAS=1 for
model.fit) so drift hits all alike; medians and ratios are printed, with where ddlctl's extra time
goes (from its run folder: first step, last step, exit). Target: ddlctl / hand <= 1.05 with
telemetry on.

    .venv/bin/python benchmarks/launch_overhead.py [--rounds 5] [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVER = ("import json, os, tensorflow as tf\n"
          "c = json.loads(os.environ['TF_CONFIG'])\n"
          "tf.distribute.Server(tf.train.ClusterSpec(c['cluster']), job_name=c['task']['type'],\n"
          "                     task_index=c['task']['index'], protocol='grpc', start=True).join()\n")


# what ddlctl's built-in workload passes by default, given to the other launchers too
WORKLOAD_ARGS = ("--workload", "cnn", "--batch-size", "64", "--execution", "pipelined")


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def hand_launch(steps: int, folder: Path) -> tuple[float, dict[str, float]]:
    """The launcher a person writes by hand: TF_CONFIG per task, four processes, wait, kill. (The
    chief records its steps into a folder, as under ddlctl, to compare the phases.)"""
    started = time.monotonic()
    ports = free_ports(4)
    cluster = {"chief": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}", f"localhost:{ports[2]}"],
               "ps": [f"localhost:{ports[3]}"]}
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    def spawn(role: str, index: int, argv: list[str]) -> subprocess.Popen:
        config = json.dumps({"cluster": cluster, "task": {"type": role, "index": index}})
        log = (folder / f"{role}-{index}.log").open("wb")
        return subprocess.Popen(argv, env={**env, "TF_CONFIG": config}, stdout=log, stderr=subprocess.STDOUT)

    servers = [spawn("worker", 0, [sys.executable, "-c", SERVER]), spawn("worker", 1, [sys.executable, "-c", SERVER]),
               spawn("ps", 0, [sys.executable, "-c", SERVER])]
    env["DDLCTL_TASK_DIR"] = str(folder / "tasks" / "chief-0")
    env["DDLCTL_TASK"] = "chief:0"
    chief = spawn("chief", 0, [sys.executable, "-m", "ddlctl.workloads", *WORKLOAD_ARGS, "--steps", str(steps)])
    code = chief.wait()
    for server in servers:
        server.kill()
        server.wait()
    if code != 0:
        raise SystemExit(f"hand-launched chief failed (exit {code}); see {folder}")
    wall = time.monotonic() - started
    return wall, phases(folder, started, wall)


def ddlctl_launch(steps: int, folder: Path, telemetry: bool, command: bool = False) -> tuple[float, dict[str, float]]:
    """``ddlctl launch`` of the built-in workload, or (``command``) of the same program after ``--``."""
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    program = (["--", sys.executable, "-m", "ddlctl.workloads", *WORKLOAD_ARGS, "--steps", str(steps),
                "--checkpoint-dir", ""] if command
               else ["--steps", str(steps), "--env", "DDLCTL_CHECKPOINT_DIR="])
    done = subprocess.run([sys.executable, "-m", "ddlctl", "launch", "-s", "ps", "--workers", "2", "--ps", "1",
                           "--runs-dir", str(folder), "--telemetry" if telemetry else "--no-telemetry", *program],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"ddlctl launch failed (exit {done.returncode}): {done.stderr[-2000:]}")
    (run_dir,) = [p for p in folder.iterdir() if p.is_dir()]
    return wall, phases(run_dir, started, wall)


def phases(run_dir: Path, started_mono: float, wall: float) -> dict[str, float]:
    """Seconds from ddlctl's start to: the chief's first step, its last step's end (from the
    step records' wall clock, mapped with the offset measured at the end)."""
    offset = time.time() - time.monotonic()  # wall = mono + offset (good to well under 1 ms here)
    t0 = started_mono + offset
    records = [json.loads(line) for line in (run_dir / "tasks" / "chief-0" / "steps.jsonl").read_text().splitlines()]
    first = records[0]["start_us"] / 1e6 - t0
    last = max(r["start_us"] / 1e6 + r["duration_s"] for r in records) - t0
    return {"first_step": first, "last_step_end": last, "after_training": wall - last}


KINDS = {"hand": "hand-written launcher", "on": "ddlctl launch", "off": "ddlctl --no-telemetry",
         "command": "ddlctl, program after --"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ddlctl-overhead-bench-"))
    walls: dict[str, list[float]] = {kind: [] for kind in KINDS}
    split_of: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    for kind in ("hand", "ddlctl"):
        warm = root / f"warm-up-{kind}"
        warm.mkdir()
        hand_launch(args.steps, warm) if kind == "hand" else ddlctl_launch(args.steps, warm, True)
    for i in range(args.rounds):
        for kind in list(KINDS) if i % 2 == 0 else list(reversed(KINDS)):
            folder = root / f"{kind}-{i}"
            folder.mkdir()
            if kind == "hand":
                wall, split = hand_launch(args.steps, folder)
            else:
                wall, split = ddlctl_launch(args.steps, folder, kind != "off", command=kind == "command")
            walls[kind].append(wall)
            split_of[kind].append(split)
        print(f"round {i + 1}: " + "  ".join(f"{label} {walls[kind][-1]:.2f}s" for kind, label in KINDS.items()),
              flush=True)
    median = {kind: statistics.median(walls[kind]) for kind in KINDS}
    print(f"ps job (chief + 2 workers + 1 ps, {args.steps} steps), median of {args.rounds} interleaved rounds:")
    for kind, label in KINDS.items():
        ratio = "" if kind == "hand" else f"   ratio {median[kind] / median['hand']:.3f}x"
        print(f"  {label:<26} {median[kind]:6.2f} s{ratio}{' (target <= 1.05)' if kind == 'on' else ''}")
    print("  (a command after -- gets TF_USE_LEGACY_KERAS=1 so that model.fit works under ps; this program "
          "imports Keras 3, which then loads both Kerases)")
    print("  seconds (medians)          " + "".join(f"{label[:22]:>24}" for label in KINDS.values()))
    for key, label in (("first_step", "start to first step"), ("last_step_end", "start to last step's end"),
                       ("after_training", "last step's end to exit")):
        figures = [statistics.median(p[key] for p in split_of[kind]) for kind in KINDS]
        print(f"    {label:<24}" + "".join(f"{f:24.2f}" for f in figures))
    print(f"runs: {root}")


if __name__ == "__main__":
    main()
