"""``ddlctl.data``: a training program's input through the tf.data service ddlctl started
(``--data-workers N``, hosts with ``roles=data``), or unchanged when there is none, so the same
program runs with and without.

    dataset = ddlctl.data.distribute(dataset)              # each element to one trainer, once
    dataset = ddlctl.data.distribute(dataset, "parallel_epochs")   # each data worker: a whole epoch

Modes (TensorFlow's, docs/strategies.md says what each guarantees): ``distributed_epoch`` (sharding
DYNAMIC: the data workers split the dataset's elements among themselves as they go, and the
trainers share what they make: one epoch is every element once, at most once when a data worker
fails); ``parallel_epochs`` (OFF: every data worker makes the whole dataset, the trainers share
those epochs). Apply it to the dataset *before* batching for the trainers' own pipelines to batch,
or after: the service carries whatever elements it is given. The job's name ties every trainer of
the run (and a trainer started again) to the same job.
"""

from __future__ import annotations

import os

from ddlctl.contract import envvars

MODES = ("distributed_epoch", "parallel_epochs")


def service() -> str | None:
    """The dispatcher's address ddlctl gave this task (``grpc://host:port``; None: no data service)."""
    return os.environ.get(envvars.DATA_SERVICE) or None


def distribute(dataset, mode: str = "distributed_epoch", job_name: str | None = None):  # noqa: ANN001, ANN201
    """``dataset`` read through the data service when ddlctl runs one (else ``dataset`` itself)."""
    if mode not in MODES:
        raise ValueError(f"ddlctl.data.distribute: mode {mode!r}: expected one of {', '.join(MODES)}")
    address = service()
    if address is None:
        return dataset
    import tensorflow as tf

    policy = tf.data.experimental.service.ShardingPolicy
    return dataset.apply(tf.data.experimental.service.distribute(
        processing_mode=policy.DYNAMIC if mode == "distributed_epoch" else policy.OFF, service=address,
        job_name=job_name or f"ddlctl-{os.environ.get(envvars.RUN_ID, 'run')}"))
