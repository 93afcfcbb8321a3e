"""The DFlash block draft's training path (eagle3/modeling/dflash.py): its block attention against a plain fp64
reference that runs one anchor at a time, forward and gradients; every anchor's block computed side by side is what
each computes alone."""

import math

import pytest
import torch

from eagle3.modeling.dflash import DFlashConfig, DFlashDraft, block_attention

VERIFIER = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "num_hidden_layers": 8,
    "vocab_size": 100,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}


def reference_block_attention(q, context_kv, block_kv, anchors, scale):
    """One anchor at a time, in fp64: its block's S queries over the context before the anchor and the block's own
    S keys, an explicit softmax (GQA: each query head reads its group's key head)."""
    (k_context, v_context), (k_block, v_block) = context_kv, block_kv
    batch, heads, rows, dim = q.shape
    count = anchors.shape[1]
    size = rows // count
    group = heads // k_context.shape[1]
    out = torch.zeros(batch, heads, rows, dim, dtype=torch.float64)
    for b in range(batch):
        for n in range(count):
            anchor, block = int(anchors[b, n]), slice(n * size, (n + 1) * size)
            for head in range(heads):
                kv = head // group
                keys = torch.cat([k_context[b, kv, :anchor], k_block[b, kv, block]]).double()
                values = torch.cat([v_context[b, kv, :anchor], v_block[b, kv, block]]).double()
                weights = torch.softmax(q[b, head, block].double() @ keys.T * scale, dim=-1)
                out[b, head, block] = weights @ values
    return out


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2)])
def test_block_attention_matches_the_fp64_reference(heads, kv_heads):
    generator = torch.Generator().manual_seed(heads + kv_heads)
    batch, tokens, count, size, dim = 2, 40, 3, 4, 8
    anchors = torch.tensor([[1, 17, 39], [2, 2, 30]])  # the first context position alone; two blocks at one anchor

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    inputs = [
        randn(batch, heads, count * size, dim),
        randn(batch, kv_heads, tokens, dim),
        randn(batch, kv_heads, tokens, dim),
        randn(batch, kv_heads, count * size, dim),
        randn(batch, kv_heads, count * size, dim),
    ]
    upstream = randn(batch, heads, count * size, dim)
    results = []
    for attend, dtype in ((block_attention, torch.float32), (reference_block_attention, torch.float64)):
        leaves = [x.to(dtype).requires_grad_() for x in inputs]
        q, kc, vc, kb, vb = leaves
        out = attend(q, (kc, vc), (kb, vb), anchors, 1 / math.sqrt(dim))
        grads = torch.autograd.grad(out, leaves, upstream.to(out.dtype))
        results.append((out.double(), [g.double() for g in grads]))
    (out, grads), (want, want_grads) = results
    assert (out - want).abs().max() < 1e-5
    for got, expected in zip(grads, want_grads, strict=True):
        assert (got - expected).abs().max() < 1e-5


def _draft(layers: int = 2, size: int = 4) -> tuple[DFlashDraft, torch.nn.Embedding]:
    config = DFlashConfig.from_verifier(VERIFIER, (2, 4, 5), 50, layers=layers, block_size=size, mask_token_id=99)
    draft = DFlashDraft(config)
    draft.init_weights(torch.Generator().manual_seed(0))
    embed = torch.nn.Embedding(100, 64)
    torch.nn.init.normal_(embed.weight, generator=torch.Generator().manual_seed(1))
    return draft.eval(), embed


def test_every_anchor_s_block_side_by_side_is_what_it_is_alone():
    """The mask keeps blocks apart: a block's features depend on its anchor's context and itself only."""
    draft, embed = _draft()
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 99, (1, 50), generator=generator)
    aux = torch.randn(1, 50, 3 * 64, generator=generator)
    anchors = torch.tensor([[3, 11, 11, 40]])
    with torch.no_grad():
        together = draft(ids, aux, anchors, embed)
        for n in range(anchors.shape[1]):
            alone = draft(ids, aux, anchors[:, n : n + 1], embed)
            torch.testing.assert_close(together[:, n], alone[:, 0], atol=1e-5, rtol=1e-5)
        # The context after an anchor does not reach its block.
        changed = aux.clone()
        changed[:, 12:] += 5.0
        assert torch.allclose(draft(ids, changed, anchors[:, :1], embed), together[:, :1], atol=1e-5)


def _batch(tokens: int = 60, rows: int = 2):
    generator = torch.Generator().manual_seed(5)
    loss_mask = torch.zeros(rows, tokens, dtype=torch.bool)
    loss_mask[:, tokens // 3 :] = True  # an answer after a prompt
    return {
        "input_ids": torch.randint(0, 99, (rows, tokens), generator=generator),
        "loss_mask": loss_mask,
        "aux": torch.randn(rows, tokens, 3 * 64, generator=generator),
        "final": torch.randn(rows, tokens, 64, generator=generator),
    }


def test_anchors_are_answer_positions_spread_over_the_answer_and_a_function_of_the_batch():
    from eagle3.training.dflash_objective import anchor_positions

    batch = _batch()
    anchors, real = anchor_positions(batch, 8)
    assert real.all()
    # The token after each anchor is an answer token, and anchors spread over the whole answer (positions 19..58).
    assert bool(batch["loss_mask"].gather(1, anchors + 1).all())
    assert (anchors >= 19).all() and (anchors <= 58).all() and int(anchors.max() - anchors.min()) >= 30
    again, _ = anchor_positions({k: v.clone() for k, v in batch.items()}, 8)
    assert torch.equal(anchors, again)
    # More anchors than answer positions: each one once, the rest padding that is not real.
    many, real = anchor_positions(batch, 64)
    assert int(real.sum(1)[0]) == 40 and len(set(many[0, real[0]].tolist())) == 40


def test_the_objective_is_the_plain_soft_cross_entropy_of_every_block_slot():
    """DFlashObjective's fused loss against the plain one: every real anchor's slot i >= 1 scored by soft
    cross-entropy against the verifier's distribution at p+i-1, weighted decay**(i-1), each slot averaged over its
    counted positions; the same loss and gradients."""
    from eagle3.training.dflash_objective import DFlashObjective, anchor_positions
    from eagle3.training.distributed import Dist
    from eagle3.training.objective import train_step

    draft, embed = _draft(layers=2, size=4)
    draft.train()
    vocab, draft_vocab = 100, 50
    head = torch.randn(draft_vocab, 64, generator=torch.Generator().manual_seed(6))
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[:draft_vocab] = True  # the draft vocab: tokens 0..49
    objective = DFlashObjective(draft, embed=embed.weight, draft_lm_head=head, t2d=t2d, anchors=6, decay=0.7)
    batch = _batch()

    probs, top1 = objective.distribution(batch)
    masks = objective.counted(batch)
    counts = torch.stack([m.sum() for m in masks]).float()
    loss, sums, correct = objective(batch, probs, top1, masks, counts, 1)
    grads = torch.autograd.grad(loss, list(draft.parameters()))

    anchors, real = anchor_positions(batch, 6)
    features = draft(batch["input_ids"], batch["aux"], anchors, objective.embed)
    # The verifier's next-token distribution at every position, over the draft vocab.
    verifier = (batch["final"] @ head.T).float().softmax(-1)
    plain = 0.0
    for slot in range(1, 4):
        terms = []
        for row in range(2):
            for n in range(6):
                p = int(anchors[row, n])
                target = p + slot
                if not (
                    real[row, n]
                    and target < 60
                    and batch["loss_mask"][row, target]
                    and t2d[batch["input_ids"][row, target]]
                ):
                    continue
                log_q = torch.log_softmax(draft.logits(features[row, n, slot]).float(), -1)
                terms.append(-(verifier[row, target - 1] * log_q).sum())
        assert len(terms) == int(masks[slot - 1].sum()) > 0
        plain = plain + 0.7 ** (slot - 1) * torch.stack(terms).sum() / len(terms)
    torch.testing.assert_close(loss, plain, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, torch.autograd.grad(plain, list(draft.parameters())), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)

    # One optimizer step through the trainer's own train_step learns the fixed batch.
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-2)
    first = float(train_step(objective, objective, optimizer, [batch], Dist(), 1.0, "float32").loss)
    for _ in range(10):
        last = float(train_step(objective, objective, optimizer, [batch], Dist(), 1.0, "float32").loss)
    assert last < 0.8 * first, (first, last)
