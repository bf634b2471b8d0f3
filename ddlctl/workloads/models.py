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
