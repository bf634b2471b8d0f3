"""A ``tf.distribute.Server`` for ps-strategy worker and ps tasks: ``python -m ddlctl.runtime.server``.

It reads its identity from ``TF_CONFIG``, starts the gRPC server and blocks until ddlctl stops it
(a plain server exits on SIGTERM).
"""

from __future__ import annotations

import os
import sys

from ddlctl import envvars
from ddlctl.runtime.tfenv import min_inter_op_threads, quiet_tensorflow_logs, task_context


def profiler_port(base: str | None, role: str, index: int) -> int | None:
    """The port this task serves TensorFlow's profiler on (``$DDLCTL_PROFILER_PORT`` + its index,
    ps tasks + 100 more), or None when the variable is unset or not a port number."""
    if not base or not base.isdigit():
        return None
    return int(base) + index + (100 if role == "ps" else 0)


def main() -> int:
    """Start the server described by TF_CONFIG and join it."""
    quiet_tensorflow_logs()
    ctx = task_context("ps")
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if not resolver.cluster_spec().as_dict():
        print("ddlctl server: TF_CONFIG is missing or has no cluster", file=sys.stderr)
        return 2
    config = tf.compat.v1.ConfigProto(
        inter_op_parallelism_threads=min_inter_op_threads(ctx.num_workers))
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=ctx.role, task_index=ctx.index,
        protocol=resolver.rpc_layer or "grpc", config=config, start=True)
    profiler = profiler_port(os.environ.get(envvars.PROFILER_PORT), ctx.role, ctx.index)
    if profiler:
        tf.profiler.experimental.server.start(profiler)
        print(f"ddlctl server: {ctx.name} serves TensorFlow's profiler on port {profiler}", flush=True)
    print(f"ddlctl server: {ctx.name} listening at {server.target}", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
