"""How long after a task stalls ddlctl names it, per kind of hang, with default settings.

Each kind runs a real localhost cluster with ddlctl's defaults (adaptive hang thresholds, no
restarts), stalls one task for real (SIGSTOP, or the task hangs itself in its own code: see
``tests/programs/hang_kinds.py``), and reads ``outcome.json``'s hang record: whom ddlctl blamed,
the threshold and rule that applied, and when. Printed per kind: the culprit expected and named,
the time from the stall to the root-cause line, and the threshold next to it. Target: every kind
named right within 90 s of the stall on this 2-core machine.

    .venv/bin/python benchmarks/hang_bench.py [--kinds ps-stopped,lock,...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ddlctl.testing.faults import wait_for

ROOT = Path(__file__).resolve().parent.parent
HANG_KINDS = str(ROOT / "tests" / "programs" / "hang_kinds.py")
BUILTIN = ("--", sys.executable, "-m", "ddlctl.workloads", "--steps", "1000000")


@dataclass(frozen=True)
class Kind:
    """One kind of hang: how to launch, which task stalls and how."""

    name: str
    args: tuple[str, ...]
    culprit: str
    stop_after: tuple[str, int] | None = None  # (task folder, steps): then SIGSTOP the culprit
    says: str | None = None  # the culprit hangs itself and prints this first
    env: tuple[str, ...] = ()


KINDS = {
    "ps-stopped": Kind("ps worker stopped (SIGSTOP)", ("-s", "ps", *BUILTIN), "worker:1", ("chief-0", 60)),
    "mwms-stopped": Kind("mwms worker stopped in the all-reduce", ("-s", "mwms", *BUILTIN), "worker:1",
                         ("worker-0", 60)),
    "mwms-peer-steps": Kind("mwms worker stopped, its peer steps on", ("-s", "mwms", "--", sys.executable, HANG_KINDS),
                            "worker:1", ("worker-1", 30), env=("HANG_KIND=local",)),
    "lock": Kind("deadlock in a Keras callback (mwms)", ("-s", "mwms", "--", sys.executable, HANG_KINDS), "worker:1",
                 says="worker:1 hangs now", env=("HANG_KIND=lock",)),
    "spin": Kind("busy loop in user code (mwms)", ("-s", "mwms", "--", sys.executable, HANG_KINDS), "worker:1",
                 says="worker:1 hangs now", env=("HANG_KIND=spin",)),
    "pipe": Kind("blocking read of a pipe (mwms)", ("-s", "mwms", "--", sys.executable, HANG_KINDS), "worker:1",
                 says="worker:1 hangs now", env=("HANG_KIND=pipe",)),
    "stage-stopped": Kind("model-parallel stage stopped", ("-s", "model", "--workers", "2", "--", sys.executable, "-m",
                                                          "ddlctl.workloads", "--workload", "deep", "--steps",
                                                          "1000000"), "worker:1", ("chief-0", 20)),
}


def measure(key: str, kind: Kind, root: Path) -> dict:
    """One run of ``kind``: the stall, the root-cause line on ddlctl's stderr, then its hang record
    (a ps worker hung without restarts leaves the job going on degraded: it is stopped with Ctrl-C)."""
    runs = root / key
    runs.mkdir(parents=True, exist_ok=True)
    env_args = [a for pair in kind.env for a in ("--env", pair)]
    args = list(kind.args)
    split = args.index("--")
    command = [sys.executable, "-m", "ddlctl", "launch", "--runs-dir", str(runs), "--no-telemetry", *args[:split],
               *env_args, *args[split:]]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT,
                            env={**os.environ, "NO_COLOR": "1", "COLUMNS": "250"})
    said: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: said.extend((time.time(), line.decode(errors="replace"))
                                                         for line in proc.stderr), daemon=True)
    reader.start()
    try:
        run_dir = wait_for(lambda: next((p for p in runs.iterdir() if p.is_dir()), None), 60, "the run directory")
        folder = kind.culprit.replace(":", "-")
        if kind.stop_after is not None:
            task, steps = kind.stop_after
            path = run_dir / "tasks" / task / "steps.jsonl"
            wait_for(lambda: path.exists() and path.read_bytes().count(b"\n") >= steps, 300, f"{steps} steps")
            pid = int(json.loads((run_dir / "tasks" / folder / "pid.json").read_text())["task_pid"])
            os.kill(pid, signal.SIGSTOP)
        else:
            log = run_dir / "tasks" / folder / "output.log"
            wait_for(lambda: log.exists() and kind.says.encode() in log.read_bytes(), 300, repr(kind.says))
        stalled = time.time()
        named = wait_for(lambda: next((t for t, line in list(said) if " hung (" in line), None)
                         or (proc.poll() is not None and float("nan")), 600, "the culprit named")
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    outcome = json.loads((run_dir / "outcome.json").read_text())
    hang = (outcome.get("hangs") or [{}])[0]
    return {"kind": kind.name, "expected": kind.culprit, "named": hang.get("culprit"), "exit": code,
            "detected_s": round(named - stalled, 1), "threshold_s": hang.get("threshold_s"), "rule": hang.get("rule"),
            "why": hang.get("why")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.kinds.split(","):
            row = measure(key, KINDS[key], Path(tmp))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(f"{'kind':42} {'expected':9} {'named':9} {'right':5} {'stall->named s':>14} {'threshold s':>11}  rule")
    for r in rows:
        right = "yes" if r["named"] == r["expected"] else "NO"
        detected = "-" if r["detected_s"] is None else f"{r['detected_s']:.1f}"
        threshold = "-" if not r["threshold_s"] else f"{r['threshold_s']:.0f}"
        print(f"{r['kind']:42} {r['expected']:9} {r['named'] or '-':9} {right:5} {detected:>14} {threshold:>11}  "
              f"{r['rule']}")
    worst = max((r["detected_s"] or float("inf")) for r in rows)
    ok = all(r["named"] == r["expected"] for r in rows) and worst <= 90
    print(f"\nslowest: {worst:.1f}s (target <= 90 s, every culprit right): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
