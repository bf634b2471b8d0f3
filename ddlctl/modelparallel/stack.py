"""A model given as a list of callables rather than a Keras model, for model parallelism.

Each entry is a *factory*: a function without arguments that returns the callable of one piece of
the model (``h -> h``): a Keras layer, a ``tf.Module``, or a plain function, closures over
``tf.Variable`` s included. ddlctl calls a piece's factory under the device scope of the stage it is
placed on, then calls the piece once on a sample input (lazily built layers create their weights
then), so every variable the piece creates lives on that stage. Its trainable variables are its
``trainable_variables`` when it has them (Keras layers, ``tf.Module``), else every trainable
``tf.Variable`` its factory and first call created (seen through ``tf.variable_creator_scope``).
Create a piece's variables inside its factory: a variable made elsewhere stays where it was made.

Stateless pieces still need a factory: ``lambda: tf.nn.relu``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

from ddlctl.contract.errors import UserError


class Piece:
    """One built piece of a :class:`Stack`: its callable, its trainable variables, its output shape;
    the interface the planner and :class:`ddlctl.modelparallel.Pipeline` use of a Keras layer."""

    def __init__(self, name: str, fn: Callable, variables: Sequence[object], output_shape: tuple,
                 takes_training: bool, all_variables: Sequence[object] | None = None) -> None:
        self.name = name
        self.fn = fn
        self.trainable_variables = list(variables)
        #: every variable of the piece, non-trainable ones included (what a checkpoint keeps)
        self.variables = list(all_variables) if all_variables is not None else list(variables)
        self.output_shape = output_shape
        self.takes_training = takes_training

    def __call__(self, h, training: bool = False):  # noqa: ANN001, ANN204 - a tensor in and out
        return self.fn(h, training=training) if self.takes_training else self.fn(h)

    def compute_output_shape(self, _shape: tuple) -> tuple:
        """The output shape (batch dimension None), as found when the piece was built."""
        return self.output_shape

    def get_weights(self) -> list:
        """The values of the trainable variables, in order."""
        return [v.numpy() for v in self.trainable_variables]

    def set_weights(self, values: Sequence[object]) -> None:
        """Assign ``values`` (from :meth:`get_weights` of a piece built by the same factory)."""
        for variable, value in zip(self.trainable_variables, values, strict=True):
            variable.assign(value)


class Stack:
    """A model as factories of its pieces, in order, and its input shape (without the batch
    dimension). Built once here on construction (the reference copy: profiled by ``ddlctl
    partition``, and the initial weights every placed copy starts from)."""

    def __init__(self, factories: Sequence[Callable[[], Callable]], input_shape: Sequence[int],
                 names: Sequence[str] | None = None) -> None:
        self.factories = list(factories)
        if not self.factories:
            raise UserError("the Stack has no pieces", "give it one factory per piece of the model")
        for i, factory in enumerate(self.factories):
            if not callable(factory):
                raise UserError(f"piece {i} of the Stack is a {type(factory).__name__}, not a factory",
                                "give a function without arguments that returns the piece, e.g. lambda: tf.nn.relu")
        self.names = ([str(n) for n in names] if names is not None
                      else [f"piece_{i}" for i in range(len(self.factories))])
        if len(self.names) != len(self.factories) or len(set(self.names)) != len(self.names):
            raise UserError(f"the Stack has {len(self.factories)} piece(s) but names {self.names}",
                            "give one unique name per piece, or none")
        self.input_shape = (None, *(int(d) for d in input_shape))
        self.layers = self.build()

    @property
    def trainable_variables(self) -> list:
        """The reference copy's trainable variables."""
        return [v for piece in self.layers for v in piece.trainable_variables]

    def build(self, start: int = 0, stop: int | None = None) -> list[Piece]:
        """Pieces ``start:stop``, built under the caller's device scope (their variables there)."""
        import tensorflow as tf

        stop = len(self.factories) if stop is None else stop
        shape = self.input_shape if start == 0 else self.layers[start - 1].output_shape
        built = []
        for i in range(start, stop):
            built.append(_build_piece(tf, self.names[i], self.factories[i], shape))
            shape = built[-1].output_shape
        return built

    def clone(self) -> Stack:
        """Another copy of the whole model, built under the caller's device scope (fresh weights)."""
        return Stack(self.factories, self.input_shape[1:], self.names)


def _build_piece(tf, name: str, factory: Callable, shape: tuple) -> Piece:  # noqa: ANN001 - the tensorflow module
    created: list = []

    def record(next_creator, **kwargs):  # noqa: ANN001, ANN003, ANN202
        variable = next_creator(**kwargs)
        created.append(variable)
        return variable

    try:
        with tf.variable_creator_scope(record):
            fn = factory()
            if not callable(fn):
                raise UserError(f"the factory of piece {name!r} returned a {type(fn).__name__}, not a callable",
                                "return the piece's function, layer or module")
            takes_training = _takes_training(fn)
            sample = tf.zeros((1, *shape[1:]))
            out = fn(sample, training=False) if takes_training else fn(sample)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: name the piece and the input
        raise UserError(f"piece {name!r} failed on an input of shape {shape}: {type(exc).__name__}: {exc}",
                        "check the piece's factory and the Stack's input_shape") from None
    variables = getattr(fn, "trainable_variables", None)
    if variables is None:
        variables = [v for v in created if getattr(v, "trainable", True)]
    every = getattr(fn, "variables", None)
    return Piece(name, fn, variables, (None, *tuple(out.shape)[1:]), takes_training,
                 list(every) if every is not None and not callable(every) else created)


def _takes_training(fn: Callable) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "training" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
