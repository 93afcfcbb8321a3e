"""evaluate's offline estimate: what the exported draft should reach in vLLM, from the held-out hidden states.

On the GPU in bf16 where there is one, over at most `evaluate.offline.max_tokens` held-out tokens, full-vocabulary
logits `chunk_tokens` positions at a time: a chain draft (EAGLE-3) unrolled (training-time test) over the held-out
hidden states, a block draft (DFlash) run once per position with its block anchored at the next token; at each
position the accepted length is the number of leading drafted tokens (chain steps, or block slots) whose top-1
equals the verifier's top-1. Each answer is then decoded as vLLM decodes (`_walk_answers`), giving tokens per
verifier step, mean acceptance length and acceptance by position computed as vLLM computes them, and the mean
acceptance length by context length (the tokens before each draft, in power-of-two buckets from 256: where
long-context layouts differ). It is written beside the vLLM figure with the gap; what remains of the gap is the
population (every turn of the held-out conversations vs the first `max_tokens` of the first turns).
"""

from pathlib import Path
from typing import Any

import torch

from eagle3.formats.eval_metrics import context_bucket, context_bucket_end
from eagle3.formats.exported_dflash import is_dflash, load_exported_dflash
from eagle3.formats.exported_draft import load_exported_draft
from eagle3.formats.hf_weights import load_verifier_tensors
from eagle3.formats.provenance import checked_verifier_dir, read_provenance
from eagle3.formats.shards import HiddenStateDataset, split_shards
from eagle3.formats.vocab import draft_to_target
from eagle3.modeling.dflash import DFlashDraft
from eagle3.modeling.draft import Eagle3Draft
from eagle3.modeling.ttt_alignment import shift_left, target_offset, verifier_offset
from eagle3.params.evaluate import OfflineEstimate
from eagle3.paths import DRAFT_DIR


def greedy_tokens(states: torch.Tensor, head: torch.Tensor, chunk: int) -> torch.Tensor:
    """argmax(states @ head.T) per row, `chunk` rows at a time: a [tokens, vocab] logit matrix (10.7 GB in fp32
    for one 16K-token sample against Kimi-K2.5's 163,840-token head) never exists at once."""
    return torch.cat([(states[i : i + chunk] @ head.T).argmax(-1) for i in range(0, len(states), chunk)])


def chain_correct(
    draft: Eagle3Draft,
    ids: torch.Tensor,
    aux: torch.Tensor,
    embed: torch.nn.Module,
    targets: torch.Tensor,
    verifier_top1: torch.Tensor,
    steps: int,
    chunk: int,
) -> torch.Tensor:
    """[tokens, steps] bool: whether the chain draft at position t, step i, proposes the verifier's top-1 for
    token t+2+i (eagle3/modeling/ttt_alignment.py)."""
    tokens = len(ids)
    correct = torch.zeros(tokens, steps, dtype=torch.bool, device=aux.device)
    for i, feature in enumerate(draft.unroll(ids[None], aux, embed, steps)):
        guess = targets[greedy_tokens(draft.norm(feature[0]), draft.lm_head.weight, chunk)]
        offset = verifier_offset(i)
        correct[: tokens - offset, i] = guess[: tokens - offset] == verifier_top1[offset:]
    return correct


def block_correct(
    draft: DFlashDraft,
    ids: torch.Tensor,
    aux: torch.Tensor,
    embed: torch.nn.Module,
    targets: torch.Tensor,
    verifier_top1: torch.Tensor,
    chunk: int,
) -> torch.Tensor:
    """[tokens, block_size - 1] bool, indexed as chain_correct: the draft at position t is the block anchored at
    t+1 (the token the verifier has just produced), whose slot i+1 proposes token t+2+i. Blocks run
    `chunk // block_size` anchors at a time, so the queries of one forward never exceed `chunk`."""
    tokens, size = len(ids), draft.config.block_size
    correct = torch.zeros(tokens, size - 1, dtype=torch.bool, device=aux.device)
    slots = torch.arange(size - 1, device=aux.device)
    every = torch.arange(1, tokens, device=aux.device)
    for anchors in every.split(max(1, chunk // size)):
        features = draft(ids[None], aux, anchors[None], embed)[0, :, 1:]  # [N, size-1, H]
        guess = targets[draft.logits(features).argmax(-1)]
        # Slot i+1 of the block at p proposes token p+i+1: the verifier's top-1 at p+i.
        scored = anchors[:, None] + slots
        inside = scored < tokens
        correct[anchors - 1] = inside & (guess == verifier_top1[scored.clamp(max=tokens - 1)])
    return correct


@torch.no_grad()
def offline_estimate(root: Path, steps: int, limits: OfflineEstimate) -> dict[str, Any]:
    """Expected tokens per verifier step from held-out hidden states and the exported draft (see module doc), over
    at most `limits.max_tokens` held-out tokens (whole samples), on the GPU in bf16 where there is one. A block
    draft's `steps` is its block size less one (the params check it)."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shards = split_shards(root, "heldout")
    verifier_dir = checked_verifier_dir(root)
    draft: Eagle3Draft | DFlashDraft
    if is_dflash(root / DRAFT_DIR):
        draft, d2t = load_exported_dflash(root / DRAFT_DIR, verifier_dir)
        if steps != draft.config.block_size - 1:
            raise ValueError(
                f"a block of {draft.config.block_size} proposes {draft.config.block_size - 1}, not {steps}"
            )
    else:
        draft, d2t = load_exported_draft(root / DRAFT_DIR)
    draft.to(device=device, dtype=dtype)
    verifier = load_verifier_tensors(verifier_dir)
    embed = torch.nn.Embedding.from_pretrained(verifier.pop("embed").to(device=device, dtype=dtype))
    head = verifier.pop("lm_head").to(device=device, dtype=dtype)
    targets = draft_to_target(d2t).to(device)
    per_step_correct, positions, read = torch.zeros(steps), 0, 0
    walk: dict[str, Any] = {"output": 0, "accepted": 0, "drafts": 0, "by_position": [0] * steps, "by_context": {}}
    provenance = read_provenance(root)
    made_for = {"hidden_size": provenance.hidden_size, "tokenizer_sha256": provenance.tokenizer_sha256}
    samples = HiddenStateDataset(shards, made_for, provenance.vocab_size)
    for sample in (samples[position] for position in range(len(samples))):
        ids, mask = sample["input_ids"], sample["loss_mask"]
        tokens = len(ids)
        if read and read + tokens > limits.max_tokens:
            break
        read += tokens
        if tokens < 3:
            continue
        hidden = sample["hidden"].to(device=device, dtype=dtype, non_blocking=True)
        aux = hidden[:-1].transpose(0, 1).reshape(1, tokens, -1)
        # The verifier's greedy next token at each position, from its final state.
        verifier_top1 = greedy_tokens(hidden[-1], head, limits.chunk_tokens)
        on_device = ids.to(device)
        if isinstance(draft, DFlashDraft):
            correct = block_correct(draft, on_device, aux, embed, targets, verifier_top1, limits.chunk_tokens)
        else:
            correct = chain_correct(draft, on_device, aux, embed, targets, verifier_top1, steps, limits.chunk_tokens)
        correct = correct.cpu()
        # Positions whose first drafted token is an answer token.
        counted = shift_left(mask[None], target_offset(0))[0]
        per_step_correct += correct[counted].float().sum(0)
        positions += int(counted.sum())
        _walk_answers(correct.int().cumprod(-1).sum(-1).tolist(), mask.tolist(), walk)
    return {
        "k": steps,
        "heldout_tokens_read": read,
        "device": f"{device.type} {str(dtype).removeprefix('torch.')}",
        "positions": positions,
        "drafts": walk["drafts"],
        "tokens_per_step": round(walk["output"] / max(walk["output"] - walk["accepted"], 1), 4),
        "mean_acceptance_length": round(1 + walk["accepted"] / max(walk["drafts"], 1), 4),
        "acceptance_by_position": [round(n / max(walk["drafts"], 1), 4) for n in walk["by_position"]],
        "top1_agreement_by_position": [round(float(c) / max(positions, 1), 4) for c in per_step_correct],
        "acceptance_by_context": [
            {
                "from_tokens": low,
                "to_tokens": context_bucket_end(low),
                "drafts": drafts,
                "mean_acceptance_length": round(1 + accepted / drafts, 4),
            }
            for low, (drafts, accepted) in sorted(walk["by_context"].items())
        ],
    }


def _walk_answers(leading: list[int], answer: list[bool], walk: dict[str, Any]) -> None:
    """Decode each answer (a run of loss-masked tokens) as vLLM does: the draft at position t (its input is token
    t+1) proposes tokens t+2.., the verifier accepts the leading matches and adds one token, the next draft starts
    after them. Averaging over every position instead overstates vLLM's figure: hard tokens cluster at the
    positions drafting restarts from (measured on vLLM's own completions: every-position 1.73 vs walk 1.588 vs
    vLLM 1.590)."""
    tokens, start = len(answer), 0
    while start < tokens:
        if not answer[start]:
            start += 1
            continue
        end = start
        while end < tokens and answer[end]:
            end += 1
        walk["output"] += end - start
        position = start - 1
        while position >= 0 and position + 2 <= end - 1:
            accepted = min(leading[position], end - 2 - position)
            walk["drafts"] += 1
            walk["accepted"] += accepted
            for i in range(accepted):
                walk["by_position"][i] += 1
            # The draft at `position` follows tokens 0 .. position + 1.
            bucket = walk["by_context"].setdefault(context_bucket(position + 2), [0, 0])
            bucket[0] += 1
            bucket[1] += accepted
            position += accepted + 1
        start = end
