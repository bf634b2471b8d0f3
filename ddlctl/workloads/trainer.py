"""What every loop of the built-in workload shares: the model and its traced steps (:class:`Trainer`),
checkpoints that outlive restarts, progress lines, and step records per block of steps."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from ddlctl.contract import envvars
from ddlctl.contract.rundir import TASK_CHECKPOINT_COPY
from ddlctl.task.flops import record_model_flops
from ddlctl.task.steps import StepRecorder, phase
from ddlctl.task.tfenv import STOP_ASKED, TaskContext, should_stop


class Trainer:
    """Model, optimizer and the traced step functions for one strategy.

    Every traced function returns, per step, the loss and four timestamps taken in the graph:
    start, input ready, gradients ready for synchronisation, end.
    """

    def __init__(self, strategy, args: argparse.Namespace, per_step_batch: int) -> None:
        import keras
        import tensorflow as tf

        from ddlctl.workloads import models
        from ddlctl.workloads.synthetic import range_dataset

        self.strategy = strategy
        self.args = args
        with strategy.scope():
            keras.utils.set_random_seed(args.seed)
            self.model = getattr(models, args.workload)()
            self.optimizer = keras.optimizers.Adam(args.learning_rate)
            self.optimizer.build(self.model.trainable_variables)
        record_model_flops(self.model)  # flops.json: the report's achieved FLOP/s and MFU
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        model, optimizer, record_ids = self.model, self.optimizer, args.record_ids
        is_ps = isinstance(strategy, tf.distribute.ParameterServerStrategy)

        def replica_step(images, labels, ids):
            # tf.timestamp() runs when the graph gets there: once the batch is in hand, and once
            # this replica's gradients are ready to be synchronised with the others.
            with tf.control_dependencies([images, labels]):
                ready = tf.timestamp()
            if record_ids:
                tf.print("ddlctl-ids", ids, summarize=-1, output_stream=sys.stderr)
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                loss = tf.nn.compute_average_loss(loss_fn(labels, logits), global_batch_size=per_step_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            with tf.control_dependencies([g for g in grads if g is not None]):
                synced = tf.timestamp()
            # a fence: the synchronisation (inside apply_gradients) starts after the timestamp, so
            # sync_s - input_s is this replica's compute and the rest of the step its wait + all-reduce
            with tf.control_dependencies([synced]):
                grads = [None if g is None else tf.identity(g) for g in grads]
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss, ready, synced

        def one_step(images, labels, ids):
            """A step in cross-replica context: (loss, start, ready, synced, end, samples)."""
            start = tf.timestamp()
            losses, ready, synced = strategy.run(replica_step, args=(images, labels, ids))
            local = strategy.experimental_local_results
            loss = strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
            # the step ends once its update is done: a timestamp alone is not ordered after it (under
            # mwms it ran right after the gradients, before the all-reduce), a read of a variable is
            # (automatic control dependencies order the ops on one resource as written). Not under
            # ps, where the variables live on the ps tasks and a read is a round trip.
            done = [] if is_ps else [tf.convert_to_tensor(v) for v in model.trainable_variables]
            with tf.control_dependencies([loss, *done]):
                end = tf.timestamp()
            # the examples this task's replicas took (as read: a --balance speed re-split changes it)
            samples = tf.add_n([tf.shape(x, out_type=tf.int32)[0] for x in local(images)])
            return (loss, start, tf.reduce_max(tf.stack(local(ready))), tf.reduce_max(tf.stack(local(synced))),
                    end, samples)

        def block(batches, steps):
            """Run ``steps`` steps over an iterator of batches, collecting per-step figures (``steps``
            is a tensor: a shorter last block reuses the traced function instead of tracing again).
            One in-graph loop, no Python round trip per step; written as a ``tf.while_loop`` so that
            tracing needs no autograph (converting it cost ~0.3 CPU-s at every task start)."""
            steps = tf.cast(steps, tf.int32)
            figures = (tf.TensorArray(tf.float32, size=steps), *(tf.TensorArray(tf.float64, size=steps)
                       for _ in range(4)), tf.TensorArray(tf.int32, size=steps))

            def body(i, losses, starts, readies, synceds, ends, counts):
                start = tf.timestamp()
                images, labels, ids = next(batches)
                loss, _, ready, synced, end, samples = one_step(images, labels, ids)
                return (i + 1, losses.write(i, loss), starts.write(i, start), readies.write(i, ready),
                        synceds.write(i, synced), ends.write(i, end), counts.write(i, samples))

            _, *written = tf.while_loop(lambda i, *_: i < steps, body, (tf.constant(0), *figures))
            return tuple(array.stack() for array in written)

        # ps: a closure also says which worker ran it (read on that worker), so work is attributed
        attribute = is_ps

        def attributed(figures):
            return (*figures, executing_task()) if attribute else figures

        @tf.function(autograph=False)
        def run_batch(images, labels, ids):
            return attributed(one_step(images, labels, ids))

        @tf.function(autograph=False)
        def run_block(iterator, steps):
            return attributed(block(iterator, steps))

        @tf.function(autograph=False)
        def run_range(first_id, steps):
            """ps (pipelined, linear): a closure reads its own id range through its own tf.data pipeline."""
            dataset = range_dataset(args.seed, args.augment, args.batch_size, first_id,
                                    tf.cast(steps, tf.int64) * args.batch_size, parallel=args.pipeline)
            return attributed(block(iter(dataset), steps))

        @tf.function(autograph=False)
        def run_optional(iterator):
            """One step of a finite dataset read to its end (the tf.data service's epoch, shared out
            first come, first served): (has a batch, its figures). Under mwms "has a batch" is every
            worker's together: the step runs while any has one (those without take an empty one)."""
            optional = iterator.get_next_as_optional()
            none = (tf.constant(0.0), *(tf.constant(0.0, tf.float64) for _ in range(4)), tf.constant(0))
            return tf.cond(optional.has_value(), lambda: (tf.constant(True), *one_step(*optional.get_value())),
                           lambda: (tf.constant(False), *none))

        self.run_batch, self.run_block, self.run_range = run_batch, run_block, run_range
        self.run_optional = run_optional

    def evaluate(self) -> tuple[float, float]:
        """Loss and accuracy on the held-out set."""
        return evaluate(self.model, self.args.seed)


def executing_task():  # -> tf.Tensor (string scalar)
    """In a graph: the ``DDLCTL_TASK`` of the process that runs the op ("" when unknown), read from
    ``/proc/self/environ`` on that process's host. Under ps a scheduled function runs on whichever
    worker the coordinator picked, and this is how the coordinator learns which one it was."""
    import tensorflow as tf

    environ = tf.io.read_file("/proc/self/environ")
    pattern = r"(?s)^(?:.*\x00)?" + envvars.TASK + r"=([^\x00]*).*$"
    return tf.where(tf.strings.regex_full_match(environ, pattern),
                    tf.strings.regex_replace(environ, pattern, r"\1"), tf.constant(""))


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
    """Saves model, optimizer and step every ``--checkpoint-every`` steps into the run's checkpoint
    folder (``$DDLCTL_CHECKPOINT_DIR``, which outlives restarts) and resumes from the latest one.

    Under mwms every worker must take part in a save; only the chief writes to the shared folder,
    the others to a scratch folder in their task directory. Every task restores from the shared
    folder (ddlctl makes it the same path on every host). A side-car evaluator reads it too.
    """

    def __init__(self, ctx: TaskContext, args: argparse.Namespace, model, optimizer, strategy=None) -> None:  # noqa: ANN001
        import tensorflow as tf

        self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=self.step)
        self.shared = args.checkpoint_dir
        directory = self.shared if ctx.is_chief else str(Path(ctx.task_dir or ".") / TASK_CHECKPOINT_COPY)
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=2)
        self.every = args.checkpoint_every or max(1, min(100, args.steps // 4))
        self.next, self.last = self.every, args.steps  # (the last step saved too: a run resumed there is done)
        # (checkpoints on SIGTERM: the mwms workers' SIGTERMs arrive apart, or one host's alone, and a
        # save is every worker's: at each block's end they agree whether any was asked to stop)
        self.agreeing = strategy if ctx.strategy == "mwms" and os.environ.get(envvars.STOP_CHECKPOINTS) == "1" \
            else None

    def restore(self) -> int:
        """Resume from the latest checkpoint of the shared folder; the step it was taken at (0: none)."""
        import tensorflow as tf

        latest = tf.train.latest_checkpoint(self.shared)
        if not latest:
            return 0
        self.checkpoint.restore(latest).expect_partial()
        step = int(self.step.numpy())
        self.next = step + self.every
        print(f"resumed from checkpoint {Path(latest).name} at step {step} "
              f"(restart {os.environ.get(envvars.RESTART_COUNT, '0')})", flush=True)
        return step

    def after(self, step: int) -> None:
        """Step ``step`` done: save every ``--checkpoint-every`` steps, at the last, and when asked
        to stop (SIGTERM: a preemption, Slurm's time limit, ddlctl's stop), then end (exit 143)."""
        stop = should_stop(self.agreeing) if self.agreeing is not None else bool(STOP_ASKED)
        if step >= self.next or step == self.last or stop:
            with phase("checkpoint"):
                self.step.assign(step)
                self.manager.save(checkpoint_number=step)
            self.next = step + self.every
        if stop:
            print(f"checkpoint at step {step} on SIGTERM: stopping", flush=True)
            sys.stderr.flush()
            os._exit(143)


class Progress:
    """A progress line every ``--log-every`` steps, with the rate over the last ``window_s`` seconds
    (at least: results that arrive in bursts, as ps closures do, would otherwise show absurd rates)."""

    def __init__(self, args: argparse.Namespace, start: int = 0, window_s: float = 2.0) -> None:
        self.total = args.steps
        self.every = args.log_every or max(1, args.steps // 10)
        self.next = (start // self.every + 1) * self.every
        self.window_s = window_s
        self.marks: deque[tuple[float, int]] = deque([(time.monotonic(), 0)])
        self.samples = 0

    def after(self, step: int, loss: float, samples: int) -> None:
        now = time.monotonic()
        self.samples += samples
        self.marks.append((now, self.samples))
        while len(self.marks) > 2 and now - self.marks[1][0] >= self.window_s:
            self.marks.popleft()  # keep the newest mark that is at least window_s old
        if step < self.next and step != self.total:
            return
        since, counted = self.marks[0]
        rate = (self.samples - counted) / max(now - since, 1e-9)
        print(f"step {step}/{self.total} loss {loss:.4f} ({rate:,.0f} samples/s)", flush=True)
        while self.next <= step:
            self.next += self.every


def record_block(recorder: StepRecorder, first_step: int, figures, start_override: float | None = None,
                  computes: list[float] | None = None) -> tuple[float, int]:
    """Write one record per step of a block of (loss, start, ready, synced, end, samples[, worker])
    figures (tensors or arrays; scalars for a one-step block; ``worker``: who ran the block, under
    ps); the last loss and the examples of the block. ``computes`` gets each step's compute time
    (start to gradients ready)."""
    import numpy as np

    worker = None
    if len(figures) == 7:
        worker = bytes(np.asarray(figures[6]).item()).decode("utf-8", "replace") or None
        figures = figures[:6]
    losses, starts, readies, synceds, ends, counts = (np.atleast_1d(np.asarray(f)) for f in figures)
    for i in range(len(losses)):
        start = start_override if (start_override is not None and i == 0) else float(starts[i])
        recorder.record(first_step + i, start, float(ends[i]) - start, int(counts[i]),
                        input_s=max(0.0, float(readies[i]) - start), sync_s=max(0.0, float(synceds[i]) - start),
                        worker=worker)
        if computes is not None:
            computes.append(max(0.0, float(synceds[i]) - float(starts[i])))
    return float(losses[-1]), int(counts.sum())


class Pace:
    """``--min-step-ms``: blocks of steps begun no faster than ``ms`` milliseconds a step (a block
    of N steps at least N x ``ms`` after the one before; the task sleeps the rest)."""

    def __init__(self, ms: float) -> None:
        self.step_s = max(0.0, ms) / 1000.0
        self.next = 0.0

    def wait(self, count: int) -> None:
        """Sleep until the next block of ``count`` steps may begin."""
        if not self.step_s:
            return
        now = time.monotonic()
        if now < self.next:
            time.sleep(self.next - now)
            now = self.next
        self.next = now + count * self.step_s


def step_blocks(total: int, size: int, start: int = 0, stop: Callable[[], int | None] | None = None):
    """(0-based first step, number of steps) covering steps ``start``..``total`` in blocks of ``size``
    that end where the blocks of an uninterrupted run end (so runs report progress at the same
    steps), and also at ``stop()`` (asked before each block: a step count where the caller must
    act, e.g. compare speeds; None: nowhere)."""
    step = start
    while step < total:
        end = min(total, step + size - step % size)
        due = stop() if stop is not None else None
        if due is not None and step < due < end:
            end = due
        yield step, end - step
        step = end
