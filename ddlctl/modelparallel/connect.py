"""Reaching the stage tasks from the program that drives them: their addresses from ``TF_CONFIG``,
the connection, and what TensorFlow takes to move a tensor between them. Imports TensorFlow."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence

from ddlctl.contract.errors import UserError
from ddlctl.task.tfenv import not_listening, quiet_own_retracing

DEFAULT_CONNECT_TIMEOUT_S = 120.0


def cluster_from_env() -> tuple[dict[str, list[str]], str, int]:
    """(cluster, this task's job, its index) from ``TF_CONFIG``."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    cluster = config.get("cluster") or {}
    if not cluster.get("worker"):
        raise UserError("TF_CONFIG names no worker task to place stages on",
                        "run the program with ddlctl launch --strategy model")
    task = config.get("task") or {}
    return cluster, str(task.get("type", "chief")), int(task.get("index", 0))


def wait_for_ports(addresses: Sequence[str], timeout_s: float) -> None:
    """Wait until every ``host:port`` accepts a TCP connection; raises naming the missing ones
    (TensorFlow's connect would hang forever on a task that is down)."""
    missing = not_listening(addresses, timeout_s)
    if missing:
        raise UserError(f"stage task(s) not reachable after {timeout_s:g}s: {', '.join(missing)}",
                        "check that every worker task started (see its output)")


def connect(timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> list[str]:
    """Connect this program to the stage tasks of ``TF_CONFIG``; their device names, in order."""
    import tensorflow as tf

    quiet_own_retracing()  # ddlctl's measurements trace one function per stage: not the program's concern
    cluster, job, index = cluster_from_env()
    wait_for_ports(cluster["worker"], timeout_s)
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster), job_name=job, task_index=index,
                                              make_master_device_default=False)
    return [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(len(cluster["worker"]))]


def _fastest_call(fn, x, repeats: int) -> float:  # noqa: ANN001
    """The fastest of ``repeats`` calls of ``fn(x)`` (after a trace and a warm-up call): the one
    nothing else delayed."""
    fn(x).numpy()
    fn(x).numpy()
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn(x).numpy()
        times.append(time.perf_counter() - start)
    return min(times)


def _chain(tf, pair: Sequence[str | None], n: int) -> Callable:  # noqa: ANN001
    """A function passing its tensor back and forth ``n`` times between the two devices of
    ``pair`` (None: this process's), an op on the receiver each time (the tensor must be there)."""
    import contextlib

    def run(x):  # noqa: ANN001, ANN202
        h = x
        for i in range(n):
            device = pair[i % 2]
            with tf.device(device) if device else contextlib.nullcontext():
                h = h * 1.0001
        return tf.reduce_sum(h[:1])
    return tf.function(run)


def message_costs(devices: Sequence[str], hops: int = 16, repeats: int = 5) -> list[float]:
    """What one message costs each stage task (s): a 4-byte tensor passed back and forth between
    this process and the task ``hops`` times inside one function, per hop (the message and the
    op on its receiver), less the same with 2 hops. Under a CPU quota a task handles messages
    slower (0.8 ms a hop at 0.2 CPU, 0.2 ms at 0.6 here), which the cost model charges to every
    micro-batch's turn on that stage (:func:`ddlctl.modelparallel.planner.messages`)."""
    import tensorflow as tf

    costs = []
    for device in devices:
        with tf.device(device):
            x = tf.random.normal((1,))
        long, short = (_fastest_call(_chain(tf, (None, device), n), x, repeats) for n in (2 + hops, 2))
        costs.append(max(0.0, (long - short) / hops))
    return costs


def measure_link(devices: Sequence[str], message_bytes: int, hops: int = 16,
                 repeats: int = 5) -> tuple[float, float, float]:
    """What TensorFlow itself takes to move a tensor between consecutive stage tasks (its gRPC
    transfer and both tasks' share of it, under whatever CPU limits they run with; a TCP ping is far
    less): ``(latency_s, bandwidth_bps, dispatch_s)``. Each pair of neighbours passes a tensor back
    and forth ``hops`` times inside one function, once with 4 bytes and once with ``message_bytes``
    (a micro-batch's activation); a message costs ``latency + bytes / bandwidth`` (medians over the
    pairs). ``dispatch_s`` is a step's fixed cost: one function that touches every stage once.
    Each function's time is its fastest of ``repeats`` calls: a difference of two medians fell to
    nothing on a loaded machine (a latency of 0), the fastest calls are the ones nothing delayed."""
    import tensorflow as tf

    def touch_all(x):  # noqa: ANN001, ANN202
        outs = []
        for device in devices:
            with tf.device(device):
                outs.append(tf.reduce_sum(x[:1] * 1.0001))
        return tf.add_n(outs)

    latencies, per_byte = [], []
    elements = max(2, int(message_bytes) // 4)
    for pair in zip(devices, devices[1:], strict=False):
        cost = {}
        for size in (1, elements):
            with tf.device(pair[0]):
                x = tf.random.normal((size,))
            cost[size] = max(0.0, (_fastest_call(_chain(tf, pair, 2 + hops), x, repeats)
                                  - _fastest_call(_chain(tf, pair, 2), x, repeats)) / hops)
        latencies.append(cost[1])
        per_byte.append(max(0.0, cost[elements] - cost[1]) / ((elements - 1) * 4))
    # from here, as a step's input
    dispatch = _fastest_call(tf.function(touch_all), tf.random.normal((elements,)), repeats)
    if not latencies:
        return 0.0, float("inf"), dispatch
    latency = sorted(latencies)[len(latencies) // 2]
    seconds_per_byte = sorted(per_byte)[len(per_byte) // 2]
    return latency, (1.0 / seconds_per_byte if seconds_per_byte > 0 else float("inf")), dispatch


