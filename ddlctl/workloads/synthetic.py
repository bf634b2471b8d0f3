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

import time

IMAGE_SIZE = 24
CHANNELS = 3
CLASSES = 8
SIGNAL = 0.3  # template amplitude relative to unit noise
EVAL_OFFSET = 1 << 40  # sample ids of the held-out set start here
PREFETCH_STEPS = 2  # batches a sliced pipeline (--balance speed) makes ahead of the training loop
#: The most steps past the training loop a sliced pipeline can have begun: its prefetch buffer, the
#: step being made, and MWMS's distributed iterator's own buffer of one (measured: 4). A change of
#: slice announced further ahead than this cannot be late, whatever the pipeline does meanwhile.
READ_AHEAD_BOUND = PREFETCH_STEPS + 2
PAD = 4


def templates(seed: int):  # -> tf.Tensor [CLASSES, H, W, C]
    """One smooth pattern per class, the same on every process for a given seed."""
    import tensorflow as tf

    coarse = tf.random.stateless_normal([CLASSES, 6, 6, CHANNELS], seed=[seed, 7919])
    return tf.image.resize(coarse, [IMAGE_SIZE, IMAGE_SIZE], method="bilinear")


#: ``augment`` levels of :func:`make_sample_fn`: none, augmented, decoded and augmented.
PLAIN, AUGMENT, DECODE = 0, 1, 2
#: A decoded sample's JPEG: this many times the image's side.
DECODE_SCALE = 3


def make_sample_fn(seed: int, augment: int = PLAIN):
    """A TF function mapping a sample id (int64 scalar) to ``(image, label, id)``; ``augment``
    (a bool, or :data:`DECODE`: the image first goes through a JPEG of :data:`DECODE_SCALE` times
    its side, encoded and decoded, as a real input pipeline decodes its files)."""
    import tensorflow as tf

    patterns = templates(seed)

    # plain TensorFlow ops (``augment`` is a Python bool): nothing for autograph to convert, whose
    # conversion of it, at every task start, cost more than the rest of the input's tracing
    @tf.autograph.experimental.do_not_convert
    def sample(index):
        index = tf.cast(index, tf.int64)
        key = tf.stack([tf.constant(seed, tf.int64), index])
        label = tf.random.stateless_uniform([], seed=key, maxval=CLASSES, dtype=tf.int32)
        noise = tf.random.stateless_normal([IMAGE_SIZE, IMAGE_SIZE, CHANNELS], seed=key + [0, 1 << 41])
        image = SIGNAL * tf.gather(patterns, label) + noise
        if augment >= DECODE:
            side = IMAGE_SIZE * DECODE_SCALE
            pixels = tf.cast(tf.clip_by_value(tf.image.resize(image, [side, side]) * 40.0 + 128.0, 0, 255), tf.uint8)
            decoded = tf.io.decode_jpeg(tf.io.encode_jpeg(pixels, quality=95), channels=CHANNELS)
            image = (tf.image.resize(tf.cast(decoded, tf.float32), [IMAGE_SIZE, IMAGE_SIZE]) - 128.0) / 40.0
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
                  epoch_size: int | None = None, parallel: bool = True, first_step: int = 0, delay_s: float = 0.0):
    """Shard ``shard`` of the id stream, as (images, labels, ids) batches: pipelined input.
    ``first_step``: start where step ``first_step`` (0-based) reads (a resumed run); ``delay_s``:
    each batch takes that much longer to make (a slow map: input-bound on purpose)."""
    import tensorflow as tf

    end = epoch_size if epoch_size else 1 << 62
    ids = tf.data.Dataset.range(shard + first_step * batch * num_shards, end, num_shards)
    if not epoch_size:
        # Infinite cardinality on purpose: with a finite dataset, MWMS makes every next() an
        # all-reduce of "has data" across workers (a hidden barrier per step).
        ids = ids.repeat()
    return _batches(ids.map(make_sample_fn(seed, augment), num_parallel_calls=tf.data.AUTOTUNE if parallel else None,
                            deterministic=True), batch, parallel, delay_s)


def service_dataset(seed: int, augment: bool, batch: int, parallel: bool = True, epoch_size: int | None = None):
    """The endless id stream (``epoch_size``: ids [0, N) once) as (images, labels, ids) batches of
    ``batch``, made by the tf.data service's data workers (``ddlctl.data.distribute``,
    distributed_epoch): each batch goes to one trainer, whichever asks first, and no id twice.

    The service splits the *source* among its data workers (DYNAMIC sharding): the source here is
    the batches' numbers, so that every batch is whole (ids ``k * batch`` to ``(k + 1) * batch - 1``);
    split ids would leave each data worker a partial batch, dropped."""
    import tensorflow as tf

    from ddlctl.task import data

    count = epoch_size // batch if epoch_size else 1 << 62
    ids = tf.data.Dataset.range(0, count).flat_map(lambda k: tf.data.Dataset.range(k * batch, (k + 1) * batch))
    made = data.distribute(_batches(ids.map(make_sample_fn(seed, augment), num_parallel_calls=tf.data.AUTOTUNE,
                                            deterministic=True), batch, parallel))
    # (endless, as the local stream: MWMS then asks no "has data" all-reduce a step; an epoch is
    # read to its end, each trainer taking what it gets: run_optional)
    return made if epoch_size else made.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))


def slice_ids(step: int, global_batch: int, offset: int, batch: int):
    """Ids a worker reads at 0-based ``step`` when it takes ``batch`` examples starting at ``offset``
    of every global batch (``--balance speed``; numpy int64 vector)."""
    import numpy as np

    first = step * global_batch + offset
    return np.arange(first, first + batch, dtype=np.int64)


class SliceSchedule:
    """Which slice of every global batch a worker reads (``--balance speed``), changeable while its
    input pipeline runs: a re-split then costs nothing but a few steps of notice, where a new pipeline
    cost 1.5-2.5 s (dropping MWMS's distributed iterator, then a cold pipeline's first steps).

    Two TensorFlow variables: the schedule ``[from_step, old_offset, old_batch, new_offset, new_batch]``
    (one assignment, so the pipeline never sees half of it), and the last step whose slice the
    pipeline has begun to make (it reads ahead: a change must be announced for a step it has not
    reached yet, see :meth:`made`)."""

    def __init__(self, offset: int, batch: int, first_step: int = 0) -> None:
        import tensorflow as tf

        self.schedule = tf.Variable([first_step, offset, batch, offset, batch], dtype=tf.int64, trainable=False)
        self.produced = tf.Variable(first_step - 1, dtype=tf.int64, trainable=False)

    def slice(self, step):  # -> (offset, batch) int64 tensors; inside the input pipeline
        """Offset and size of this worker's slice of 0-based ``step``; records that it was made."""
        import tensorflow as tf

        with tf.control_dependencies([self.produced.assign(step)]):
            s = tf.identity(self.schedule)
        new = step >= s[0]
        return tf.where(new, s[3], s[1]), tf.where(new, s[4], s[2])

    def made(self, consumed: int) -> int:
        """How many steps past the first ``consumed`` the pipeline has begun to make (a snapshot: the
        pipeline goes on filling its buffers while the training loop waits)."""
        return max(0, int(self.produced.numpy()) + 1 - consumed)

    def notice(self, consumed: int) -> int:
        """Steps past the first ``consumed`` from which a change of slice is sure to reach the
        pipeline in time: beyond what it has made and what its buffers can still take."""
        return max(self.made(consumed), READ_AHEAD_BOUND)

    def change(self, offset: int, batch: int, from_step: int) -> bool:
        """Read ``batch`` examples at ``offset`` from 0-based step ``from_step`` on; steps before keep
        the slice they had. False when the pipeline had already begun step ``from_step`` (it then
        read it with the old slice): the notice was too short."""
        now = [int(v) for v in self.schedule.numpy()]
        before = now[3:] if from_step - 1 >= now[0] else now[1:3]
        self.schedule.assign([from_step, *before, offset, batch])
        # slice() records a step before it reads the schedule: a step not recorded now reads the change
        return int(self.produced.numpy()) < from_step


def slice_dataset(seed: int, augment: bool, global_batch: int, schedule: SliceSchedule,
                  epoch_size: int | None = None, parallel: bool = True, first_step: int = 0):
    """A worker's contiguous slice ``[offset, offset + batch)`` of every global batch, the slice
    ``schedule`` gives for that step, as one batch per step: over all workers, step ``k`` reads ids
    ``[k * global_batch, (k + 1) * global_batch)``, the same examples as the equal split of
    :func:`shard_dataset`, whatever the shares (and however they change)."""
    import tensorflow as tf

    sample = make_sample_fn(seed, augment)
    calls = tf.data.AUTOTUNE if parallel else None

    def one_step(k):  # noqa: ANN001, ANN202
        offset, batch = schedule.slice(k)
        first = k * global_batch + offset
        # the batch dimension is unknown: a traced step takes a re-split's new size without tracing again
        return tf.data.Dataset.range(first, first + batch).map(sample, num_parallel_calls=calls,
                                                              deterministic=True).batch(batch)

    steps = tf.data.Dataset.range(first_step, epoch_size // global_batch if epoch_size else 1 << 62)
    if not epoch_size:
        steps = steps.repeat()  # infinite cardinality (see shard_dataset)
    dataset = steps.flat_map(one_step)
    if not parallel:
        return _sequential(dataset)
    # a bounded read-ahead (what a change of slice must wait for): one buffer of fixed size, and no
    # prefetch injected behind the program's back
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return dataset.prefetch(PREFETCH_STEPS).with_options(options)


def range_dataset(seed: int, augment: bool, batch: int, first_id, count, parallel: bool = True):
    """Ids ``[first_id, first_id + count)`` as batches (ps: a closure's own id range)."""
    import tensorflow as tf

    ids = tf.data.Dataset.range(first_id, first_id + count)
    return _batches(ids.map(make_sample_fn(seed, augment), num_parallel_calls=tf.data.AUTOTUNE if parallel else None,
                            deterministic=True), batch, parallel)


def _batches(samples, batch: int, parallel: bool, delay_s: float = 0.0):
    """Batches of ``samples``; pipelined (``parallel``): prefetched, so the next batch is made while
    a step computes. Otherwise strictly sequential: no prefetch, and none of the optimisations that
    tf.data would otherwise apply behind the program's back (injected prefetch, parallelised map).
    ``delay_s``: a map that takes that long per batch (one batch at a time)."""
    import tensorflow as tf

    dataset = samples.batch(batch, drop_remainder=True)
    if delay_s > 0:
        def wait(ids):  # noqa: ANN001, ANN202 - a numpy array
            time.sleep(delay_s)
            return ids

        def slow(images, labels, ids):  # noqa: ANN001, ANN202 - tensors
            waited = tf.numpy_function(wait, [ids], tf.int64, stateful=True)
            waited.set_shape(ids.shape)
            return images, labels, waited

        dataset = dataset.map(slow)
    if parallel:
        return dataset.prefetch(tf.data.AUTOTUNE)
    return _sequential(dataset)


def _sequential(dataset):  # noqa: ANN001, ANN202 - tf.data datasets
    """``dataset`` strictly sequential (see :func:`_batches`)."""
    import tensorflow as tf

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
