"""Where pipelining pays with the device computing: ``ddlctl profile --strategy one_device`` over
``benchmarks/pipeline_load.py`` (CPU-made batches, a CNN step on the GPU), linear against
pipelined, interleaved repeats, ddlctl's own input/compute verdict for every run.

First the input alone and the step alone are timed (the load's ``--calibrate``): the CNN's width
is the narrowest of ``--widths`` whose step takes at least the input's base cost, and the input's
cost is then raised to about the step's (``--passes``): the case where overlap can gain the most, 2x.
Then, per round: linear; pipelined with one thread (overlap alone: its ceiling is
``compare.overlap_ceiling`` of linear's input share); pipelined with ``--threads`` (overlap and a
parallel map, as tf.data's). Prints each one's median samples/s with the spread, the input share
and verdict (``ddlctl.commands.compare.bound``), the speed-up over linear with its range, GPU utilisation,
and the final losses (the same batches in every mode, so they should agree).

    python3 benchmarks/pipeline_gpu.py [--repeats 3 --steps 150 --batch 256 --threads 4]
    .venv/bin/python benchmarks/pipeline_gpu.py --steps 40 --batch 64 --repeats 2   # a CPU host
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from pipeline_load import load_arguments  # noqa: E402

from ddlctl.commands.compare import bound, overlap_ceiling, speedup_range  # noqa: E402


def load_command(args: argparse.Namespace, *extra: str) -> list[str]:
    """The load's command line with the benchmark's shape."""
    return [sys.executable, str(HERE / "pipeline_load.py"), "--batch", str(args.batch), "--steps",
            str(args.steps), "--width", str(args.width), "--seed", str(args.seed), *extra]


def profiled(args: argparse.Namespace, folder: Path, name: str, extra: list[str]) -> dict:
    """One run under ``ddlctl profile``: its summary's throughput, input share, GPU util and the loss."""
    runs, out = folder / name / "runs", folder / name / "out.json"
    command = [sys.executable, "-m", "ddlctl", "profile", "--strategy", "one_device", "--runs-dir", str(runs),
               "--sample-interval", "0.5", "--", *load_command(args, *extra, "--out", str(out))]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name}: ddlctl profile failed ({done.returncode}):\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    summary = json.loads(next(runs.glob("*/summary.json")).read_text())
    utils = [g["util_mean"] for h in summary["hosts"] for g in h["gpus"] if g.get("util_mean") is not None]
    return {"rate": summary["throughput_samples_per_s"], "input": summary["tasks"][0]["input_fraction"],
            "util": utils[0] if utils else None, "loss": json.loads(out.read_text())["loss"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    load_arguments(parser)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4, help="the parallel map's threads in the last mode")
    parser.add_argument("--passes", type=int, help="the input's cost (default: calibrated to the step's)")
    parser.add_argument("--widths", default="64,128,192,256,384", help="the CNN widths calibration may choose from")
    args = parser.parse_args()
    done = subprocess.run(load_command(args, "--calibrate", args.widths), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"calibration failed:\n{done.stderr[-3000:]}")
    alone = json.loads(done.stdout.strip().splitlines()[-1])
    widths = {int(w): t for w, t in alone["step_s"].items()}
    args.width = min((w for w, t in widths.items() if t >= alone["input_base_s"]), default=max(widths))
    step = widths[args.width]
    passes = args.passes if args.passes is not None else \
        max(0, min(400, round((step - alone["input_base_s"]) / alone["input_per_pass_s"])))
    input_alone = alone["input_base_s"] + passes * alone["input_per_pass_s"]
    print(f"{alone['device']}: step alone " + ", ".join(f"{1e3 * t:.1f} ms (width {w})" for w, t in widths.items()))
    print(f"width {args.width}: step alone {1e3 * step:.1f} ms, input alone {1e3 * input_alone:.1f} ms "
          f"({passes} jitter passes; {1e3 * alone['input_base_s']:.1f} ms + "
          f"{1e3 * alone['input_per_pass_s']:.2f} a pass), batch {args.batch}, {args.steps} steps, "
          f"{args.repeats} interleaved rounds")
    modes = {"linear": ["--execution", "linear"],
             "pipelined, 1 thread": ["--execution", "pipelined", "--threads", "1"],
             f"pipelined, {args.threads} threads": ["--execution", "pipelined", "--threads", str(args.threads)]}
    results: dict[str, list[dict]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="ddlctl-pipeline-gpu-") as root:
        for round_ in range(args.repeats):
            for index, (mode, extra) in enumerate(modes.items()):
                run = profiled(args, Path(root), f"r{round_}m{index}", [*extra, "--passes", str(passes)])
                results[mode].append(run)
    linear = [r["rate"] for r in results["linear"]]
    share = statistics.median(r["input"] for r in results["linear"])
    print(f"{'mode':<22} {'samples/s':>10} {'spread':>17} {'vs linear':>26} {'GPU util':>9}  verdict")
    for mode, runs in results.items():
        rates = [r["rate"] for r in runs]
        median = statistics.median(rates)
        verdict = bound("linear" if mode == "linear" else "pipelined", statistics.median(r["input"] for r in runs))
        ratio = speedup_range(rates, linear) if mode != "linear" else None
        against = "-" if mode == "linear" else f"{median / statistics.median(linear):.2f}x" + (
            f" [{ratio[0]:.2f}-{ratio[1]:.2f}]{' noise' if ratio[2] else ''}" if ratio else "")
        utils = [r["util"] for r in runs if r["util"] is not None]
        util = f"{statistics.median(utils):.0f}%" if utils else "n/a"
        print(f"{mode:<22} {median:>10,.0f} {min(rates):>8,.0f}-{max(rates):<8,.0f} {against:>26} {util:>9}  {verdict}")
    print(f"overlap alone can gain at most {overlap_ceiling(share):.2f}x here (linear's input share {share:.0%})")
    losses = [r["loss"] for runs in results.values() for r in runs]
    print(f"final loss, every run: {min(losses):.4f}-{max(losses):.4f} (the same batches in every mode)")


if __name__ == "__main__":
    main()
