"""Deterministic synthetic image classification data, generated inside TensorFlow.

Sample ``i`` of seed ``s`` is a pure function of ``(s, i)``: its label is drawn with a stateless
RNG and its image is that class's fixed smooth template plus Gaussian noise. The class signal is
learnable (accuracy rises far above the 1/``CLASSES`` chance level) and nothing is downloaded.
"""

from __future__ import annotations

IMAGE_SIZE = 24
CHANNELS = 3
CLASSES = 8
SIGNAL = 0.3  # template amplitude relative to unit noise
EVAL_OFFSET = 1 << 40  # sample ids of the held-out set start here


def templates(seed: int):  # -> tf.Tensor [CLASSES, H, W, C]
    """One smooth pattern per class, the same on every process for a given seed."""
    import tensorflow as tf

    coarse = tf.random.stateless_normal([CLASSES, 6, 6, CHANNELS], seed=[seed, 7919])
    return tf.image.resize(coarse, [IMAGE_SIZE, IMAGE_SIZE], method="bilinear")


def make_sample_fn(seed: int):
    """A TF function mapping a sample id (int64 scalar) to ``(image, label)``."""
    import tensorflow as tf

    patterns = templates(seed)

    def sample(index):
        index = tf.cast(index, tf.int64)
        key = tf.stack([tf.constant(seed, tf.int64), index])
        label = tf.random.stateless_uniform([], seed=key, maxval=CLASSES, dtype=tf.int32)
        noise = tf.random.stateless_normal([IMAGE_SIZE, IMAGE_SIZE, CHANNELS], seed=key + [0, 1 << 41])
        image = SIGNAL * tf.gather(patterns, label) + noise
        return image, label

    return sample


def ids_dataset(shard: int, num_shards: int, start: int = 0):
    """Infinite stream of sample ids ``start + shard, start + shard + num_shards, ...``."""
    import tensorflow as tf

    # Infinite cardinality on purpose: with a finite dataset, MWMS makes every next() an
    # all-reduce of "has data" across workers (a hidden barrier per step).
    return tf.data.Dataset.range(start + shard, 1 << 62, num_shards).repeat()


def eval_batch(seed: int, size: int = 1024):
    """A fixed held-out set as ``(images, labels)`` tensors."""
    import tensorflow as tf

    sample = make_sample_fn(seed)
    ds = tf.data.Dataset.range(EVAL_OFFSET, EVAL_OFFSET + size).map(sample).batch(size)
    return next(iter(ds))
