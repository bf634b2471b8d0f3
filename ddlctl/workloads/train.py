"""The built-in training program: a custom training loop that runs under every strategy.

Keras 3 ``model.fit`` does not work under ParameterServerStrategy or MultiWorkerMirroredStrategy,
so this is a custom loop: ``ClusterCoordinator.schedule`` for ps, ``strategy.run`` inside a
``tf.function`` otherwise. Every step is written to ``steps.jsonl``; the final loss and accuracy
on a held-out set are printed and written to ``result.json`` in the task directory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from pathlib import Path

from ddlctl.runtime.tfenv import (
    TaskContext,
    min_inter_op_threads,
    quiet_tensorflow_logs,
    task_context,
)
from ddlctl.steps import StepRecorder
from ddlctl.workloads import WORKLOADS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Options of the built-in workload (``ddlctl launch`` passes --workload/--steps/--batch-size)."""
    parser = argparse.ArgumentParser(prog="python -m ddlctl.workloads",
                                     description="ddlctl's built-in training workload")
    parser.add_argument("--workload", choices=WORKLOADS, default="cnn")
    parser.add_argument("--steps", type=int, default=200, help="training steps")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="global batch per step (ps: batch of one scheduled step)")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--log-every", type=int, default=0, help="progress line every N steps")
    parser.add_argument("--slow-task", default=None, metavar="TASK",
                        help="make this task (e.g. worker:1) slow on purpose: a straggler for testing")
    parser.add_argument("--slow-ms", type=float, default=0.0,
                        help="extra milliseconds of input time per step for --slow-task")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("DDLCTL_CHECKPOINT_DIR"),
                        help="where the chief saves checkpoints (and the evaluator reads them)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be at least 1")
    return args


def make_strategy(ctx: TaskContext):
    """The tf.distribute strategy named by ``ctx.strategy``."""
    import tensorflow as tf

    if ctx.strategy == "ps":
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.ParameterServerStrategy(resolver)
    if ctx.strategy == "mwms":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if ctx.strategy == "mirrored":
        return tf.distribute.MirroredStrategy()
    if ctx.strategy == "central_storage":
        return tf.distribute.experimental.CentralStorageStrategy()
    if ctx.strategy == "one_device":
        device = "/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0"
        return tf.distribute.OneDeviceStrategy(device)
    raise SystemExit(f"unknown strategy {ctx.strategy!r}")


class Trainer:
    """Model, optimizer and step function for one strategy."""

    def __init__(self, strategy, args: argparse.Namespace, per_step_batch: int) -> None:
        import keras
        import tensorflow as tf

        from ddlctl.workloads import models

        self.strategy = strategy
        self.args = args
        with strategy.scope():
            keras.utils.set_random_seed(args.seed)
            self.model = getattr(models, args.workload)()
            self.optimizer = keras.optimizers.Adam(args.learning_rate)
            self.optimizer.build(self.model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="none")
        model, optimizer = self.model, self.optimizer

        def gradients(images, labels):
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                loss = tf.nn.compute_average_loss(loss_fn(labels, logits),
                                                  global_batch_size=per_step_batch)
            return loss, tape.gradient(loss, model.trainable_variables)

        def step_fn(images, labels):
            loss, grads = gradients(images, labels)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        def timed_step_fn(images, labels):
            # tf.timestamp() runs when the graph gets there: when the batch was in hand, and
            # when this replica's gradients were ready to be synchronised with the others.
            with tf.control_dependencies([images, labels]):
                ready = tf.timestamp()
            loss, grads = gradients(images, labels)
            with tf.control_dependencies([g for g in grads if g is not None]):
                synced = tf.timestamp()
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss, ready, synced

        @tf.function
        def train_step(iterator):
            images, labels = next(iterator)
            losses = strategy.run(step_fn, args=(images, labels))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

        @tf.function
        def timed_train_step(iterator):
            images, labels = next(iterator)
            losses, ready, synced = strategy.run(timed_step_fn, args=(images, labels))
            local = strategy.experimental_local_results
            return (strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None),
                    tf.reduce_max(tf.stack(local(ready))), tf.reduce_max(tf.stack(local(synced))))

        self.train_step = train_step  # ps: scheduled on workers
        self.timed_train_step = timed_train_step  # synchronous strategies: with arrival times

    def evaluate(self) -> tuple[float, float]:
        """Loss and accuracy on the held-out set."""
        return evaluate(self.model, self.args.seed)


def evaluate(model, seed: int) -> tuple[float, float]:
    """Loss and accuracy of ``model`` on the held-out set of ``seed``."""
    import keras
    import tensorflow as tf

    from ddlctl.workloads.synthetic import eval_batch

    images, labels = eval_batch(seed)
    logits = model(images, training=False)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
    correct = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels)
    return float(loss), float(tf.reduce_mean(tf.cast(correct, tf.float32)))


class Checkpointer:
    """Saves the model every quarter of the run for a side-car evaluator (``--checkpoint-dir``).

    Under mwms every worker must take part in a save; only the chief writes to the shared
    directory, the others to a scratch folder in their task directory.
    """

    def __init__(self, ctx: TaskContext, args: argparse.Namespace, model) -> None:
        import tensorflow as tf

        directory = args.checkpoint_dir if ctx.is_chief else str(Path(ctx.task_dir or ".") / "ckpt-scratch")
        self.manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), directory, max_to_keep=2)
        self.every = max(1, args.steps // 4)

    def maybe_save(self, step: int) -> None:
        if step % self.every == 0:
            self.manager.save(checkpoint_number=step)


def _dataset_fn(args: argparse.Namespace, per_worker_random_ids: bool = False):
    import tensorflow as tf

    from ddlctl.workloads.synthetic import ids_dataset, make_sample_fn

    def dataset_fn(input_context: tf.distribute.InputContext | None = None):
        sample = make_sample_fn(args.seed)
        if per_worker_random_ids:
            # ps: each worker builds its own dataset; random ids keep workers from
            # all reading the same examples in the same order.
            ids = tf.data.Dataset.random().map(lambda x: tf.math.floormod(x, 1 << 40))
            batch = args.batch_size
        else:
            ids = ids_dataset(input_context.input_pipeline_id, input_context.num_input_pipelines)
            batch = input_context.get_per_replica_batch_size(args.batch_size)
        return ids.map(sample).batch(batch, drop_remainder=True).prefetch(2)

    return dataset_fn


def _log(ctx: TaskContext, message: str) -> None:
    print(message, flush=True)


class Progress:
    """A progress line every ``--log-every`` steps, with the rate over that stretch."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.total = args.steps
        self.every = args.log_every or max(1, args.steps // 10)
        self.mark_time = time.monotonic()
        self.mark_samples = 0
        self.samples = 0

    def step(self, step: int, loss: float, samples: int) -> None:
        self.samples += samples
        if step % self.every and step != self.total:
            return
        now = time.monotonic()
        rate = (self.samples - self.mark_samples) / max(now - self.mark_time, 1e-9)
        print(f"step {step}/{self.total} loss {loss:.4f} ({rate:,.0f} samples/s)", flush=True)
        self.mark_time, self.mark_samples = now, self.samples


def train_ps(ctx: TaskContext, args: argparse.Namespace, recorder: StepRecorder) -> Trainer:
    """Coordinator loop: schedule steps on workers, at most two in flight per worker.

    A step's record runs from the previous step's completion to its own, as seen by the
    coordinator, so the records tile the training time and throughput adds up.
    """
    import tensorflow as tf

    strategy = make_strategy(ctx)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    trainer = Trainer(strategy, args, args.batch_size)
    checkpointer = Checkpointer(ctx, args, trainer.model) if args.checkpoint_dir else None
    per_worker_ds = coordinator.create_per_worker_dataset(_dataset_fn(args, per_worker_random_ids=True))
    iterator = iter(per_worker_ds)
    window = 2 * max(1, ctx.num_workers)
    pending: deque = deque()
    progress = Progress(args)
    last_wall, last_mono = time.time(), time.monotonic()
    done = 0
    scheduled = 0
    while done < args.steps:
        while scheduled < args.steps and len(pending) < window:
            pending.append(coordinator.schedule(trainer.train_step, args=(iterator,)))
            scheduled += 1
        loss = float(pending.popleft().fetch())
        now_mono = time.monotonic()
        done += 1
        duration = now_mono - last_mono
        recorder.record(done, last_wall, duration, args.batch_size)
        progress.step(done, loss, args.batch_size)
        last_wall, last_mono = time.time(), now_mono
        if checkpointer is not None:
            checkpointer.maybe_save(done)
    coordinator.join()
    return trainer


def train_synchronous(ctx: TaskContext, args: argparse.Namespace, recorder: StepRecorder,
                      strategy) -> Trainer:
    """mwms and single-host strategies: every step is ``strategy.run`` on all replicas."""
    trainer = Trainer(strategy, args, args.batch_size)
    checkpointer = Checkpointer(ctx, args, trainer.model) if args.checkpoint_dir else None
    dist = strategy.distribute_datasets_from_function(_dataset_fn(args))
    iterator = iter(dist)
    local_samples = args.batch_size // max(1, ctx.num_workers) if ctx.strategy == "mwms" \
        else args.batch_size
    progress = Progress(args)
    slow_s = args.slow_ms / 1000.0 if args.slow_task == ctx.name else 0.0
    for step in range(1, args.steps + 1):
        start_wall, start = time.time(), time.monotonic()
        if slow_s:
            time.sleep(slow_s)  # --slow-task: this worker's input is slow on purpose
        loss_t, ready_t, synced_t = trainer.timed_train_step(iterator)
        loss = float(loss_t)
        duration = time.monotonic() - start
        recorder.record(step, start_wall, duration, local_samples,
                        input_s=max(0.0, float(ready_t) - start_wall),
                        sync_s=max(0.0, float(synced_t) - start_wall))
        progress.step(step, loss, args.batch_size)
        if checkpointer is not None:
            checkpointer.maybe_save(step)
    return trainer


def run_evaluator(ctx: TaskContext, args: argparse.Namespace) -> int:
    """Side-car evaluator: evaluate each new checkpoint the chief writes, until stopped."""
    import tensorflow as tf

    from ddlctl.workloads import models

    if not args.checkpoint_dir:
        _log(ctx, "evaluator: no --checkpoint-dir / DDLCTL_CHECKPOINT_DIR, nothing to evaluate")
        return 0
    model = getattr(models, args.workload)()
    checkpoint = tf.train.Checkpoint(model=model)
    _log(ctx, f"evaluator: watching {args.checkpoint_dir}")
    seen = None
    while True:
        latest = tf.train.latest_checkpoint(args.checkpoint_dir)
        if latest and latest != seen:
            checkpoint.restore(latest).expect_partial()
            loss, accuracy = evaluate(model, args.seed)
            _log(ctx, f"evaluator: {Path(latest).name} loss {loss:.4f} accuracy {accuracy:.4f}")
            seen = latest
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    """Entry point: train under the strategy ddlctl chose, report loss and accuracy."""
    args = parse_args(argv)
    quiet_tensorflow_logs()
    ctx = task_context()
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(min_inter_op_threads(ctx.num_workers))
    if ctx.role == "evaluator":
        return run_evaluator(ctx, args)
    if ctx.strategy == "mwms" and args.batch_size % ctx.num_workers:
        print(f"--batch-size {args.batch_size} must be divisible by the {ctx.num_workers} workers",
              file=sys.stderr)
        return 2
    recorder = StepRecorder.from_env()
    started = time.monotonic()
    with recorder:
        if ctx.strategy == "ps":
            strategy = None
            trainer = train_ps(ctx, args, recorder)
        else:
            strategy = make_strategy(ctx)
            trainer = train_synchronous(ctx, args, recorder, strategy)
    train_time = time.monotonic() - started
    loss, accuracy = trainer.evaluate()
    _log(ctx, f"final loss {loss:.4f} accuracy {accuracy:.4f} "
              f"({args.steps} steps, {train_time:.1f}s)")
    if ctx.task_dir:
        result = {"task": ctx.name, "workload": args.workload, "steps": args.steps,
                  "batch_size": args.batch_size, "loss": loss, "accuracy": accuracy,
                  "train_time_s": train_time}
        Path(ctx.task_dir).mkdir(parents=True, exist_ok=True)
        (Path(ctx.task_dir) / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0
