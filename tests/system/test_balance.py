"""Balanced data parallelism, pure parts: the split, the report's balance section, the data order."""

from __future__ import annotations


def test_balanced_slices_read_the_same_examples_per_step_as_the_equal_split_across_a_resplit():
    import numpy as np

    from ddlctl.workloads.synthetic import READ_AHEAD_BOUND, SliceSchedule, shard_dataset, slice_dataset

    def ids(dataset, steps):
        # range first: zip would otherwise take one more batch from the iterator than it returns
        return [set(np.asarray(batch[2]).tolist()) for _, batch in zip(range(steps), dataset, strict=False)]

    equal = [ids(shard_dataset(1, False, 8, shard, 2, first_step=3), 7) for shard in range(2)]
    # two workers' pipelines, 11 + 5 examples per step from step 3, then 4 + 12 from a later step: the
    # change is made while the pipelines run and read ahead
    schedules = [SliceSchedule(0, 11, first_step=3), SliceSchedule(11, 5, first_step=3)]
    iterators = [iter(slice_dataset(1, False, 16, schedule, first_step=3)) for schedule in schedules]
    split = [ids(iterator, 2) for iterator in iterators]
    ahead = [schedule.made(5) for schedule in schedules]
    # bounded read-ahead: the prefetch buffer and the step being made (no distributed iterator here)
    assert all(a <= READ_AHEAD_BOUND - 1 for a in ahead), ahead
    at = 5 + max(schedule.notice(5) for schedule in schedules)
    for schedule, (offset, size) in zip(schedules, ((0, 4), (4, 12)), strict=True):
        assert schedule.change(offset, size, at)  # in time
    for mine, iterator in zip(split, iterators, strict=True):
        mine.extend(ids(iterator, 5))
    for step in range(7):
        union = equal[0][step] | equal[1][step]
        assert union == set(range((3 + step) * 16, (4 + step) * 16))
        assert split[0][step] | split[1][step] == union and not split[0][step] & split[1][step]
        sizes = (11, 5) if 3 + step < at else (4, 12)
        assert (len(split[0][step]), len(split[1][step])) == sizes, step
    assert at < 3 + 7  # the last steps read the new split
    # a change for a step the pipeline has begun is reported late
    assert not schedules[0].change(0, 11, 3 + 6)
