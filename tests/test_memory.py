"""The GPU-free training-memory estimate: against the live storage of the real step at a small shape, linear in the
sample length, and at the hero run's shape within the issue's bounds."""

import pytest

from eagle3.params.train import DraftLayout, TrainParams
from eagle3.plan.facts import KIMI_K2_5_TEXT_CONFIG
from eagle3.training.distributed import Dist
from eagle3.training.memory import (
    Estimator,
    GiB,
    PeakBytes,
    draft_config_for,
    make_objective_for,
    sample_batch,
)
from eagle3.training.objective import train_step
from eagle3.training.optimizers import make_optimizer, muon_matrices

SMALL = {
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 12,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "rope_theta": 10000.0,
}
TTT = 3


def real_peak(tokens: int, recompute: str, precision: str, layout: DraftLayout | None = None) -> int:
    """Live storage at the peak of the second real step, everything (model, AdamW state, batch) counted from its
    allocation: a count that shares nothing with the estimator's bookkeeping."""
    config = draft_config_for(SMALL, 300, TrainParams(draft_layout=layout or DraftLayout()))
    with PeakBytes() as meter:
        objective = make_objective_for(config, TTT, recompute, precision)
        optimizer = make_optimizer(objective.draft, TrainParams())
        batch = sample_batch(config, 1, tokens, TTT)
        for step in range(2):
            if step == 1:
                meter.peak = meter.live
            train_step(objective, objective, optimizer, [batch], Dist(), 1.0, precision)
    return meter.peak


@pytest.fixture(scope="module")
def small():
    return Estimator(draft_config_for(SMALL, 300), TTT)


@pytest.mark.parametrize("recompute", ["off", "mlp", "full"])
def test_estimate_is_the_real_peak_and_linear_in_tokens(small, recompute):
    lengths = (256, 512, 1024)
    estimates = [small.memory(tokens, recompute).total for tokens in lengths]
    real = [real_peak(tokens, recompute, "bfloat16") for tokens in lengths]
    for estimate, measured in zip(estimates, real, strict=True):
        assert abs(estimate - measured) <= 0.02 * measured, (lengths, estimates, real)
    # Linear: doubling from 512 adds twice what doubling from 256 did.
    for values in (estimates, real):
        first, second = values[1] - values[0], values[2] - values[1]
        assert first > 0 and abs(second - 2 * first) <= 0.02 * second, values


def test_recompute_settings_order_and_fsdp_divides_the_persistent_part(small):
    off, mlp, full = (small.memory(1024, setting) for setting in ("off", "mlp", "full"))
    assert full.step < mlp.step < off.step
    assert off.persistent == mlp.persistent == full.persistent
    batch, step = small.step_bytes(1024, "off")
    single, ddp, fsdp = (small.split(1024, "off", batch, step, 8 if n else 1, n or "ddp") for n in ("", "ddp", "fsdp"))
    # DDP keeps its own gradient copy on every process; FSDP holds an eighth of the weights and AdamW state (each
    # tensor's first dimension rounded up to a multiple of 8) and gathers the whole weights for the step.
    assert ddp.total == single.total + single.weights and ddp.gradient_buckets == single.weights
    assert single.weights / 8 <= fsdp.weights < single.weights / 8 * 1.1
    assert single.optimizer / 8 <= fsdp.optimizer < single.optimizer / 8 * 1.1
    assert fsdp.gathered == single.weights and fsdp.frozen == single.frozen and fsdp.step == single.step


def test_muon_holds_one_state_tensor_per_matrix_and_the_same_step(small):
    """train.optimizer muon: Muon's momentum for the hidden matrices, AdamW's two moments (and step) for the rest;
    the step itself allocates what AdamW's does, within its Newton-Schulz temporaries."""
    muon = Estimator(draft_config_for(SMALL, 300), TTT, optimizer="muon")
    adamw, muon_step = small.memory(512, "off"), muon.memory(512, "off")
    draft = muon.objective.draft
    matrices = [p for name, p in draft.named_parameters() if name in muon_matrices(draft)]
    # Per matrix: one fp32 moment and AdamW's fp32 step count fewer.
    assert adamw.optimizer - muon_step.optimizer == sum(p.numel() * 4 + 4 for p in matrices)
    assert muon_step.weights == adamw.weights and abs(muon_step.step - adamw.step) <= 0.05 * adamw.step


def test_newton_schulz_flops_are_what_a_muon_step_multiplies():
    """The plan prices a Muon step by newton_schulz_flops: the matrix products torch.optim.Muon's step runs on the
    train stage's draft, counted by torch's own FLOP counter (a wrong shape, transpose or iteration count differs)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from eagle3.modeling.draft import Eagle3Draft
    from eagle3.training.optimizers import newton_schulz_flops

    draft = Eagle3Draft(draft_config_for(SMALL, 300))
    for param in draft.parameters():
        param.grad = torch.ones_like(param)
    optimizer = make_optimizer(draft, TrainParams(optimizer="muon"))
    with FlopCounterMode(display=False) as counter:
        optimizer.step()
    assert counter.get_total_flops() == newton_schulz_flops(draft) > 0
    adamw = make_optimizer(draft, TrainParams(optimizer="adamw"))
    with FlopCounterMode(display=False) as counter:
        adamw.step()
    assert counter.get_total_flops() == 0


def test_longest_within_is_the_longest_length_the_estimate_fits_from_any_start():
    estimator = Estimator(draft_config_for(SMALL, 300), TTT, "float32")
    length = 700
    limit = estimator.memory(length, "mlp").total
    # One token more does not fit, so the search must land on exactly this length from every start.
    assert estimator.memory(length + 1, "mlp").total > limit
    for near in (16, length, 4096):
        assert estimator.longest_within(limit, "mlp", near) == length, near
    assert estimator.longest_within(estimator.memory(TTT + 2, "off").total - 1, "off", length) == 0


def test_kimi_k2_5_at_16k_tokens_and_7_ttt_steps_fits_the_issue_bounds():
    estimator = Estimator(draft_config_for(KIMI_K2_5_TEXT_CONFIG, 32000), 7)
    config = estimator.config
    assert (config.num_attention_heads, config.head_dim, config.intermediate_size) == (64, 128, 18432)
    assert 1.18e9 < sum(p.numel() for p in estimator.parameters) < 1.2e9
    totals = {setting: estimator.memory(16384, setting).total / GiB for setting in ("off", "mlp", "full")}
    assert totals["mlp"] <= 72 and totals["off"] <= 72 and totals["full"] <= 40, totals
    # The persistent part alone: fp32 weights, two AdamW moments, the bf16 embedding and head rows.
    persistent = estimator.memory(16384, "full").persistent / GiB
    assert 1.19e9 * 12 / GiB < persistent < 1.19e9 * 12 / GiB + 3, persistent


# speculators' default layout: the most extra tensors (one norm over the 3 x 64 aux values, post-norm feedback).
SPECULATORS = DraftLayout(norm_before_fc=True, norm_output=True, norm_before_residual=True)


@pytest.mark.parametrize(
    ("layout", "extra_tensors", "extra_parameters"),
    [(DraftLayout(fc_norm=True, norm_output=True), 3, 3 * 64), (SPECULATORS, 1, 3 * 64)],
)
def test_the_estimate_counts_the_layouts_norms(small, layout, extra_tensors, extra_parameters):
    """Each layout's norm weights in the weights and AdamW's state (fp32: two moments, and a step count per
    tensor), its normed copies of the aux states and of each step's feedback in the step; and the estimate is
    still the real peak."""
    plain = small.memory(512, "off")
    normed = Estimator(draft_config_for(SMALL, 300, TrainParams(draft_layout=layout)), TTT).memory(512, "off")
    assert normed.weights - plain.weights == extra_parameters * 4
    assert normed.optimizer - plain.optimizer == 2 * extra_parameters * 4 + extra_tensors * 4
    # Kept for the backward at least: the aux norm's output for fc, [512, 3 x 64] in bf16.
    assert normed.step - plain.step >= 512 * 3 * 64 * 2
    measured = real_peak(512, "off", "bfloat16", layout)
    assert abs(normed.total - measured) <= 0.02 * measured


BLOCK_DRAFT = TrainParams(draft_method="dflash", dflash={"layers": 2, "block_size": 4, "anchors": 24})


def test_a_block_draft_s_estimate_is_the_real_peak_and_linear_in_tokens():
    """The DFlash objective on fake tensors (its anchors picked by tensor operations alone) against its real step:
    memory grows with the context, the blocks' part is fixed by anchors x block."""
    config = draft_config_for(SMALL, 300, BLOCK_DRAFT)
    slots, anchors = BLOCK_DRAFT.dflash.block_size - 1, BLOCK_DRAFT.dflash.anchors
    estimator = Estimator(config, slots, anchors=anchors)
    lengths = (512, 1024, 2048)
    estimates = [estimator.memory(tokens, "off").total for tokens in lengths]
    real = []
    for tokens in lengths:
        with PeakBytes() as meter:
            objective = make_objective_for(config, slots, "off", "bfloat16", anchors=anchors)
            optimizer = make_optimizer(objective.draft, TrainParams())
            batch = sample_batch(config, 1, tokens, slots)
            for step in range(2):
                if step == 1:
                    meter.peak = meter.live
                train_step(objective, objective, optimizer, [batch], Dist(), 1.0, "bfloat16")
        real.append(meter.peak)
    for estimate, measured in zip(estimates, real, strict=True):
        assert abs(estimate - measured) <= 0.02 * measured, (lengths, estimates, real)
    # Linear once the fixed part dominates no more: doubling from 2048 adds twice what doubling from 1024 did.
    longer = [estimator.memory(tokens, "off").total for tokens in (1024, 2048, 4096)]
    first, second = longer[1] - longer[0], longer[2] - longer[1]
    assert first > 0 and abs(second - 2 * first) <= 0.05 * second, longer
    # Twice the anchors: more memory at the same length (the blocks' queries and their soft cross-entropy).
    assert Estimator(config, slots, anchors=2 * anchors).memory(512, "off").total > estimates[0]
