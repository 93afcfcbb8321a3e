"""Which sequences form each global batch (fixed count or token budget), each process's share, and a step on an
empty share: all without the pipeline."""

import pytest
import torch
from test_draft import tiny_draft

from eagle3.params.train import TrainParams
from eagle3.training.data import BatchPlan, Collate, micro_batches_by_step
from eagle3.training.distributed import Dist
from eagle3.training.objective import Objective, train_step
from eagle3.training.optimizers import make_optimizer


def lengths(count: int = 300, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    short = torch.randint(50, 2048, (count,), generator=generator)
    short[::37] = 16384  # a few long reasoning samples
    return short


def epochs_of(plan: BatchPlan) -> list[list[list[int]]]:
    flat, out = list(plan.global_batches()), []
    for count in plan.per_epoch:
        out.append(flat[:count])
        flat = flat[count:]
    return out


def test_token_budget_bounds_padded_tokens_and_visits_every_sample_once_per_epoch():
    sizes = lengths()
    plan = BatchPlan(sizes, batch_size=8, epochs=2, seed=3, max_tokens=16384)
    for batches in epochs_of(plan):
        seen = sorted(i for batch in batches for i in batch)
        assert seen == list(range(len(sizes)))
        for batch in batches:
            padded = len(batch) * int(sizes[batch].max())
            assert 1 <= len(batch) <= 8 and (padded <= 16384 or len(batch) == 1)
        # A long sample goes alone; short ones fill the budget up to batch_size.
        assert all(len(b) == 1 for b in batches if int(sizes[b].max()) == 16384)
        assert max(len(b) for b in batches) == 8
    assert plan.total == sum(plan.per_epoch) and plan.per_epoch[0] != len(sizes) // 8


def test_fixed_count_batches_are_unchanged_by_the_token_budget_option():
    sizes = lengths()
    plan = BatchPlan(sizes, batch_size=8, epochs=2, seed=3)
    batches = list(plan)
    assert plan.per_epoch == [len(sizes) // 8] * 2 and all(len(b) == 8 for b in batches)
    # As before the option existed: the permutation seeded by (seed, epoch), windows of 16 batches sorted by length.
    generator = torch.Generator().manual_seed(3 * 100003)
    order = torch.randperm(len(sizes), generator=generator)[: len(sizes) // 8 * 8]
    window = order[:128][torch.argsort(sizes[order[:128]], stable=True)]
    assert sorted(window[:8].tolist()) in [sorted(b) for b in batches[: plan.per_epoch[0]]]


def test_processes_share_each_global_batch_and_resume_continues_it():
    sizes = lengths()
    for budget in (None, 12000):
        whole = list(BatchPlan(sizes, 8, 2, seed=1, max_tokens=budget).global_batches())
        # One process: one micro-batch per step, the global batch itself.
        assert list(BatchPlan(sizes, 8, 2, seed=1, max_tokens=budget)) == whole
        steps = [
            list(BatchPlan(sizes, 8, 2, seed=1, rank=r, world_size=3, max_tokens=budget).steps()) for r in range(3)
        ]
        assert [len(s) for s in steps] == [len(whole)] * 3
        for step, batch in enumerate(whole):
            micro = [s[step] for s in steps]
            assert len({len(m) for m in micro}) == 1  # every process runs as many micro-batches
            assert sorted(i for m in micro for part in m for i in part) == sorted(batch)
            for part in (part for m in micro for part in m if part):
                assert budget is None or len(part) * int(sizes[part].max()) <= budget // 3 or len(part) == 1
        resumed = BatchPlan(sizes, 8, 2, seed=1, max_tokens=budget, start=len(whole) - 5)
        assert list(resumed.global_batches()) == whole[-5:]
    # With a budget, a batch can hold fewer sequences than there are processes: some shares are empty.
    assert any(m == [[]] for m in steps[2])


def test_no_process_holds_more_than_its_part_of_the_token_budget():
    """Nine samples of 18,204 tokens fill one 163,840-token batch; on eight processes one of them gets two, which
    it trains one after the other (20,480 tokens each at most) while the others run an empty micro-batch."""
    sizes = torch.full((9,), 18204)
    (batch,) = BatchPlan(sizes, 16, 1, seed=0, max_tokens=163840).global_batches()
    assert sorted(batch) == list(range(9))
    steps = [next(BatchPlan(sizes, 16, 1, seed=0, rank=r, world_size=8, max_tokens=163840).steps()) for r in range(8)]
    assert sorted(len([p for p in m if p]) for m in steps) == [1] * 7 + [2]
    assert all(len(m) == 2 and all(len(p) <= 1 for p in m) for m in steps)
    # Under a budget, shares by tokens, not by count: one long sample against many short ones.
    mixed = torch.tensor([16000, 2000, 2000, 2000, 2000, 2000, 2000, 2000, 2000])
    shares = BatchPlan(mixed, 16, 1, seed=0, world_size=2, max_tokens=32000).shares(list(range(9)))
    assert [int(mixed[s].sum()) for s in shares] == [16000, 16000]


def test_an_empty_share_is_a_zero_row_batch_that_gives_every_parameter_a_zero_gradient():
    batch = Collate(layers=4, hidden=32)([])
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "input_ids": (0, 0),
        "loss_mask": (0, 0),
        "aux": (0, 0, 96),
        "final": (0, 0, 32),
    }
    draft = tiny_draft()
    objective = Objective(
        draft,
        embed=torch.randn(100, 32),
        draft_lm_head=torch.randn(40, 32),
        t2d=torch.ones(100, dtype=torch.bool),
        ttt_steps=3,
        step_weight=0.8,
    )
    optimizer = make_optimizer(draft, TrainParams(learning_rate=0.1, weight_decay=0.0))
    before = {name: p.detach().clone() for name, p in draft.named_parameters()}
    result = train_step(objective, objective, optimizer, [batch], Dist(), 1.0, "bfloat16")
    assert float(result.loss) == 0 and result.sums.tolist() == [0, 0, 0] and result.counts.tolist() == [0, 0, 0]
    for name, param in draft.named_parameters():
        assert param.grad is not None and not param.grad.any(), name
        assert torch.equal(param, before[name]), name  # AdamW with zero gradients and no decay leaves it


def test_micro_batches_group_into_steps_and_the_loader_runs_to_its_end():
    finished = []

    def loader():
        yield from "abcde"
        finished.append(True)  # what a streamed run's clean-up or a DataLoader's shutdown stands for

    assert list(micro_batches_by_step(loader(), [2, 1, 2])) == [["a", "b"], ["c"], ["d", "e"]]
    assert finished == [True]
    with pytest.raises(RuntimeError, match="more batches than the plan's steps"):
        list(micro_batches_by_step(loader(), [2, 1]))
