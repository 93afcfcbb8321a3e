"""The training-time-test shift: the worked example of eagle3/modeling/ttt_alignment.py, checked."""

import torch

from eagle3.modeling.ttt_alignment import input_offset, shift_left, target_offset, verifier_offset


def test_worked_example():
    a, b, c, d, e = 10, 11, 12, 13, 14
    tokens = torch.tensor([[a, b, c, d, e]])
    mask = torch.ones(1, 5, dtype=torch.bool)
    # Step 1: position 0 reads c and predicts d against the verifier's output at position 2.
    assert shift_left(tokens, input_offset(1)).tolist() == [[c, d, e, 0, 0]]
    assert shift_left(tokens, target_offset(1)).tolist() == [[d, e, 0, 0, 0]]
    assert verifier_offset(1) == 2
    # Position 2 and later predict beyond the sequence: they do not count.
    assert shift_left(mask, target_offset(1)).tolist() == [[True, True, False, False, False]]
    # Step 0: position 0 reads b, predicts c against the verifier's output at position 1.
    assert shift_left(tokens, input_offset(0))[0, 0] == b and shift_left(tokens, target_offset(0))[0, 0] == c
    assert verifier_offset(0) == 1


def test_shifts_longer_than_the_sequence_are_all_zero_and_keep_trailing_dimensions():
    states = torch.arange(24.0).reshape(1, 3, 8)
    assert not shift_left(states, 3).any() and not shift_left(states, 9).any()
    assert torch.equal(shift_left(states, 1)[0, :2], states[0, 1:]) and shift_left(states, 1).shape == (1, 3, 8)
