"""Balanced data parallelism, pure parts: the split, the report's balance section, the data order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddlctl.report.balance import WorkerSteps, balance_note, balance_section
from ddlctl.task.balance import Split, equal_shares, shares


@given(st.lists(st.floats(0.01, 1000), min_size=1, max_size=16), st.integers(16, 4096))
def test_shares_sum_to_the_batch_follow_speed_and_give_everyone_an_example(speeds, batch):
    counts = shares(speeds, batch)
    assert sum(counts) == batch and min(counts) >= 1
    total = sum(speeds)
    raised = counts.count(1)  # examples moved to workers too slow for one of their own
    for count, speed in zip(counts, speeds, strict=True):
        assert count == 1 or abs(count - batch * speed / total) < 1.0 + raised + 1e-9  # rounding only
    for i, faster in enumerate(speeds):
        assert all(counts[i] >= counts[j] for j, slower in enumerate(speeds) if faster > slower)


def test_shares_examples_and_refusals():
    assert shares([2.0, 1.0], 64) == [43, 21]
    assert shares([1.0, 1.0, 1.0], 10) == [4, 3, 3]
    assert equal_shares(10, 3) == [4, 3, 3]
    with pytest.raises(ValueError, match="cannot give each of 3"):
        shares([1.0, 1.0, 1.0], 2)
    with pytest.raises(ValueError, match="positive"):
        shares([1.0, 0.0], 8)


def test_split_offsets_and_weights_cover_the_global_batch():
    batches = (43, 21)
    parts = [Split(64, batches, i, (2.0, 1.0), "measured") for i in range(2)]
    assert [(p.offset, p.local_batch) for p in parts] == [(0, 43), (43, 21)]
    assert sum(p.weight for p in parts) == pytest.approx(1.0)
    # at 2 and 1 examples per unit of time: the equal split waits for the slow worker's 32 examples
    assert parts[0].predicted_step_s((32, 32)) == 32.0 and parts[0].predicted_step_s() == max(43 / 2.0, 21 / 1.0)


def lockstep(speeds, batches, comm_s, steps=20):
    """Records of workers in lockstep: each computes batch/speed, the step lasts the slowest + comm."""
    period = max(b / s for b, s in zip(batches, speeds, strict=True)) + comm_s
    return [WorkerSteps(f"worker:{i}", f"h{i}", [int(k * period * 1e6) for k in range(steps)],
                        [b / s] * steps, [b] * steps) for i, (s, b) in enumerate(zip(speeds, batches, strict=True))]


def test_balance_section_recovers_speeds_and_predicts_both_splits():
    speeds, comm = [1000.0, 500.0], 0.01
    section = balance_section(lockstep(speeds, [64, 64], comm), "equal")
    assert [round(w["speed"]) for w in section["workers"]] == [1000, 500]
    assert section["comm_s"] == pytest.approx(comm, rel=1e-3)
    assert section["predicted_equal_samples_per_s"] == pytest.approx(128 / (64 / 500 + comm), rel=1e-3)
    assert section["measured_samples_per_s"] == pytest.approx(section["predicted_equal_samples_per_s"], rel=1e-3)
    balanced = shares(speeds, 128)
    assert section["predicted_balanced_samples_per_s"] == pytest.approx(
        128 / (max(b / s for b, s in zip(balanced, speeds, strict=True)) + comm), rel=1e-3)
    assert section["ideal_samples_per_s"] == pytest.approx(1500)
    assert section["workers"][0]["wait_s"] == pytest.approx(64 / 500 - 64 / 1000 + comm, rel=1e-3)
    note = balance_note(section)
    assert note and "worker:1 on h1 computes 2.0x slower" in note and "--balance speed" in note


def test_after_a_resplit_the_section_describes_the_final_split_alone():
    from ddlctl.report.balance import final_split_steps

    assert final_split_steps([64, 64, 64]) == 3  # one split: all of it
    assert final_split_steps([64, 64, 85, 85, 85, 85]) == 4
    assert final_split_steps([64, 64, 64, 85, 85]) == 5  # too few at the new split: all
    speeds, comm = [1000.0, 500.0], 0.01
    before = lockstep(speeds, [64, 64], comm, steps=10)
    after = lockstep(speeds, [85, 43], comm, steps=6)
    workers = [WorkerSteps(b.task, b.host, [*b.starts_us, *(t + b.starts_us[-1] + 10**5 for t in a.starts_us)],
                           [*b.sync_s, *a.sync_s], [*b.samples, *a.samples])
               for b, a in zip(before, after, strict=True)]
    section = balance_section(workers, "speed (measured, then in training)")
    assert [w["batch"] for w in section["workers"]] == [85, 43] and section["final_split_steps"] == 6
    assert [round(w["speed"]) for w in section["workers"]] == [1000, 500]
    assert section["step_s"] == pytest.approx(max(85 / 1000, 43 / 500) + comm, rel=1e-3)
    assert balance_section(before, "equal")["final_split_steps"] is None


def test_no_suggestion_when_balanced_or_equal_workers():
    assert balance_note(balance_section(lockstep([1000.0, 990.0], [64, 64], 0.01), "equal")) is None
    done = balance_section(lockstep([1000.0, 500.0], [85, 43], 0.01), "speed (measured)")
    assert done["workers"][1]["share"] == pytest.approx(43 / 128) and balance_note(done) is None
    assert balance_section(lockstep([1000.0], [64], 0.01)) is None  # one worker: nothing to balance




def test_op_threads_follow_the_cpu_quota():
    from ddlctl.host.cgroup import intra_op_threads

    assert [intra_op_threads(c) for c in (0.01, 0.3, 0.6, 1.0, 1.5, 2.0, 3.2)] == [1, 1, 1, 1, 2, 2, 4]


def test_blocks_end_where_an_uninterrupted_run_ends_and_at_the_callers_stops():
    from ddlctl.workloads.trainer import step_blocks as _blocks

    assert list(_blocks(40, 8, 0, lambda: 4)) == [(0, 4), (4, 4), (8, 8), (16, 8), (24, 8), (32, 8)]
    assert list(_blocks(20, 8)) == [(0, 8), (8, 8), (16, 4)]
    assert list(_blocks(20, 8, 3)) == [(3, 5), (8, 8), (16, 4)]  # a resumed run too
    assert list(_blocks(3, 8, 0, lambda: 4)) == [(0, 3)]
    stops = iter([4, 14, 14, 24, None, None])  # asked again before every block: it may move on
    assert list(_blocks(30, 8, 0, lambda: next(stops))) == [(0, 4), (4, 4), (8, 6), (14, 2), (16, 8), (24, 6)]


def test_a_resplit_must_promise_a_shorter_step_and_pay_for_itself():
    from ddlctl.task.balance import decide, judge, relative

    assert relative([5000.0, 2100.0]) == "1.00 : 0.42" and relative([1.0, 4.0]) == "0.25 : 1.00"

    # 2x slower worker on an equal split: 64 / 500 = 128 ms -> 43 / 500 = 86 ms per step
    assert decide([64, 64], [1000.0, 500.0], remaining_steps=100, cost_s=0.5) == (85, 43)
    assert decide([64, 64], [1000.0, 500.0], remaining_steps=10, cost_s=0.5) is None  # saves 0.42 s < 0.5 s
    assert decide([64, 64], [1000.0, 500.0], remaining_steps=0, cost_s=0.0) is None
    # close to balanced: 85 ms per step now, 82.1 ms with (82, 46): 3.4% shorter only
    assert decide([85, 43], [1000.0, 560.0], remaining_steps=10_000, cost_s=0.0) is None
    assert decide([85, 43], [1000.0, 560.0], remaining_steps=10_000, cost_s=0.0, min_gain=0.03) == (82, 46)
    assert decide([85, 43], [1000.0, 600.0], remaining_steps=100, cost_s=0.0) == (80, 48)  # 5.9% shorter
    assert decide([85, 43], [1000.0, 0.0], remaining_steps=100, cost_s=0.0) is None  # a worker measured nothing
    assert judge([64, 64], [1000.0, 500.0], 10, 0.5) == ("would not pay for itself", None)
    assert judge([85, 43], [1000.0, 560.0], 10_000, 0.0) == ("close enough", None)
    assert judge([85, 43], [1000.0, 0.0], 100, 0.0) == ("not measured", None)




def test_the_rebalancer_compares_after_the_first_block_then_at_growing_intervals(monkeypatch):
    from ddlctl.task import balance

    others = [[500.0, 0.0, 3]]  # the other worker's speed, last re-split's cost, steps read ahead
    sent = []
    monkeypatch.setattr(balance, "exchange_rows", lambda _s, mine: sent.append(mine) or [list(mine), *others])
    monkeypatch.setattr(balance, "save", lambda _r, task_dir=None: None)
    r = balance.Rebalancer(total_steps=100)
    split = balance.Split(128, (64, 64), 0, (), "measured")
    assert r.due == balance.RESPLIT_AFTER_STEPS == 4
    for c in (0.5, 0.064, 0.064, 0.064):  # the first step warms up and is not counted
        r.record(c)
    split = r.check(None, split, r.due, ahead=2)
    assert split.batches == (85, 43) and split.source == "measured, then in training"
    assert sent[0] == pytest.approx([1000.0, 0.064, 2])  # before any re-split its cost is guessed: a step
    # the pipelines have made up to 3 steps ahead: the new split from 0-based step 4 + 3 + 1 on,
    # one settling step, then at least a window, ending where a block of 8 ends
    assert r.effective == 8 and r.due == 24
    # the cost: the steps of notice and the settling step beyond the new steady compute time
    for c in (0.064, 0.064, 0.064, 0.064, 0.1, *[0.085] * 15):
        r.record(c)
    others[0] = [43 / 0.086, 0.2, 3]
    same = r.check(None, split, r.due, ahead=2)
    assert sent[1] == pytest.approx([85 / 0.085, 0.015, 2])
    assert same is split and r.due == 32  # balanced: no change, no notice
    # a worker that turns 2x slower: a re-split (saves 68 ms per step), the last one's cost kept
    others[0] = [43 / 0.172, 0.2, 3]
    for c in [0.085] * 8:
        r.record(c)
    assert r.check(None, same, r.due, ahead=2).batches == (102, 26) and sent[2][1] == pytest.approx(0.015)
    assert r.effective == 36 and r.due == 48
    # the same near the end of the run: 68 ms x 12 steps left after the notice < a re-split's 1.23 s
    late = balance.Rebalancer(total_steps=100)
    late.resplits, late.cost_s, late.skip = 1, 1.23, 0
    for c in [0.085] * 8:
        late.record(c)
    assert late.check(None, same, 84, ahead=2) is same and late.verdict == "would not pay for itself"
    assert late.due == 96
    assert late.check(None, same, 96, ahead=2) is same and late.due is None  # no comparison past the end
    # without read-ahead (batches fed from Python) a re-split takes effect at once; its cost is
    # guessed at two steps (a custom loop may make a new pipeline)
    fed = balance.Rebalancer(total_steps=100)
    others[0] = [500.0, 0.0, 0]
    for c in (0.5, 0.064, 0.064, 0.064):
        fed.record(c)
    assert fed.check(None, balance.Split(128, (64, 64), 0, (), "measured"), 4).batches == (85, 43)
    assert sent[-1] == pytest.approx([1000.0, 0.128, 0]) and fed.effective == 4 and fed.due == 16
    # while the split stays, the comparisons grow rarer: 8, 16, 32 ... 256 steps apart
    steady = balance.Rebalancer(total_steps=5000)
    dues = [steady.due]
    while steady.due is not None and len(dues) < 10:
        for c in [85 / 1000] * 8:
            steady.record(c)
        steady.check(None, split, steady.due)
        dues.append(steady.due)
    assert dues == [4, 16, 32, 64, 128, 256, 512, 768, 1024, 1280]
