"""The streamed states' hand-over (eagle3/training/state_spool.py): order, the buffer bound, phases and failures,
with real files and a real producer thread; what computes the states is a plain function here (the capture
engines themselves run in tests/test_streamed.py)."""

import threading
import time

import pytest
import torch

from eagle3.errors import Eagle3Error
from eagle3.training.data import balanced_shares
from eagle3.training.state_spool import HEADER_ALLOWANCE, Producer, StateSpool, share_bytes

LAYERS, HIDDEN = 3, 8
LENGTHS = [5, 9, 2, 7, 4, 6, 3, 8, 5, 1, 9, 2]


def states_of(position: int) -> torch.Tensor:
    """A sequence's states, different for every position and token, exact in bf16."""
    values = torch.arange(LAYERS * LENGTHS[position] * HIDDEN, dtype=torch.float32) % 97 + position * 100
    return values.reshape(LAYERS, LENGTHS[position], HIDDEN).to(torch.bfloat16)


def plan(world: int, batch: int = 4):
    """Three steps of 4 sequences, shared out as BatchPlan does."""
    return [
        (step, balanced_shares(list(range(step * batch, step * batch + batch)), torch.tensor(LENGTHS), world))
        for step in range(3)
    ]


def make_producer(spool, steps, budget, **kwargs):
    calls = []

    def compute(positions):
        calls.append(positions)
        return [states_of(p) for p in positions]

    size = lambda share: share_bytes([LENGTHS[p] for p in share], LAYERS, HIDDEN)  # noqa: E731
    return Producer(spool, steps, compute, size, budget, **kwargs), calls


def consume(spool, producer, steps, rank, trained=None):
    """What a rank's training loop does: take each step in order; asking for the next, it is done with the last."""
    got, previous = [], None
    for step, _ in steps:
        if previous is not None:
            spool.release(previous, rank)
        got.append((step, spool.take(step, rank, producer.healthy)))
        if trained is not None:
            trained(step)
        previous = step
    spool.release(previous, rank)
    return got


def test_every_rank_gets_its_share_of_each_step_in_order(tmp_path):
    spool = StateSpool(tmp_path / "spool")
    spool.reset()
    steps = plan(world=2)
    producer, calls = make_producer(spool, steps, budget=10**9)
    producer.start()
    results = {}
    threads = [
        threading.Thread(target=lambda r=r: results.__setitem__(r, consume(spool, producer, steps, r))) for r in (0, 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    producer.stop()
    # The verifier sees each global batch whole, whatever the number of processes: rank 0's share, then rank 1's
    # (shared by tokens: lengths 5 9 2 7 give rank 0 the 9 and the 2).
    assert calls == [[1, 2, 0, 3], [6, 7, 4, 5], [10, 8, 9, 11]]
    for rank in (0, 1):
        for (step, states), (expected_step, shares) in zip(results[rank], steps, strict=True):
            assert step == expected_step
            assert len(states) == len(shares[rank])
            for position, tensor in zip(shares[rank], states, strict=True):
                assert torch.equal(tensor, states_of(position))
    assert not list(spool.directory.glob("*.safetensors"))


def test_the_buffer_never_holds_more_than_its_budget(tmp_path):
    spool = StateSpool(tmp_path / "spool")
    spool.reset()
    steps = plan(world=1)
    sizes = [share_bytes([LENGTHS[p] for p in shares[0]], LAYERS, HIDDEN) for _, shares in steps]
    budget = max(sizes[i] + sizes[i + 1] for i in range(len(sizes) - 1)) - 1  # never two steps at once
    producer, _ = make_producer(spool, steps, budget)
    producer.start()
    held = []

    def trained(step):
        time.sleep(0.2)  # a slow trainer: the producer runs ahead as far as the budget lets it
        held.append(spool.used_bytes())

    consume(spool, producer, steps, 0, trained)
    producer.stop()
    assert 0 < producer.peak <= budget and max(held) <= budget
    # Each file is its states plus a header within the allowance the budget counts.
    assert producer.peak > sizes[0] - HEADER_ALLOWANCE


def test_phases_publish_only_while_the_verifier_sleeps_and_wake_after_every_rank(tmp_path):
    spool = StateSpool(tmp_path / "spool")
    spool.reset()
    steps = [(s, [[2 * s], [2 * s + 1]]) for s in range(5)]
    events = []

    def visible():
        return sorted(p.name[:14] for p in spool.directory.glob("*.safetensors"))

    producer, calls = make_producer(
        spool,
        steps,
        budget=10**9,
        phase_steps=2,
        sleep=lambda: events.append(("sleep", len(calls), visible())),
        wake=lambda: events.append(("wake", len(calls), visible())),
    )
    producer.start()
    # Rank 1 trains slowly: a verifier woken when rank 0 alone was done would see rank 1's files still there.
    slow = threading.Thread(target=consume, args=(spool, producer, steps, 1, lambda step: time.sleep(0.3)))
    slow.start()
    consume(spool, producer, steps, 0)
    slow.join(timeout=60)
    producer.stop()
    # Two steps computed, then sleep with nothing published yet; wake only once both ranks trained on both; the
    # last, short phase sleeps too, and nothing wakes the verifier after it.
    assert events == [("sleep", 2, []), ("wake", 2, []), ("sleep", 4, []), ("wake", 4, []), ("sleep", 5, [])]
    assert producer.phases == 3


def test_reset_removes_what_a_killed_run_left(tmp_path):
    spool = StateSpool(tmp_path / "spool")
    spool.reset()
    leftovers = [
        spool.path(3, 0),
        spool.directory / f".{spool.path(4, 0).name}.partial",
        spool.directory / "staging" / spool.path(5, 1).name,
        spool.directory / "staging" / f".{spool.path(6, 1).name}.partial",
        spool.directory / "engine" / "request-7" / "states.safetensors",
    ]
    for leftover in leftovers:
        leftover.parent.mkdir(parents=True, exist_ok=True)
        leftover.write_bytes(b"x" * 10)
    spool.fail("the killed run's failure")
    spool.reset()
    assert [p for p in leftovers if p.exists()] == [] and spool.failure() is None
    assert not (spool.directory / "engine").exists()


def test_a_failure_reaches_every_rank_as_its_line(tmp_path):
    spool = StateSpool(tmp_path / "spool")
    spool.reset()

    def compute(positions):
        if 4 in positions:
            raise Eagle3Error("extract.backend hf: the verifier ran out of memory on step 1")
        return [states_of(p) for p in positions]

    producer = Producer(spool, plan(world=2), compute, lambda share: 0, 10**9).start()
    assert len(spool.take(0, 1, producer.healthy)) == 2
    with pytest.raises(Eagle3Error, match="^extract.backend hf: the verifier ran out of memory on step 1$"):
        # Another rank sees only the spool: if the line never reached it, it would wait until the deadline.
        spool.take(1, 1, _deadline(30))
    with pytest.raises(Eagle3Error, match="out of memory"):
        spool.take(1, 0, producer.healthy)
    producer.stop()
    spool.reset()
    assert spool.failure() is None and not list(spool.directory.glob("*.safetensors"))


def _deadline(seconds: float):
    """A `healthy` that gives up after `seconds`, so a missing failure line fails the test instead of hanging it."""
    end = time.monotonic() + seconds

    def healthy():
        if time.monotonic() > end:
            raise AssertionError(f"no failure line within {seconds} s")

    return healthy


def test_a_failure_the_spool_cannot_hold_still_reaches_rank_0(tmp_path, monkeypatch):
    spool = StateSpool(tmp_path / "spool")
    spool.reset()

    def compute(positions):
        raise OSError(28, "No space left on device")

    def fail(message):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spool, "fail", fail)
    producer = Producer(spool, plan(world=1), compute, lambda share: 0, 10**9).start()
    with pytest.raises(Eagle3Error, match=r"^train: computing hidden states failed: .*No space left on device"):
        spool.take(0, 0, producer.healthy)
    producer.stop()
