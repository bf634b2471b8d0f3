"""The built-in training program: custom training loops that run under every strategy.

Keras 3 ``model.fit`` does not work under ParameterServerStrategy or MultiWorkerMirroredStrategy,
so these are custom loops: ``ClusterCoordinator.schedule`` for ps, ``strategy.run`` otherwise.

Three execution modes (the research result ddlctl reproduces: pipelined beats linear):

* **pipelined** (``--execution pipelined``, default): tf.data with parallel map and prefetch
  (AUTOTUNE) feeds ``--steps-per-call`` steps per traced call, so input overlaps with compute
  (ps: each scheduled closure runs that many steps over its own id range with its own tf.data
  pipeline).
* **linear** (``--execution linear``; ``--no-pipeline``): the honest baseline the research
  describes. The same tf.data input, the same steps per call and (ps) the same closures in flight,
  executed without overlap: no prefetch, no parallel map, no tf.data optimisation that would add
  either, so input and compute strictly alternate. Only the overlap differs from pipelined.
* **python-feed** (``--execution python-feed``): each step's batch is built in Python, sample by
  sample (as a Python generator or ``feed_dict`` loop does), and fed to a one-step call (ps: the
  coordinator builds it and ships it with a one-step closure). A strawman, named for what it is.

All modes read exactly the same sample ids at each step (see ``synthetic.step_ids``), so they
train on the same data. Every step is recorded in ``steps.jsonl`` with timestamps taken inside the
graph (``tf.timestamp()``); the final loss and accuracy on a held-out set are printed and written
to ``result.json``. Sharding: under mwms each worker reads its own shard of the id stream; under ps
the coordinator gives every step its own id range, so whichever worker runs it reads ids nobody
else reads (``--record-ids`` prints them from the worker that consumed them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from pathlib import Path

from ddlctl.contract import envvars
from ddlctl.contract.rundir import TASK_RESULT
from ddlctl.contract.strategies import TABLE, facts_of
from ddlctl.diagnose.tfmessages import stale_handle
from ddlctl.modelparallel.pipeline_loop import train_model_parallel
from ddlctl.task.steps import StepRecorder, phase
from ddlctl.task.tfenv import (
    TaskContext,
    cluster_addresses,
    honour_sigterm,
    import_tensorflow,
    min_inter_op_threads,
    not_listening,
    quiet_own_retracing,
    quiet_tensorflow_logs,
    task_context,
)
from ddlctl.workloads import AUGMENTED, DECODED, EXECUTIONS, WORKLOADS
from ddlctl.workloads.synthetic import DECODE
from ddlctl.workloads.trainer import Checkpointer, Pace, Progress, Trainer, evaluate, record_block, step_blocks


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Options of the built-in workload (``ddlctl launch`` passes --workload/--steps/--batch-size)."""
    parser = argparse.ArgumentParser(prog="python -m ddlctl.workloads",
                                     description="ddlctl's built-in training workload")
    parser.add_argument("--workload", choices=WORKLOADS, default="cnn")
    parser.add_argument("--steps", type=int, default=200, help="training steps")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="global batch per step (ps: batch of one step on one worker)")
    parser.add_argument("--execution", choices=EXECUTIONS, default="pipelined",
                        help="pipelined (tf.data parallel map + prefetch), linear (the same input without overlap) "
                             "or python-feed (batches built in Python, one step per call)")
    parser.add_argument("--pipeline", dest="execution", action="store_const", const="pipelined",
                        help="same as --execution pipelined")
    parser.add_argument("--no-pipeline", dest="execution", action="store_const", const="linear",
                        help="same as --execution linear")
    parser.add_argument("--steps-per-call", type=int, default=8,
                        help="steps per traced call, pipelined and linear (ps: per scheduled closure)")
    parser.add_argument("--augment", action=argparse.BooleanOptionalAction, default=None,
                        help="per-sample augmentation in the input pipeline (random crop, flip, brightness, "
                             "contrast: input-heavy); default on for cnn, off for the others")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--epoch-size", type=int, default=0,
                        help="read ids [0, N) once (0: an endless stream); --steps is then N / batch")
    parser.add_argument("--input", choices=("auto", "local", "service"), default="auto",
                        help="where batches are made: local (each trainer's own tf.data pipeline), service (the "
                             "tf.data service ddlctl started: --data-workers N, hosts with roles=data), auto (service "
                             "when ddlctl started one; default)")
    parser.add_argument("--record-ids", action="store_true",
                        help="print the sample ids each step consumed, from the process that consumed them")
    parser.add_argument("--log-every", type=int, default=0, help="progress line every N steps")
    parser.add_argument("--slow-task", default=None, metavar="TASK",
                        help="make this task (e.g. worker:1) slow on purpose: a straggler for testing")
    parser.add_argument("--slow-ms", type=float, default=0.0,
                        help="extra milliseconds of input time per step for --slow-task")
    parser.add_argument("--slow-input-ms", type=float, default=0.0, metavar="MS",
                        help="milliseconds more that --slow-task's input pipeline takes to make each batch (a slow "
                             "map in tf.data: that task waits for its input, input-bound on purpose)")
    parser.add_argument("--min-step-ms", type=float, default=0.0, metavar="MS",
                        help="each step takes at least MS milliseconds: the task sleeps the rest (a block of N steps "
                             "begins at least N x MS after the one before; ps: the chief schedules no faster). "
                             "A steady pace, the same on any machine, at little CPU: for trying restarts and "
                             "elasticity, whose events come by the clock, beside other work (default 0: full speed)")
    parser.add_argument("--microbatches", type=int, default=4,
                        help="model strategy: micro-batches per step (pipelining across the stages)")
    parser.add_argument("--partition", default=os.environ.get(envvars.PARTITION), metavar="N,N,...",
                        help="model strategy: layers per stage task, in order (default $DDLCTL_PARTITION, "
                             "else planned here: greedy or optimal, whichever is predicted faster)")
    parser.add_argument("--no-predict", dest="predict", action="store_false",
                        help="model strategy, with a given --partition: do not measure the stages to predict "
                             "its step time (the measurement takes seconds to tens of seconds at start-up)")
    parser.add_argument("--checkpoint-dir", default=os.environ.get(envvars.CHECKPOINT_DIR),
                        help="where the chief saves checkpoints and every task resumes from "
                             "(the evaluator reads them too); default $DDLCTL_CHECKPOINT_DIR")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="steps between checkpoints (0: a quarter of the run, at most 100)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.steps_per_call < 1 or args.microbatches < 1:
        parser.error("--steps, --batch-size, --steps-per-call and --microbatches must be at least 1")
    if args.epoch_size:
        if args.epoch_size % args.batch_size:
            parser.error("--epoch-size must be a multiple of --batch-size")
        args.steps = args.epoch_size // args.batch_size
    args.pipeline = args.execution == "pipelined"
    if args.execution == "python-feed" or args.slow_task:
        args.steps_per_call = 1  # python-feed: one step per call; a straggler is injected between steps
    if args.augment is None:
        args.augment = args.workload in AUGMENTED
    args.augment = DECODE if args.augment and args.workload in DECODED else int(args.augment)
    if args.input == "auto":
        args.input = "service" if os.environ.get(envvars.DATA_SERVICE) else "local"
    elif args.input == "service" and not os.environ.get(envvars.DATA_SERVICE):
        parser.error("--input service: no tf.data service here (ddlctl starts one with --data-workers N, or for "
                     "hosts with roles=data)")
    return args


def make_strategy(ctx: TaskContext):
    """The tf.distribute strategy named by ``ctx.strategy`` (its class: ``ddlctl.contract.strategies``).
    The process then ends on SIGTERM again (see :func:`~ddlctl.task.tfenv.honour_sigterm`)."""
    import tensorflow as tf

    if ctx.strategy not in TABLE or TABLE[ctx.strategy].tf_class is None:
        raise SystemExit(f"unknown strategy {ctx.strategy!r}")
    name = TABLE[ctx.strategy].tf_class
    if name == "ParameterServerStrategy":
        strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
    elif name == "OneDeviceStrategy":
        strategy = tf.distribute.OneDeviceStrategy("/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0")
    elif name == "CentralStorageStrategy":
        strategy = tf.distribute.experimental.CentralStorageStrategy()
    else:
        strategy = getattr(tf.distribute, name)()
    # (a checkpoint folder: SIGTERM asks for a checkpoint at the next step, then the end; on one host,
    # and where ddlctl says so: --min-workers, a Slurm time limit, where it TERMs a ps chief first)
    honour_sigterm(bool(os.environ.get(envvars.CHECKPOINT_DIR)) and (
        not facts_of(ctx.strategy).multi_host or os.environ.get(envvars.STOP_CHECKPOINTS) == "1"))
    return strategy


def train_to_the_end(trainer: Trainer, iterator, recorder: StepRecorder, progress: Progress, pace: Pace,  # noqa: ANN001
                     checkpointer: Checkpointer | None, resumed: int) -> None:
    """Steps until the tf.data service's epoch is read (``--epoch-size`` with ``--input service``):
    it gives each batch to the trainer that asks first, so their shares differ; under mwms a step
    runs while any trainer has a batch (one without takes an empty batch), so every batch is trained
    on once, whoever read it."""
    step = resumed
    while True:
        pace.wait(1)
        has, *figures = trainer.run_optional(iterator)
        if not bool(has):
            return
        loss, samples = record_block(recorder, step + 1, figures)
        step += 1
        progress.after(step, loss, samples)
        if checkpointer is not None:
            checkpointer.after(step)


def train_synchronous(ctx: TaskContext, args: argparse.Namespace, recorder: StepRecorder, strategy) -> Trainer:
    """mwms and the single-host strategies: every step is ``strategy.run`` on all replicas."""

    from ddlctl.task import balance
    from ddlctl.workloads import synthetic
    from ddlctl.workloads.synthetic import make_batch_fn, shard_dataset, slice_ids, step_ids

    shards = max(1, ctx.num_workers) if facts_of(ctx.strategy).batch_split else 1
    shard = ctx.index if facts_of(ctx.strategy).batch_split else 0
    local_batch = args.batch_size // shards
    split = None
    if facts_of(ctx.strategy).batch_split and balance.enabled():
        # --balance speed: this worker's share by measured speed, a contiguous slice of each global batch
        equal = args.batch_size // shards or 1
        split = balance.split(strategy, args.batch_size, calibrate=calibration_step(args, equal),
                              samples_per_call=equal)
        local_batch = split.local_batch
        relative = balance.relative(split.speeds)
        print(f"balance: {split.local_batch} of {args.batch_size} examples per step on this worker "
              f"(worker speeds {relative}, {split.source})", flush=True)
    trainer = Trainer(strategy, args, args.batch_size)
    checkpointer = Checkpointer(ctx, args, trainer.model, trainer.optimizer, strategy) if args.checkpoint_dir else None
    resumed = checkpointer.restore() if checkpointer is not None else 0
    progress = Progress(args, resumed)
    slow_s = args.slow_ms / 1000.0 if args.slow_task == ctx.name else 0.0
    slow_input_s = args.slow_input_ms / 1000.0 if args.slow_task == ctx.name else 0.0
    pace = Pace(args.min_step_ms)
    feed = args.execution == "python-feed"
    if not feed:
        import tensorflow as tf

        # linear: no device prefetch either (the distributed iterator would otherwise fetch the
        # next batch while a step runs)
        options = None if args.pipeline else tf.distribute.InputOptions(experimental_fetch_to_device=False)
        if split is not None:
            # --balance speed: one pipeline for the whole run, its slice of each step from a schedule
            # that a re-split changes a few steps ahead
            schedule = synthetic.SliceSchedule(split.offset, split.local_batch, resumed)
            iterator = iter(strategy.distribute_datasets_from_function(lambda _ictx: synthetic.slice_dataset(
                args.seed, args.augment, args.batch_size, schedule, args.epoch_size or None, parallel=args.pipeline,
                first_step=resumed), options=options))
        elif args.input == "service":  # the data workers make every batch; each goes to one trainer
            iterator = iter(strategy.distribute_datasets_from_function(lambda ictx: synthetic.service_dataset(
                args.seed, args.augment, ictx.get_per_replica_batch_size(args.batch_size), parallel=args.pipeline,
                epoch_size=args.epoch_size or None), options=options))
            if args.epoch_size:  # read to its end: the trainers' shares of it differ
                train_to_the_end(trainer, iterator, recorder, progress, pace, checkpointer, resumed)
                trainer.input_iterator = iterator  # (see KEPT_UNTIL_EXIT)
                return trainer
        else:
            iterator = iter(strategy.distribute_datasets_from_function(lambda ictx: shard_dataset(
                args.seed, args.augment, ictx.get_per_replica_batch_size(args.batch_size), ictx.input_pipeline_id,
                ictx.num_input_pipelines, args.epoch_size or None, parallel=args.pipeline, first_step=resumed,
                delay_s=slow_input_s),
                options=options))
    else:
        make_batch = make_batch_fn(args.seed, args.augment)
        replicas = strategy.num_replicas_in_sync // shards
    # --balance speed: the split again from the speeds the workers show while training (a
    # calibration is a few calls of a step alone; this is the real thing), first after a short
    # block, then while a re-split still pays for itself
    rebalance = balance.Rebalancer(args.steps, resumed) if split is not None and split.source != "equal" else None
    for first, count in step_blocks(args.steps, args.steps_per_call, resumed,
                                (lambda: rebalance.due) if rebalance is not None else None):
        computes = rebalance.computes if rebalance is not None else None
        pace.wait(count)
        wall = time.time()
        if slow_s:
            time.sleep(slow_s)  # --slow-task: this worker's input is slow on purpose
        if not feed:
            figures = trainer.run_block(iterator, tf.constant(count))
            loss, samples = record_block(recorder, first + 1, figures, start_override=wall if slow_s else None,
                                          computes=computes)
        else:
            ids = (step_ids(first, local_batch, shard, shards) if split is None
                   else slice_ids(first, args.batch_size, split.offset, split.local_batch))
            images, labels, ids = make_batch(ids)

            def value_fn(vctx, images=images, labels=labels, ids=ids, batch=local_batch):
                part = batch // replicas
                r = vctx.replica_id_in_sync_group % replicas
                return images[r * part:(r + 1) * part], labels[r * part:(r + 1) * part], ids[r * part:(r + 1) * part]

            values = strategy.experimental_distribute_values_from_function(value_fn)
            loss, samples = record_block(recorder, first + 1, trainer.run_batch(*values), start_override=wall,
                                          computes=computes)
        progress.after(first + count, loss, samples)
        if rebalance is not None and first + count == rebalance.due:
            before = split.batches
            split = rebalance.check(strategy, split, first + count, ahead=0 if feed else schedule.notice(first + count))
            if split.batches != before:
                local_batch = split.local_batch
                if not feed and not schedule.change(split.offset, split.local_batch, rebalance.effective):
                    print(f"balance: warning: this worker's input pipeline had begun step {rebalance.effective + 1} "
                          "before the re-split reached it; that step read the old slice", flush=True)
                relative = balance.relative(split.speeds)
                print(f"balance: {split.local_batch} of {args.batch_size} examples per step on this worker from "
                      f"step {rebalance.effective + 1} (decided after step {first + count}: speeds while training "
                      f"{relative}; were {before})", flush=True)
            elif rebalance.comparisons == 1 and rebalance.compared:
                relative = balance.relative(rebalance.compared)
                reason = {"close enough": f"within {balance.RESPLIT_MIN_GAIN:.0%} of the split by these speeds",
                          "would not pay for itself": "a re-split would not pay for itself in the steps left"}
                print(f"balance: the split stays after step {first + count} (speeds while training {relative}: "
                      f"{reason.get(rebalance.verdict, rebalance.verdict)})", flush=True)
        if checkpointer is not None:
            checkpointer.after(first + count)
    if not feed:
        trainer.input_iterator = iterator  # dropped only with the process (see KEPT_UNTIL_EXIT)
    return trainer


def calibration_step(args: argparse.Namespace, batch: int):  # noqa: ANN201 - a function
    """One local training step of the workload's model on ``batch`` examples from its own input
    pipeline, with no synchronisation: what ``--balance speed`` times on every worker."""
    import keras
    import tensorflow as tf

    from ddlctl.workloads import models
    from ddlctl.workloads.synthetic import shard_dataset

    model = getattr(models, args.workload)()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    iterator = iter(shard_dataset(args.seed + 1, args.augment, batch, parallel=args.pipeline))

    @tf.function
    def step():  # noqa: ANN202
        images, labels, _ = next(iterator)
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        return tf.add_n([tf.reduce_sum(g) for g in grads])

    return lambda: step().numpy()


#: How often a ps block whose closure failed on a worker is scheduled again before the chief gives up.
MAX_BLOCK_RETRIES = 3
# the ps chief waits up to this long for its workers and ps to listen before connecting, then
# connects anyway (TensorFlow waits for tasks still down; gRPC retries at least every second)
PEERS_WAIT_S = 2.0


def train_ps(ctx: TaskContext, args: argparse.Namespace, recorder: StepRecorder) -> Trainer:
    """Coordinator loop: schedule blocks of steps on workers, at most two in flight per worker.

    Step ``k`` reads ids ``[k * batch, (k + 1) * batch)`` whichever worker runs it: pipelined and
    linear, the closure gets its first id and runs its own tf.data pipeline (prefetching or not);
    python-feed, the coordinator generates the batch and ships it with a one-step closure.
    """
    served = args.input == "service" and not args.epoch_size and args.execution != "python-feed"
    if args.input == "service" and not served:
        print("--input service: not under ps with --epoch-size or python-feed: local input", flush=True)
    import tensorflow as tf

    from ddlctl.workloads import synthetic
    from ddlctl.workloads.synthetic import make_batch_fn, step_ids

    # connect as soon as the workers and ps listen (not at gRPC's next reconnect attempt)
    not_listening(cluster_addresses(ctx.role, ctx.index), PEERS_WAIT_S)
    strategy = make_strategy(ctx)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    trainer = Trainer(strategy, args, args.batch_size)
    checkpointer = Checkpointer(ctx, args, trainer.model, trainer.optimizer, strategy) if args.checkpoint_dir else None
    resumed = checkpointer.restore() if checkpointer is not None else 0
    make_batch = make_batch_fn(args.seed, args.augment) if args.execution == "python-feed" else None
    window = 2 * max(1, ctx.num_workers)
    pending: deque = deque()
    progress = Progress(args, resumed)
    planned = list(step_blocks(args.steps, args.steps_per_call, resumed))
    scheduled = 0
    done = 0
    failed: dict[int, int] = {}

    # --input service: each worker reads the tf.data service's batches (each to one worker, none twice)
    per_worker = iter(coordinator.create_per_worker_dataset(lambda: synthetic.service_dataset(
        args.seed, args.augment, args.batch_size, parallel=args.pipeline))) if served else None

    def schedule_once(first: int, count: int):  # noqa: ANN202 - a RemoteValue
        if per_worker is not None:
            return coordinator.schedule(trainer.run_block, args=(per_worker, tf.constant(count)))
        if make_batch is None:
            return coordinator.schedule(trainer.run_range, args=(tf.constant(first * args.batch_size, tf.int64),
                                                                 tf.constant(count)))
        return coordinator.schedule(trainer.run_batch, args=make_batch(step_ids(first, args.batch_size)))

    def schedule(first: int, count: int):  # noqa: ANN202 - a RemoteValue
        # A closure that failed on a worker since the last call is raised here, once, and what was
        # queued is cancelled (fetched as CancelledError: scheduled again below). A worker kept
        # across a chief's restart failed one so, handing its result to the new chief ("Unable to
        # parse request"): that block is fetched with the same error and scheduled again too.
        retries = 0
        while True:
            try:
                return schedule_once(first, count)
            except (tf.errors.InternalError, tf.errors.InvalidArgumentError) as exc:
                retries += 1
                if not stale_handle(str(exc)) or retries > MAX_BLOCK_RETRIES:
                    raise
                # this block was queued, then cancelled with the rest; a worker may have taken it first
                # (running closures are not cancelled) and read its examples: said, as a block run twice
                print(f"a block failed on a worker that outlived the chief it ran for ({type(exc).__name__}): "
                      f"the queued blocks are scheduled again; block at step {first + 1} scheduled again (a worker "
                      "may have run it already)", flush=True)

    pace = Pace(args.min_step_ms)
    while done < len(planned):
        while scheduled < len(planned) and len(pending) < window:
            first, count = planned[scheduled]
            pace.wait(count)
            pending.append((first, count, schedule(first, count)))
            scheduled += 1
        first, count, remote = pending.popleft()
        try:
            figures = remote.fetch()
        except (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError,
                tf.errors.InvalidArgumentError, tf.errors.InternalError) as exc:
            # The block ran, but its results lived on a worker that is gone: run it again
            # (at-least-once, as the coordinator does for closures that had not finished). A worker
            # restarted in place answers for the old one's results with InvalidArgumentError
            # ("Unable to find the relevant tensor remote_handle"), seen under load: the same case;
            # so is a kept worker that could not hand its result to a restarted chief (InternalError).
            if isinstance(exc, (tf.errors.InvalidArgumentError, tf.errors.InternalError)):
                failed[first] = failed.get(first, 0) + 1
                if not stale_handle(str(exc)) or failed[first] > MAX_BLOCK_RETRIES:
                    raise
            print(f"block at step {first + 1} lost with its worker ({type(exc).__name__}): scheduling it again",
                  flush=True)
            pending.appendleft((first, count, schedule(first, count)))
            continue
        if figures is None:
            # The closure failed after its values were set (seen once after a chief restart: an
            # InternalError copying them back); TensorFlow's RemoteValue then fetches None instead
            # of raising. Run the block again, a few times at most.
            failed[first] = failed.get(first, 0) + 1
            if failed[first] > MAX_BLOCK_RETRIES:
                raise RuntimeError(f"the block at step {first + 1} failed {failed[first]} times on the workers "
                                   "(see the errors above)")
            print(f"block at step {first + 1} came back without results (a worker-side error): scheduling it "
                  "again", flush=True)
            pending.appendleft((first, count, schedule(first, count)))
            continue
        loss, samples = record_block(recorder, first + 1, figures)
        done += 1
        progress.after(first + count, loss, samples)
        if checkpointer is not None:
            checkpointer.after(first + count)
    coordinator.join()
    return trainer


def run_evaluator(ctx: TaskContext, args: argparse.Namespace) -> int:
    """Side-car evaluator: evaluate each new checkpoint the chief writes, until stopped."""
    import tensorflow as tf

    from ddlctl.workloads import models

    if not args.checkpoint_dir:
        print("evaluator: no --checkpoint-dir / DDLCTL_CHECKPOINT_DIR, nothing to evaluate", flush=True)
        return 0
    model = getattr(models, args.workload)()
    checkpoint = tf.train.Checkpoint(model=model)
    print(f"evaluator: watching {args.checkpoint_dir}", flush=True)
    seen = None
    while True:
        latest = tf.train.latest_checkpoint(args.checkpoint_dir)
        if latest and latest != seen:
            checkpoint.restore(latest).expect_partial()
            loss, accuracy = evaluate(model, args.seed)
            print(f"evaluator: {Path(latest).name} loss {loss:.4f} accuracy {accuracy:.4f}", flush=True)
            seen = latest
        time.sleep(0.5)


#: What must never be dropped before the process ends: freeing a distributed input iterator waits
#: for its input threads to wind down, 1-4 s of idle time measured at the end of every run and
#: restart (``python -m ddlctl.workloads`` ends with os._exit, which frees nothing).
KEPT_UNTIL_EXIT: list = []


def main(argv: list[str] | None = None) -> int:
    """Entry point: train under the strategy ddlctl chose, report loss and accuracy."""
    args = parse_args(argv)
    quiet_tensorflow_logs()
    quiet_own_retracing()
    ctx = task_context()
    tf = import_tensorflow()
    tf.config.threading.set_inter_op_parallelism_threads(min_inter_op_threads(ctx.num_workers))
    if ctx.role == "evaluator":
        return run_evaluator(ctx, args)
    from ddlctl.task import balance

    if facts_of(ctx.strategy).batch_split and args.batch_size % ctx.num_workers and not balance.enabled():
        print(f"--batch-size {args.batch_size} must be divisible by the {ctx.num_workers} workers",
              file=sys.stderr)
        return 2
    recorder = StepRecorder.from_env()
    recorder.total = args.steps
    started = time.monotonic()
    with recorder:
        if facts_of(ctx.strategy).asynchronous:
            trainer = train_ps(ctx, args, recorder)
        elif facts_of(ctx.strategy).stages:
            trainer = train_model_parallel(ctx, args, recorder)
        else:
            trainer = train_synchronous(ctx, args, recorder, make_strategy(ctx))
    train_time = time.monotonic() - started
    KEPT_UNTIL_EXIT.append(trainer)
    with phase("eval"):
        loss, accuracy = trainer.evaluate()
    mode = args.execution
    print(f"final loss {loss:.4f} accuracy {accuracy:.4f} ({args.steps} steps, {train_time:.1f}s, "
          f"{args.workload}, {mode})", flush=True)
    if ctx.task_dir:
        ran = getattr(trainer, "strategy", None)  # the tf.distribute strategy object (model parallelism: none)
        result = {"task": ctx.name, "strategy": type(ran).__name__ if ran is not None else "pipeline",
                  "workload": args.workload, "pipeline": args.pipeline,
                  "execution": args.execution, "steps": args.steps,
                  "batch_size": args.batch_size, "loss": loss, "accuracy": accuracy, "train_time_s": train_time}
        Path(ctx.task_dir).mkdir(parents=True, exist_ok=True)
        (Path(ctx.task_dir) / TASK_RESULT).write_text(json.dumps(result, indent=1) + "\n")
    return 0
