"""The offline estimate of a block draft (eagle3/engines/offline_estimate.py `block_correct`): which block slot is
scored against which verifier token, and blocks run many anchors at a time equal blocks run one at a time."""

from types import SimpleNamespace

import pytest
import torch
from test_dflash import _draft

from eagle3.engines.offline_estimate import block_correct

TOKENS, VOCAB = 24, 40


class _KnowsTheSequence(torch.nn.Module):
    """A block draft whose slot s of the block anchored at p proposes the sequence's own token p+s, as a perfect
    draft of a verifier that always predicts the next token of the sequence would."""

    def __init__(self, size: int):
        super().__init__()
        self.config = SimpleNamespace(block_size=size)
        self.calls = 0

    def forward(self, input_ids, aux, anchors, embed):
        self.calls += 1
        size, tokens = self.config.block_size, input_ids.shape[1]
        positions = anchors[0, :, None] + torch.arange(size)
        proposed = input_ids[0, positions.clamp(max=tokens - 1)]
        return torch.nn.functional.one_hot(proposed, VOCAB).float()[None]

    def logits(self, features):
        return features


@pytest.mark.parametrize("chunk", [4, 16, 1000])
def test_each_block_slot_is_scored_against_the_verifier_s_token_it_proposes(chunk):
    size = 4
    ids = torch.randint(0, VOCAB, (TOKENS,), generator=torch.Generator().manual_seed(0))
    # The verifier's top-1 at t is its guess for token t+1: here the sequence itself, except at position 10, where
    # it would have said something no draft proposes, and past the end.
    verifier_top1 = torch.cat([ids[1:], torch.tensor([-1])])
    verifier_top1[10] = -1
    draft = _KnowsTheSequence(size)
    correct = block_correct(draft, ids, torch.zeros(1, TOKENS, 8), None, torch.arange(VOCAB), verifier_top1, chunk)
    assert correct.shape == (TOKENS, size - 1)
    # The draft at t anchors at t+1; its i-th proposal is token t+2+i, which the verifier guessed at t+1+i.
    expected = torch.tensor(
        [[t + 2 + i <= TOKENS - 1 and t + 1 + i != 10 for i in range(size - 1)] for t in range(TOKENS)]
    )
    assert torch.equal(correct, expected)
    assert draft.calls == -(-(TOKENS - 1) // max(1, chunk // size))


def test_blocks_side_by_side_score_as_each_block_alone():
    draft, embed = _draft(layers=2, size=4)
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 99, (TOKENS,), generator=generator)
    aux = torch.randn(1, TOKENS, 3 * 64, generator=generator)
    d2t = torch.randint(0, 3, (50,), generator=generator)
    targets = torch.arange(50) + d2t
    with torch.no_grad():
        guesses = [
            targets[draft.logits(draft(ids[None], aux, torch.tensor([[p]]), embed))[0, 0, 1:].argmax(-1)]
            for p in range(1, TOKENS)
        ]
    # A verifier that agrees with every block's first proposal; the later slots match where they happen to.
    verifier_top1 = torch.full((TOKENS,), -1)
    for p, guess in enumerate(guesses, start=1):
        verifier_top1[p] = guess[0]
    with torch.no_grad():
        together = block_correct(draft, ids, aux, embed, targets, verifier_top1, chunk=8)
    alone = torch.zeros_like(together)
    for p, guess in enumerate(guesses, start=1):
        for i in range(3):
            alone[p - 1, i] = p + i < TOKENS and bool(guess[i] == verifier_top1[p + i])
    assert torch.equal(together, alone)
    assert together[:, 0].sum() == TOKENS - 1  # every block's first proposal is the verifier's, by construction
