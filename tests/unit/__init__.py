"""The unit lane: no process, no TensorFlow (``pytest tests/unit``)."""
