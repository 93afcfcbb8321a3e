"""Training-time test's index shift, the one place it is written (the draft, the objective and evaluate read it).

At draft step i (0-based) position t of a sequence
  - reads the token `input_offset(i)` = 1+i ahead: token t+1+i (vLLM: input ids shift left by one, and each
    later step appends the token drafted before it);
  - predicts the token `target_offset(i)` = 2+i ahead: token t+2+i, which counts only where that token is an
    answer token (the loss mask shifted by the same amount);
  - is scored against the verifier's output at position t+1+i (`verifier_offset(i)`): the verifier's output at
    position p is its distribution over token p+1.

Worked example, tokens [a b c d e] (T = 5), step 1: position 0 reads c, predicts d, against the verifier's
output at position 2 (its guess for d); position 2 reads e, predicts the token after e, which the sequence does
not hold, so position 2 and later do not count (the mask shifted left by 3 is zero from T-3 on). Step 0 of the
same sequence: position 0 reads b and predicts c against the verifier's output at position 1.
"""

import torch


def input_offset(step: int) -> int:
    return 1 + step


def target_offset(step: int) -> int:
    return 2 + step


def verifier_offset(step: int) -> int:
    return target_offset(step) - 1


def shift_left(values: torch.Tensor, by: int) -> torch.Tensor:
    """values [B, T, ...] moved `by` positions left along T: position t holds what t+by held; the last `by`
    positions are zero (False for masks)."""
    tokens = values.shape[1]
    shifted = torch.zeros_like(values)
    if by < tokens:
        shifted[:, : tokens - by] = values[:, by:]
    return shifted
