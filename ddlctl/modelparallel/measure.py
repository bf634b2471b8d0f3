"""``python -m ddlctl.modelparallel.measure --model SPEC --batch-size N --microbatches M``: what the
chief of a ``--strategy model`` job measures in place before it plans, and nothing else: the model
profiled here, each stage task's speed for the model's own step, what a message costs each, the
link between them as TensorFlow moves tensors and a step's dispatch. Written as JSON to
``measured.json`` in the task's folder (``$DDLCTL_TASK_DIR``). ``ddlctl partition --in-place``
runs it as the chief of a short job on the cluster, so that its plans are predicted from the same
measurements as the launched chief's. Imports TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import asdict
from pathlib import Path

from ddlctl.contract import envvars

#: The file the measurements go to, in the task's folder.
MEASURED_FILE = "measured.json"


def main(argv: list[str] | None = None) -> int:
    """Connect to the stage tasks, measure, write :data:`MEASURED_FILE`; 0 on success."""
    parser = argparse.ArgumentParser(prog="python -m ddlctl.modelparallel.measure", description=__doc__)
    parser.add_argument("--model", required=True, help="a built-in workload's model name or MODULE:FUNCTION")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--microbatches", type=int, default=1)
    args = parser.parse_args(argv)

    from ddlctl.task.tfenv import start_tensorflow_quietly

    start_tensorflow_quietly()
    from ddlctl.modelparallel.connect import connect
    from ddlctl.modelparallel.inplace import measure_in_place
    from ddlctl.modelparallel.profile import load_model_factory

    stage_devices = connect()
    model = load_model_factory(args.model, said=False)()  # (its error's traceback in this task's log)
    layers, devices, link = measure_in_place(model, stage_devices, args.batch_size, args.microbatches)
    record = {
        "model": args.model, "batch_size": args.batch_size, "microbatches": args.microbatches,
        "layers": [asdict(layer) for layer in layers],
        "devices": [d.to_dict() for d in devices],
        "link": {"bandwidth_bps": link.bandwidth_bps if math.isfinite(link.bandwidth_bps) else None,
                 "latency_s": link.latency_s, "dispatch_s": link.dispatch_s},
    }
    folder = Path(os.environ.get(envvars.TASK_DIR) or ".")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MEASURED_FILE).write_text(json.dumps(record, indent=1) + "\n")
    print(f"measured in place: {len(layers)} layers, {len(devices)} stage task(s); written to "
          f"{folder / MEASURED_FILE}", flush=True)
    return 0


if __name__ == "__main__":
    import sys

    from ddlctl.contract.errors import UserError

    try:
        code = main()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        code = exc.exit_code
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # TensorFlow's interpreter shutdown adds a second, for nothing
