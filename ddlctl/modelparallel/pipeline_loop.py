"""The built-in workload under model parallelism (``--strategy model``): the chief drives a
pipeline of stage tasks through :mod:`ddlctl.modelparallel`."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from ddlctl.contract import envvars
from ddlctl.contract.errors import UserError
from ddlctl.task.steps import StepRecorder
from ddlctl.task.tfenv import TaskContext
from ddlctl.workloads.trainer import Progress


class _Evaluated:
    """What ``main`` needs of a trained model: its held-out loss and accuracy."""

    def __init__(self, evaluate, input_iterator) -> None:  # noqa: ANN001 - a function, a tf.data iterator
        self.evaluate = evaluate
        self.input_iterator = input_iterator  # dropped only with the process (train.KEPT_UNTIL_EXIT)


def train_model_parallel(ctx: TaskContext, args: argparse.Namespace, recorder: StepRecorder) -> _Evaluated:
    """The chief of ``--strategy model``: the workload's layers as stages on the worker tasks,
    trained with micro-batching; every step recorded."""
    import keras
    import tensorflow as tf

    from ddlctl import modelparallel as mp
    from ddlctl.workloads import models
    from ddlctl.workloads.synthetic import eval_batch, shard_dataset

    if args.batch_size % args.microbatches:
        raise SystemExit(f"--batch-size {args.batch_size} cannot be split into {args.microbatches} micro-batches")
    devices = mp.connect()
    keras.utils.set_random_seed(args.seed)
    model = getattr(models, args.workload)()
    try:
        planned = mp.plan(model, devices, args.batch_size, args.microbatches, args.partition, args.checkpoint_dir,
                          predict=args.predict)
    except UserError as exc:
        raise SystemExit(str(exc)) from None
    counts = planned.counts
    pipeline = mp.Pipeline.from_model(model, devices, counts, args.microbatches,
                                      make_optimizer=lambda: keras.optimizers.Adam(args.learning_rate))
    placement = pipeline.placement()
    for stage in placement:
        print(f"stage {stage['device']}: {len(stage['layers'])} layer(s) {stage['layers'][0]}..{stage['layers'][-1]} "
              f"(variables on {', '.join(stage['variable_devices']) or 'none'})", flush=True)
    # checkpoints: every stage's variables and optimizer slots (read from the stage tasks), in the
    # run's checkpoint folder; a restarted job (every task: a stage holds part of the model) resumes
    saver = pipeline.checkpoints(args.checkpoint_dir) if args.checkpoint_dir else None
    resumed = saver.restore() if saver is not None else 0
    every = args.checkpoint_every or max(1, min(100, args.steps // 4))
    if resumed:
        print(f"resumed from checkpoint {Path(saver.manager.latest_checkpoint).name} at step {resumed} "
              f"(restart {os.environ.get(envvars.RESTART_COUNT, '0')})", flush=True)
    iterator = iter(shard_dataset(args.seed, args.augment, args.batch_size, parallel=args.pipeline,
                                  first_step=resumed))
    progress = Progress(args, resumed)
    for step in range(resumed + 1, args.steps + 1):
        wall, start = time.time(), time.monotonic()
        images, labels, _ = next(iterator)
        ready = time.monotonic()
        loss = pipeline.train_step(images, labels)
        recorder.record(step, wall, time.monotonic() - start, args.batch_size, input_s=ready - start)
        progress.after(step, loss, args.batch_size)
        if saver is not None and (step % every == 0 or step == args.steps):
            saver.save(step)
    if ctx.task_dir:  # where the stages and their work really were (the report's stage table)
        pipeline.save_stages(images, labels, planned, ctx.task_dir)

    def evaluate() -> tuple[float, float]:
        images, labels = eval_batch(args.seed)
        logits = pipeline.predict(images)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
        correct = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels)
        return float(loss), float(tf.reduce_mean(tf.cast(correct, tf.float32)))

    return _Evaluated(evaluate, iterator)
