"""The evaluation's figures from each request's own acceptance, per prompt set and category, with confidence
intervals.

vLLM reports per request (RequestSpecDecodeMetrics, `per_request_spec_decode_metrics: detailed`) how many verify
steps accepted j = 0..k draft tokens, how many draft tokens it proposed and each step's accepted count. From
that, for any group of requests:

    tokens per verifier step  = output tokens / (output tokens - accepted)   (a step that drafted nothing counts)
    mean acceptance length    = 1 + accepted / steps that drafted            (the bonus token included: the figure
                                                                              SpecForge, SGLang and the published
                                                                              Kimi drafts quote)
    acceptance at position i  = steps that accepted more than i / steps that drafted

vLLM's own counts, summed over all requests, equal the deltas of its process-wide counters (checked:
`counters_agree`); the figures leave out the drafts vLLM counts as accepted past the end of an answer
(`request_counts`).
The 95% interval is a percentile bootstrap over the set's prompts (a multi-turn prompt resampled with all of its
turns), seeded, so it states how much the figure owes to which prompts were drawn.
"""

from typing import Any

import numpy as np

from eagle3.chat.evaluation_sets import PromptSet
from eagle3.errors import Eagle3Error
from eagle3.formats.eval_metrics import context_bucket, context_bucket_end

RESAMPLES = 2000


def request_counts(completion: dict[str, Any]) -> dict[str, Any]:
    """One request's output tokens, accepted draft tokens, steps that drafted and acceptance by position.

    vLLM counts a verify step's accepted drafts before it trims the step's tokens at the end of the answer (EOS,
    max_tokens), so its count can exceed what was output. The first token comes from the prompt's prefill and
    each verify step outputs its accepted tokens plus one, so accepted <= tokens - 1 - steps that drafted; the
    excess is removed from the last steps' highest positions (exactly, where vLLM gave each step's count: the
    engines; otherwise from the highest positions counted). `raw_*` keep vLLM's own counts, which its
    process-wide counters match."""
    spec = completion.get("spec")
    tokens = len(completion["token_ids"])
    histogram = spec["histogram"] if spec else []
    raw_accepted = sum(j * n for j, n in enumerate(histogram))
    drafts = sum(histogram)
    raw_by_position = [sum(histogram[i + 1 :]) for i in range(max(len(histogram) - 1, 0))]
    excess = max(raw_accepted - max(tokens - 1 - drafts, 0), 0)
    by_position = list(raw_by_position)
    steps = list((spec or {}).get("steps") or [])
    while excess and steps:
        last = steps.pop()
        for position in range(last - 1, max(last - 1 - excess, -1), -1):
            by_position[position] -= 1
        excess -= min(excess, last)
    for position in range(len(by_position) - 1, -1, -1):
        taken = min(excess, by_position[position])
        by_position[position] -= taken
        excess -= taken
    return {
        "tokens": tokens,
        "accepted": sum(by_position),
        "drafts": drafts,
        "draft_tokens": spec["draft_tokens"] if spec else 0,
        "by_position": by_position,
        "raw_accepted": raw_accepted,
        "raw_by_position": raw_by_position,
    }


def figures(units: list[list[dict[str, Any]]], speculates: bool, seed: int) -> dict[str, Any]:
    """Figures over `units` (each prompt's completions, all of its turns), with bootstrap 95% intervals."""
    counts = [[request_counts(c) for c in unit] for unit in units]
    tokens = np.array([sum(c["tokens"] for c in unit) for unit in counts], dtype=np.float64)
    accepted = np.array([sum(c["accepted"] for c in unit) for unit in counts], dtype=np.float64)
    drafts = np.array([sum(c["drafts"] for c in unit) for unit in counts], dtype=np.float64)
    width = max((len(c["by_position"]) for unit in counts for c in unit), default=0)
    by_position = np.zeros(width)
    for unit in counts:
        for c in unit:
            by_position[: len(c["by_position"])] += c["by_position"]
    total_drafts = int(drafts.sum())
    result = {
        "prompts": len(units),
        "completions": sum(len(unit) for unit in units),
        "output_tokens": int(tokens.sum()),
        "accepted_tokens": int(accepted.sum()),
        "verifier_steps": int(tokens.sum() - accepted.sum()),
        "num_drafts": total_drafts,
        "num_draft_tokens": sum(c["draft_tokens"] for unit in counts for c in unit),
        "tokens_per_step": _round(_tokens_per_step(tokens.sum(), accepted.sum())),
        "tokens_per_step_ci95": None,
        "mean_acceptance_length": _round(1 + accepted.sum() / total_drafts) if speculates and total_drafts else None,
        "mean_acceptance_length_ci95": None,
        "acceptance_by_position": [_round(n / total_drafts) for n in by_position] if total_drafts else [],
    }
    if speculates and len(units) > 1:
        picks = np.random.default_rng(seed).integers(0, len(units), size=(RESAMPLES, len(units)))
        sampled_tokens, sampled_accepted, sampled_drafts = (
            tokens[picks].sum(1),
            accepted[picks].sum(1),
            drafts[picks].sum(1),
        )
        result["tokens_per_step_ci95"] = _interval(_tokens_per_step(sampled_tokens, sampled_accepted))
        with np.errstate(invalid="ignore", divide="ignore"):
            lengths = np.where(sampled_drafts > 0, 1 + sampled_accepted / sampled_drafts, np.nan)
        if total_drafts:
            result["mean_acceptance_length_ci95"] = _interval(lengths)
    return result


def figures_by_context(completions: list[dict[str, Any]], speculates: bool, seed: int) -> list[dict[str, Any]]:
    """`figures` of the completions in each context bucket of their prompt tokens, lowest first; a bucket's units
    are its conversations (each with its turns that fall in the bucket)."""
    buckets: dict[int, dict[int, list[dict[str, Any]]]] = {}
    for completion in completions:
        bucket = buckets.setdefault(context_bucket(completion["prompt_tokens"]), {})
        bucket.setdefault(completion["conversation"], []).append(completion)
    kept = (
        "prompts", "completions", "output_tokens", "tokens_per_step", "tokens_per_step_ci95",
        "mean_acceptance_length", "mean_acceptance_length_ci95", "acceptance_by_position",
    )  # fmt: skip
    result = []
    for low in sorted(buckets):
        found = figures(list(buckets[low].values()), speculates, seed)
        result.append({"from_tokens": low, "to_tokens": context_bucket_end(low), **{key: found[key] for key in kept}})
    return result


def counters_agree(completions: list[dict[str, Any]], counters: dict[str, Any]) -> bool:
    """Whether the per-request records add up to vLLM's own counters over the same batches (vLLM's counts, before
    the trim `request_counts` applies)."""
    counts = [request_counts(c) for c in completions]
    reported = list(counters["accepted_per_position"])
    width = max([len(reported)] + [len(c["raw_by_position"]) for c in counts])
    by_position = [sum(c["raw_by_position"][i] for c in counts if i < len(c["raw_by_position"])) for i in range(width)]
    return (
        sum(c["raw_accepted"] for c in counts) == counters["num_accepted_tokens"]
        and sum(c["drafts"] for c in counts) == counters["num_drafts"]
        and sum(c["draft_tokens"] for c in counts) == counters["num_draft_tokens"]
        and by_position == reported + [0] * (width - len(reported))
    )


def _tokens_per_step(tokens, accepted):
    return tokens / np.maximum(tokens - accepted, 1)


def _interval(values: np.ndarray) -> list[float] | None:
    values = values[~np.isnan(values)]
    if not len(values):
        return None
    low, high = np.percentile(values, [2.5, 97.5])
    return [_round(low), _round(high)]


def _round(value: float) -> float:
    return round(float(value), 4)


def summarize(
    method: str,
    k: int | None,
    outcome: dict[str, Any],
    units: list[list[dict[str, Any]]],
    reference: dict[tuple[int, int], list[int]] | None,
    seed: int,
) -> dict[str, Any]:
    """One configuration's figures over `units` (each prompt's completions) of one sampling run."""
    completions = [c for unit in units for c in unit]
    summary = {
        "method": method,
        "k": k,
        "temperature": outcome["sampling"]["temperature"],
        **figures(units, method != "none", seed),
        "lossless_identical": None,
    }
    if reference is not None:
        summary["lossless_identical"] = sum(
            c["token_ids"] == reference[(c["conversation"], c["turn"])] for c in completions
        )
    return summary


def run_record(
    summary: dict[str, Any], outcome: dict[str, Any], method: str, k: int | None, seed: int
) -> dict[str, Any]:
    """A held-out `runs` entry: its figures, the wall time of the configuration's whole run (every set: they share
    its batches) with the output tokens/s over all of them, and every set's turns by prompt length."""
    if not counters_agree(outcome["completions"], outcome["counters"]):
        raise Eagle3Error(
            f"evaluate: {method}" + (f" k={k}" if k else "") + ": the per-request acceptance vLLM reported does not "
            "add up to its own counters over the same requests; the figures cannot be trusted (a vLLM defect): "
            "rerun, and report it with metrics/eval.json's environment"
        )
    tokens = sum(len(c["token_ids"]) for c in outcome["completions"])
    return {
        **summary,
        "all_sets_output_tokens": tokens,
        "all_sets_by_context": figures_by_context(outcome["completions"], method != "none", seed),
        "output_tokens_per_s": round(tokens / outcome["seconds"], 1) if outcome["seconds"] > 0 else None,
        "seconds": outcome["seconds"],
    }


def units_by_set(sets: list[PromptSet], completions: list[dict[str, Any]]) -> list[list[list[dict[str, Any]]]]:
    """Per set, in `sets`' order, each prompt's completions (its turns in order)."""
    by_conversation: dict[int, list[dict[str, Any]]] = {}
    for completion in completions:
        by_conversation.setdefault(completion["conversation"], []).append(completion)
    units, first = [], 0
    for prompt_set in sets:
        count = len(prompt_set.conversations)
        units.append([sorted(by_conversation[i], key=lambda c: c["turn"]) for i in range(first, first + count)])
        first += count
    return units


def units_by_category(
    prompt_set: PromptSet, units: list[list[dict[str, Any]]]
) -> dict[str, list[list[dict[str, Any]]]]:
    """A set's units grouped by their conversation's category; conversations without one are left out."""
    grouped: dict[str, list[list[dict[str, Any]]]] = {}
    for conversation, unit in zip(prompt_set.conversations, units, strict=True):
        if conversation["category"] is not None:
            grouped.setdefault(conversation["category"], []).append(unit)
    return grouped
