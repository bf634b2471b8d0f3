"""A program written for one machine (``MirroredStrategy``, or none) started by ``ddlctl launch -s
mwms`` (or as a ps chief): each task trains on its own and none joins the cluster of TF_CONFIG.

What ddlctl sees of such a program is its steps and its port, never listened on; its tensors are
not the subject, so this stand-in steps without TensorFlow (with it, the test's two runs started
three TensorFlow processes more: 15.2 CPU-seconds against 6.0, 2026-11-28)."""

import time

import ddlctl

weight = 1.0
for _ in range(30):
    with ddlctl.step(samples=8):
        weight -= 0.01  # the "model" this task trains alone
        time.sleep(0.02)
print("TRAINED_ALONE", round(weight, 4), flush=True)
