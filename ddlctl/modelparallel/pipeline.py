"""The model-parallel pipeline a program trains through (:mod:`ddlctl.modelparallel` says how to use it):
stages placed on their tasks' devices, micro-batches, per-stage backward passes and optimizers; and
:func:`plan`, the layer counts per stage."""


from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ddlctl.contract import envvars
from ddlctl.contract.errors import UserError
from ddlctl.modelparallel.inplace import StagePlan
from ddlctl.modelparallel.profile import model_layers
from ddlctl.modelparallel.stack import Piece, Stack


def plan(model: object, devices: Sequence[str], batch_size: int, microbatches: int = 1,
         partition: str | None = None, checkpoint_dir: str | None = None, predict: bool = True) -> StagePlan:
    """How many of ``model``'s layers each stage task gets, for :meth:`Pipeline.from_model`: the
    plan ``ddlctl launch --partition`` gave (``$DDLCTL_PARTITION``, or ``partition`` as ``"5,5,4"``),
    else the plan an earlier attempt kept in ``checkpoint_dir`` (a restarted job resumes it), else
    the ``greedy`` or the ``optimal`` plan (whichever the cost model predicts faster) for the stage
    tasks as measured from here: the model profiled layer by layer, its whole step timed on every
    stage task, the link between them. ``.counts`` are the counts, ``.how`` says which (``given``,
    ``resumed``, ``greedy``, ``optimal``), ``.predicted`` the cost
    model's step time (printed; ``predict=False`` skips measuring a given plan, and predicts
    nothing)."""
    from ddlctl.modelparallel.inplace import plan_stages

    return plan_stages(model, devices, batch_size, microbatches,
                       partition or os.environ.get(envvars.PARTITION) or None, checkpoint_dir, predict)


def variable_device(variable: object) -> str:
    """Where a variable lives (a Keras variable's, or a ``tf.Variable``'s)."""
    value = getattr(variable, "value", None)
    return str(variable.device if value is None or callable(value) else value.device)  # type: ignore[attr-defined]


def split_counts(counts: Sequence[int], n_layers: int, n_devices: int) -> list[int]:
    """Validate a plan's per-device layer counts against the model and the cluster."""
    counts = [int(c) for c in counts]
    if len(counts) != n_devices:
        raise UserError(f"the partition has {len(counts)} stage(s) but the cluster has {n_devices} device(s)",
                        "plan again for this cluster (ddlctl partition --hosts ...)")
    if sum(counts) != n_layers or min(counts) < 0:
        raise UserError(f"the partition places {sum(counts)} layer(s) but the model has {n_layers}",
                        "plan again for this model (ddlctl partition --model ...)")
    return counts


class Pipeline:
    """A model's layers as stages on devices, trained with micro-batching (see the module doc)."""

    def __init__(self, stages: Sequence[Sequence[object]], devices: Sequence[str], microbatches: int,
                 loss_fn: Callable, make_optimizer: Callable[[], object]) -> None:
        import tensorflow as tf

        self.devices = [d for d, layers in zip(devices, stages, strict=True) if layers]
        self.stages = [list(layers) for layers in stages if layers]
        self.microbatches = max(1, int(microbatches))
        self.loss_fn = loss_fn
        self.variables = [[v for layer in layers for v in layer.trainable_variables] for layers in self.stages]
        self.optimizers = []
        for device, variables in zip(self.devices, self.variables, strict=True):
            with tf.device(device):
                optimizer = make_optimizer()
                if variables:
                    optimizer.build(variables)  # its slots live with the stage's variables
            self.optimizers.append(optimizer)
        self._step = tf.function(self._train_step)
        self._forward = tf.function(self._predict)

    @classmethod
    def from_model(cls, model: object, devices: Sequence[str], counts: Sequence[int], microbatches: int = 1,
                   loss_fn: Callable | None = None, make_optimizer: Callable[[], object] | None = None) -> Pipeline:
        """Copies of ``model``'s layers, ``counts[j]`` of them on ``devices[j]``, built there, with
        the model's initial weights. ``model``: a Keras model (Sequential, or functional taken in
        layer order) or a :class:`Stack` (a list of callables; each stage calls its pieces'
        factories under its device scope)."""
        import keras
        import tensorflow as tf

        layers = model_layers(model)
        counts = split_counts(counts, len(layers), len(devices))
        shape = (None, *model.input_shape[1:])  # type: ignore[attr-defined]
        stages: list[list[object]] = []
        at = 0
        for device, count in zip(devices, counts, strict=True):
            with tf.device(device):
                if isinstance(model, Stack):
                    placed = model.build(at, at + count)
                else:
                    placed = []
                    for layer in layers[at:at + count]:
                        copy = layer.__class__.from_config(layer.get_config())
                        copy.build(shape)
                        shape = copy.compute_output_shape(shape)
                        placed.append(copy)
                for copy, layer in zip(placed, layers[at:at + count], strict=True):
                    if layer.get_weights():
                        copy.set_weights(layer.get_weights())  # same initial values as the model
            stages.append(placed)
            at += count
        loss_fn = loss_fn or keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        return cls(stages, devices, microbatches, loss_fn,
                   make_optimizer or (lambda: keras.optimizers.Adam(1e-3)))

    def placement(self) -> list[dict[str, object]]:
        """Each stage: its device, its layers, and where their variables really are."""
        return [{"device": device, "layers": [layer.name for layer in layers],
                 "variable_devices": sorted({variable_device(v) for v in variables})}
                for device, layers, variables in zip(self.devices, self.stages, self.variables, strict=True)]

    def op_devices(self, x, y, op_type: str = "MatMul") -> dict[str, int]:
        """How many ops of ``op_type`` the traced training step puts on each task (forward and
        backward matrix products should all be on the stages, none on the client)."""
        graph = self._step.get_concrete_function(x, y).graph
        counts: dict[str, int] = {}
        for op in graph.get_operations():
            if op.type == op_type:
                where = op.device.split("/device:")[0] or "(client)"
                counts[where] = counts.get(where, 0) + 1
        return counts

    def stage_times(self, x, repeats: int = 5) -> list[float]:
        """Each stage's own work per step (s): its forward and backward passes over the step's
        micro-batches on its device, its input already there, timed alone, less a no-op call's
        round trip to that device. A pipelined step lasts at least the largest; the rest of a
        stage's step is its bubble (waiting for its neighbours). The weights are not changed.

        Both are the fastest of ``repeats`` calls: other load only ever adds time, and the
        difference of two medians taken on a busy machine can fall to (or below) zero."""
        import tensorflow as tf

        from ddlctl.modelparallel.profile import noop_call

        times = []
        h = x
        for s, (device, layers, variables) in enumerate(zip(self.devices, self.stages, self.variables, strict=True)):
            with tf.device(device):
                here = tf.identity(h)  # the stage's input on its device before the clock starts
            work = tf.function(_stage_work(tf, device, layers, variables, self.microbatches, first=s == 0))
            noop = tf.function(noop_call(tf, device))
            work(here).numpy()
            noop(here).numpy()  # trace and warm up
            spent, idle = [], []
            for _ in range(max(1, repeats)):
                start = time.perf_counter()
                work(here).numpy()
                spent.append(time.perf_counter() - start)
                start = time.perf_counter()
                noop(here).numpy()
                idle.append(time.perf_counter() - start)
            times.append(max(0.0, min(spent) - min(idle)))
            with tf.device(device):
                for layer in layers:
                    here = layer(here, training=False)
            h = here
        return times

    def checkpoints(self, directory: str | None = None, max_to_keep: int = 2) -> Checkpoints | None:
        """Checkpoints of every stage's variables and optimizer slots and of the step, in
        ``directory`` (default ``$DDLCTL_CHECKPOINT_DIR``, the run's folder that outlives restarts:
        a lost stage restarts every task, and the program resumes with :meth:`Checkpoints.restore`).
        None when there is no folder. Each stage task writes its own variables' shard, so stage
        tasks on several hosts need the folder on a shared file system."""
        folder = directory or os.environ.get(envvars.CHECKPOINT_DIR)
        return Checkpoints(self, folder, max_to_keep) if folder else None

    def save_stages(self, x, y, planned: StagePlan | None = None, task_dir: str | None = None) -> Path | None:
        """Write ``stages.json`` into the task folder (``$DDLCTL_TASK_DIR``) for ddlctl's report:
        the plan (``planned``, from :func:`plan`), each stage's placement, where the step's matrix
        products run (traced on the batch ``(x, y)``) and each stage's busy time per step
        (:meth:`stage_times`, timed now: call it after training). The report's "stages" table and
        its predicted-vs-measured line come from it. None when there is no task folder."""
        folder = task_dir or os.environ.get(envvars.TASK_DIR)
        if not folder:
            return None
        counts = [len(layers) for layers in self.stages]
        record = {"partition": planned.counts if planned else counts, "how": planned.how if planned else "given",
                  "microbatches": self.microbatches, "stages": self.placement(),
                  "matmul_ops": self.op_devices(x, y), "busy_s": self.stage_times(x),
                  "predicted": planned.predicted if planned else None}
        path = Path(folder) / "stages.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n")
        return path

    def _train_step(self, x, y):  # noqa: ANN001, ANN202 - tensors in, loss out
        import tensorflow as tf

        m = self.microbatches
        xs, ys = tf.split(x, m), tf.split(y, m)
        grads_of = [[[] for _ in variables] for variables in self.variables]  # [stage][variable][micro-batch]
        total = tf.constant(0.0)
        last = len(self.stages) - 1
        # each stage takes the micro-batches in order (forward k+1 after forward k, backward k+1 after
        # backward k): every micro-batch's forward is ready at once, and an executor that runs them
        # side by side delays the first one's arrival at the next stage (the pipeline's fill)
        forward_done: list = [None] * len(self.stages)
        backward_done: list = [None] * len(self.stages)
        for k in range(m):  # unrolled: the executor overlaps micro-batches across stages
            inputs, outputs, tapes = [], [], []
            h = xs[k]
            for s, (device, layers) in enumerate(zip(self.devices, self.stages, strict=True)):
                with tf.device(device), tf.control_dependencies(_after(forward_done[s])):
                    stage_in = tf.stop_gradient(h)
                    with tf.GradientTape() as tape:
                        tape.watch(stage_in)
                        h = stage_in
                        for layer in layers:
                            h = layer(h, training=True)
                        # the loss of one micro-batch, scaled so that the micro-batches' gradients add up
                        # to the whole batch's mean (no per-micro-batch scaling pass over the gradients)
                        out = tf.reduce_mean(self.loss_fn(ys[k], h)) / m if s == last else h
                forward_done[s] = out
                inputs.append(stage_in)
                outputs.append(out)
                tapes.append(tape)
            total += outputs[last]
            grad = None
            for s in range(last, -1, -1):
                # the first stage's input needs no gradient (for a first Dense layer that is a whole
                # matrix product saved); a stage without variables (Flatten) only passes it on
                targets = [*self.variables[s], inputs[s]] if s > 0 else list(self.variables[s])
                if not targets:
                    continue
                with tf.device(self.devices[s]), tf.control_dependencies(_after(backward_done[s])):
                    grads = tapes[s].gradient(outputs[s], targets, output_gradients=grad)
                    for held, g in zip(grads_of[s], grads, strict=False):
                        held.append(g)
                    grad = grads[-1] if s > 0 else None
                    backward_done[s] = next((g for g in grads if g is not None), backward_done[s])
        for device, optimizer, variables, held in zip(self.devices, self.optimizers, self.variables, grads_of,
                                                      strict=True):
            if not variables:
                continue
            with tf.device(device):  # one pass over the micro-batches' gradients (memory-bound on CPUs)
                grads = [g[0] if len(g) == 1 else tf.add_n(g) for g in held]
                optimizer.apply_gradients(zip(grads, variables, strict=True))
        return total

    def _predict(self, x):  # noqa: ANN001, ANN202
        import tensorflow as tf

        h = x
        for device, layers in zip(self.devices, self.stages, strict=True):
            with tf.device(device):
                for layer in layers:
                    h = layer(h, training=False)
        return h

    def train_step(self, x, y) -> float:  # noqa: ANN001
        """One training step on the batch ``(x, y)``; the mean loss."""
        return float(self._step(x, y))

    def predict(self, x):  # noqa: ANN001, ANN201
        """The model's output for ``x`` (forward through the stages)."""
        return self._forward(x)


class Checkpoints:
    """A pipeline's checkpoints (:meth:`Pipeline.checkpoints`): layers by name (their place in the
    model; a :class:`Stack` piece by its variables), optimizers by stage, and the step."""

    def __init__(self, pipeline: Pipeline, directory: str, max_to_keep: int = 2) -> None:
        import tensorflow as tf

        self.directory = directory
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        layers = {f"layer_{layer.name}": layer.variables if isinstance(layer, Piece) else layer
                  for stage in pipeline.stages for layer in stage}
        self.checkpoint = tf.train.Checkpoint(step=self.step, optimizers=list(pipeline.optimizers), **layers)
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=max_to_keep)

    def restore(self) -> int:
        """Restore the latest checkpoint, if any; the step it was saved at (0 without one)."""
        latest = self.manager.latest_checkpoint
        if not latest:
            return 0
        self.checkpoint.restore(latest).expect_partial()
        return int(self.step.numpy())

    def save(self, step: int) -> str:
        """Save every stage's variables and optimizer slots as of ``step``; the checkpoint's path."""
        self.step.assign(step)
        return str(self.manager.save(checkpoint_number=step))


def _after(done: object) -> list:
    """Control inputs: the op of ``done`` (a tensor, or a sparse gradient, of the stage's previous
    micro-batch), or none."""
    return [] if done is None else [getattr(done, "op", done)]


def _stage_work(tf, device: str, layers: Sequence[object], variables: Sequence[object], microbatches: int,
                first: bool) -> Callable:  # noqa: ANN001 - the tensorflow module
    """A stage's forward and backward passes over ``microbatches`` micro-batches (a scalar out)."""

    def work(t):  # noqa: ANN001, ANN202
        totals = []
        with tf.device(device):
            for part in tf.split(t, microbatches):
                with tf.GradientTape() as tape:
                    tape.watch(part)
                    out = part
                    for layer in layers:
                        out = layer(out, training=True)
                    total = tf.reduce_sum(out)
                targets = [*variables] if first else [*variables, part]
                grads = tape.gradient(total, targets) if targets else []
                totals.append(tf.add_n([tf.reduce_sum(g) for g in grads]) if grads else total)
            return tf.add_n(totals)

    return work
