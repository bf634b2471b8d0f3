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
