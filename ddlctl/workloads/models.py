"""Keras 3 models of the built-in workloads."""

from __future__ import annotations

from ddlctl.workloads.synthetic import CHANNELS, CLASSES, IMAGE_SIZE


def cnn():
    """A small convolutional classifier for the synthetic images."""
    import keras

    return keras.Sequential([
        keras.Input((IMAGE_SIZE, IMAGE_SIZE, CHANNELS)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(CLASSES),
    ])


def mlp():
    """A wide multi-layer perceptron: light compute, many parameters (~2.8 M): communication-heavy."""
    import keras

    return keras.Sequential([
        keras.Input((IMAGE_SIZE, IMAGE_SIZE, CHANNELS)),
        keras.layers.Flatten(),
        keras.layers.Dense(1024, activation="relu"),
        keras.layers.Dense(1024, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])


def deep(depth: int = 12, width: int = 512):
    """A deep multi-layer perceptron for model parallelism: ``depth`` equal Dense layers of
    ``width`` units (~0.26 M parameters each, ~3 MiB with Adam's two slots; He initialisation so
    that the depth still trains), so that a memory limit per device forces a split and the layers
    can be spread over many devices."""
    import keras

    return keras.Sequential([
        keras.Input((IMAGE_SIZE, IMAGE_SIZE, CHANNELS)),
        keras.layers.Flatten(),
        *[keras.layers.Dense(width, activation="relu", kernel_initializer="he_normal", name=f"dense_{i}")
          for i in range(depth)],
        keras.layers.Dense(CLASSES, name="logits"),
    ])


def heavy():
    """cnn's model; the workload's input decodes every image (``ddlctl.workloads.DECODED``)."""
    return cnn()
