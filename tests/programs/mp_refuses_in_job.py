"""A model for ``ddlctl partition --model mp_refuses_in_job:build`` that builds here but not inside
a launched job (where ``DDLCTL_TASK`` is set): the failure path of ``partition --in-place``."""

import os


def build():  # noqa: ANN201
    import keras

    if os.environ.get("DDLCTL_TASK"):
        raise RuntimeError("mp_refuses_in_job: this model is not built inside a job")
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="dense_a"),
                             keras.layers.Dense(2, name="dense_b")])
