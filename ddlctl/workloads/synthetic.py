"""Deterministic synthetic image classification data, generated inside TensorFlow.

Sample ``i`` of seed ``s`` is a pure function of ``(s, i)``: its label is drawn with a stateless
RNG and its image is that class's fixed smooth template plus Gaussian noise; with ``augment`` it
also gets a random crop (after padding), flip, and brightness/contrast jitter, all stateless and
keyed by the sample id (the input-heavy part of the ``cnn`` workload). The class signal is
learnable (accuracy rises far above the 1/``CLASSES`` chance level) and nothing is downloaded.

Which ids a step reads is fixed by the strategy (:func:`step_ids`), the same in pipelined and
linear execution, so both train on exactly the same data.
"""

from __future__ import annotations

IMAGE_SIZE = 24
CHANNELS = 3
CLASSES = 8
SIGNAL = 0.3  # template amplitude relative to unit noise
EVAL_OFFSET = 1 << 40  # sample ids of the held-out set start here
PAD = 4


def templates(seed: int):  # -> tf.Tensor [CLASSES, H, W, C]
    """One smooth pattern per class, the same on every process for a given seed."""
    import tensorflow as tf

    coarse = tf.random.stateless_normal([CLASSES, 6, 6, CHANNELS], seed=[seed, 7919])
    return tf.image.resize(coarse, [IMAGE_SIZE, IMAGE_SIZE], method="bilinear")


def make_sample_fn(seed: int, augment: bool = False):
    """A TF function mapping a sample id (int64 scalar) to ``(image, label, id)``."""
    import tensorflow as tf

    patterns = templates(seed)

    def sample(index):
        index = tf.cast(index, tf.int64)
        key = tf.stack([tf.constant(seed, tf.int64), index])
        label = tf.random.stateless_uniform([], seed=key, maxval=CLASSES, dtype=tf.int32)
        noise = tf.random.stateless_normal([IMAGE_SIZE, IMAGE_SIZE, CHANNELS], seed=key + [0, 1 << 41])
        image = SIGNAL * tf.gather(patterns, label) + noise
        if augment:
            padded = tf.pad(image, [[PAD, PAD], [PAD, PAD], [0, 0]], mode="REFLECT")
            image = tf.image.stateless_random_crop(padded, [IMAGE_SIZE, IMAGE_SIZE, CHANNELS], seed=key + [0, 2])
            image = tf.image.stateless_random_flip_left_right(image, seed=key + [0, 3])
            image = tf.image.stateless_random_brightness(image, 0.2, seed=key + [0, 4])
            image = tf.image.stateless_random_contrast(image, 0.8, 1.2, seed=key + [0, 5])
        return image, label, index

    return sample


def make_batch_fn(seed: int, augment: bool = False):
    """The python-feed execution's input: a batch built in Python, one sample at a time (as a Python
    generator or a ``feed_dict`` loop produces data), with the same ops as the pipelined map, so
    both modes see identical data: ids -> ``(images, labels, ids)``."""
    import tensorflow as tf

    sample = make_sample_fn(seed, augment)

    def batch(ids):
        images, labels, _ = zip(*(sample(tf.constant(int(i), tf.int64)) for i in ids), strict=True)
        return tf.stack(images), tf.stack(labels), tf.constant(ids, tf.int64)

    return batch


def step_ids(step: int, batch: int, shard: int = 0, num_shards: int = 1):
    """Ids a shard reads at 0-based ``step`` when shard ``shard`` of ``num_shards`` reads ids
    ``shard, shard + num_shards, ...`` in batches of ``batch`` (numpy int64 vector)."""
    import numpy as np

    return (np.arange(step * batch, (step + 1) * batch, dtype=np.int64) * num_shards) + shard


def shard_dataset(seed: int, augment: bool, batch: int, shard: int = 0, num_shards: int = 1,
                  epoch_size: int | None = None, parallel: bool = True, first_step: int = 0):
    """Shard ``shard`` of the id stream, as (images, labels, ids) batches: pipelined input.
    ``first_step``: start where step ``first_step`` (0-based) reads (a resumed run)."""
    import tensorflow as tf

    end = epoch_size if epoch_size else 1 << 62
    ids = tf.data.Dataset.range(shard + first_step * batch * num_shards, end, num_shards)
    if not epoch_size:
        # Infinite cardinality on purpose: with a finite dataset, MWMS makes every next() an
        # all-reduce of "has data" across workers (a hidden barrier per step).
        ids = ids.repeat()
    return _batches(ids.map(make_sample_fn(seed, augment), num_parallel_calls=tf.data.AUTOTUNE if parallel else None,
                            deterministic=True), batch, parallel)


def slice_ids(step: int, global_batch: int, offset: int, batch: int):
    """Ids a worker reads at 0-based ``step`` when it takes ``batch`` examples starting at ``offset``
    of every global batch (``--balance speed``; numpy int64 vector)."""
    import numpy as np

    first = step * global_batch + offset
    return np.arange(first, first + batch, dtype=np.int64)


def slice_dataset(seed: int, augment: bool, global_batch: int, offset: int, batch: int,
                  epoch_size: int | None = None, parallel: bool = True, first_step: int = 0):
    """A worker's contiguous slice ``[offset, offset + batch)`` of every global batch, as batches of
    ``batch``: over all workers, step ``k`` reads ids ``[k * global_batch, (k + 1) * global_batch)``,
    the same examples as the equal split of :func:`shard_dataset`, whatever the shares."""
    import tensorflow as tf

    steps = tf.data.Dataset.range(first_step, epoch_size // global_batch if epoch_size else 1 << 62)
    if not epoch_size:
        steps = steps.repeat()  # infinite cardinality (see shard_dataset)
    ids = steps.flat_map(lambda k: tf.data.Dataset.range(k * global_batch + offset, k * global_batch + offset + batch))
    # every batch is full (each step's slice is exactly ``batch`` ids), but the batch dimension is
    # left unknown: a traced step then takes a re-split's new batch size without tracing again
    return _batches(ids.map(make_sample_fn(seed, augment), num_parallel_calls=tf.data.AUTOTUNE if parallel else None,
                            deterministic=True), batch, parallel, known_size=False)


def range_dataset(seed: int, augment: bool, batch: int, first_id, count, parallel: bool = True):
    """Ids ``[first_id, first_id + count)`` as batches (ps: a closure's own id range)."""
    import tensorflow as tf

    ids = tf.data.Dataset.range(first_id, first_id + count)
    return _batches(ids.map(make_sample_fn(seed, augment), num_parallel_calls=tf.data.AUTOTUNE if parallel else None,
                            deterministic=True), batch, parallel)


def _batches(samples, batch: int, parallel: bool, known_size: bool = True):
    """Batches of ``samples``; pipelined (``parallel``): prefetched, so the next batch is made while
    a step computes. Otherwise strictly sequential: no prefetch, and none of the optimisations that
    tf.data would otherwise apply behind the program's back (injected prefetch, parallelised map).
    ``known_size``: the batch dimension is ``batch`` in the element spec (else None)."""
    import tensorflow as tf

    dataset = samples.batch(batch, drop_remainder=known_size)
    if parallel:
        return dataset.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    options.experimental_optimization.map_parallelization = False
    options.experimental_optimization.parallel_batch = False
    return dataset.with_options(options)


def eval_batch(seed: int, size: int = 1024):
    """A fixed held-out set as ``(images, labels)`` tensors (never augmented)."""
    import tensorflow as tf

    sample = make_sample_fn(seed)
    ds = tf.data.Dataset.range(EVAL_OFFSET, EVAL_OFFSET + size).map(sample).batch(size)
    images, labels, _ = next(iter(ds))
    return images, labels
