"""ddlctl: launch and profile TensorFlow distributed training on many machines.

What a training program imports: these functions, and :mod:`ddlctl.modelparallel`. The rest of the
package is the command line and what it runs (docs/layout.md).

Kept import-light on purpose: ``ddlctl --help`` must not pull in TensorFlow or NVML.
"""

__version__ = "0.1.0"
__all__ = ["beat", "data", "declare_flops", "keras_callback", "phase", "set_total_steps", "should_stop", "step"]

from ddlctl.task import data  # ``ddlctl.data.distribute(dataset)``: input through ddlctl's tf.data service


def step(samples: int | None = None, input_s: float | None = None):  # noqa: ANN201 - a context manager
    """Time one step of a custom training loop: ``with ddlctl.step(samples=n): ...``; ``as timer``
    then ``timer.input_done()`` once the batch is in hand gives the report the step's input share
    (see :func:`ddlctl.task.steps.step`)."""
    from ddlctl.task.steps import step as _step

    return _step(samples=samples, input_s=input_s)


def phase(name: str):  # noqa: ANN201 - a context manager
    """Time a phase that is not a training step: ``with ddlctl.phase("checkpoint"): save()``
    (``"checkpoint"`` or ``"eval"``); the report's time by cause counts it (see :func:`ddlctl.task.steps.phase`)."""
    from ddlctl.task.steps import phase as _phase

    return _phase(name)


def beat(kind: str = "eval") -> None:
    """Tell ddlctl the program is at work outside its training steps (``kind``: "eval", a batch of
    an evaluation; "train"): call it in a long loop that takes no step, and the hang watch counts
    it as progress (at most one a second is kept; see :func:`ddlctl.task.steps.beat`). ddlctl's
    ``model.fit`` hook beats by itself."""
    from ddlctl.task.steps import beat as _beat

    _beat(kind)


def should_stop(strategy: object = None) -> bool:
    """Whether ddlctl asked this task to stop (a preemption, Slurm's time limit under ``submit
    --requeue``, ``ddlctl stop``): then save a checkpoint and exit. Call it after each step (block):
    the first call makes SIGTERM only ask. Under MultiWorkerMirroredStrategy pass the strategy and
    call it at the same point on every worker: they agree, and all save at the same step (see
    :func:`ddlctl.task.tfenv.should_stop`)."""
    from ddlctl.task.tfenv import should_stop as _should_stop

    return _should_stop(strategy)


def set_total_steps(total: int) -> None:
    """Tell ddlctl how many steps this program will run, so ``launch`` and ``profile`` show a
    progress bar with an ETA (``$DDLCTL_TOTAL_STEPS`` does the same without code)."""
    from ddlctl.task.steps import set_total_steps as _set

    _set(total)


def declare_flops(train_flops_per_sample: float, dtype: str = "float32") -> None:
    """Tell ddlctl the model FLOPs one training sample costs (forward and backward), for MFU in the
    report when ddlctl cannot count them from a Keras model (see :func:`ddlctl.task.flops.declare_flops`);
    ``dtype``: the precision of the matrix products ("float32", "bfloat16", "float16"...)."""
    from ddlctl.task.flops import declare_flops as _declare

    _declare(train_flops_per_sample, dtype)


def keras_callback(batch_size: int | None = None, keras_module: object = None):  # noqa: ANN201
    """A Keras callback that records every training step (``model.fit(..., callbacks=[...])``);
    for Keras 3 or tf-keras, whichever ``tf.keras`` is (see :mod:`ddlctl.task.instrument.keras`)."""
    from ddlctl.task.instrument.keras import step_timer

    return step_timer(batch_size=batch_size, keras_module=keras_module)
