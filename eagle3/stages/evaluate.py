"""Stage `evaluate`: what users judge a draft by, measured inside vLLM on held-out prompts.

Runs (each its own vLLM engine, eagle3/engines/speculative.py), all on the same prompts, greedy and at
`evaluate.temperature`: the verifier alone; the exported draft (`eagle3`) for each k in
`evaluate.num_speculative_tokens`; vLLM's `ngram` proposer for each k (the baseline to beat).

Headline: tokens per verifier step = output tokens / (output tokens - accepted tokens). A step on which a
method proposed nothing still counts as one token, so methods that often propose nothing (ngram) are not
flattered. vLLM's own "mean acceptance length" (1 + accepted / drafts) averages only over steps that had a
draft; it is reported too, under that name. Acceptance per position = accepted at position i / drafts.
Lossless: greedy completions with speculation identical to the verifier's own greedy completions.
Output tokens/s is wall time on this machine: on CPU, speculation is usually slower in wall time.

Offline estimate: the exported draft unrolled (training-time test) over the held-out hidden states; at each
position the accepted length is the number of leading draft steps whose top-1 equals the verifier's top-1.
Each answer is then decoded as vLLM decodes (`_walk_answers`), giving tokens per verifier step, mean
acceptance length and acceptance by position computed as vLLM computes them. It is written beside the vLLM
figure with the gap; what remains of the gap is the population (every turn of the held-out conversations
vs the first `max_tokens` of the first turns).

Prompts are the held-out split from prepare (first user turn); the stage refuses to run if any of them is
also a training prompt.
"""

import time
from pathlib import Path
from typing import Any

import torch

from eagle3.engines.speculative import Engine, Request, Sampling, Speculation
from eagle3.engines.speculative import run as run_engine
from eagle3.errors import Eagle3Error
from eagle3.files import atomic_path, write_json, write_text
from eagle3.formats.exported_draft import load_exported_draft
from eagle3.formats.hf_weights import load_verifier_tensors
from eagle3.formats.prepared import read_rows
from eagle3.formats.provenance import read_provenance, verifier_dir
from eagle3.formats.shards import HiddenStateDataset, split_shards
from eagle3.formats.vocab import draft_to_target
from eagle3.params.base import StageParams
from eagle3.params.evaluate import EvaluateParams
from eagle3.paths import DRAFT_DIR, EVAL_FIGURE, EVAL_METRICS, EVAL_PLOTS_DIR, PREPARED_DIR, prepared_split
from eagle3.progress import step


class Params(StageParams):
    evaluate: EvaluateParams = EvaluateParams()


def heldout_prompts(root: Path, limit: int | None) -> tuple[list[str], list[list[dict[str, str]]]]:
    """(prompt hashes, chat prompts) of the held-out split; refuses any prompt that training also saw."""
    heldout = read_rows(root, "heldout")
    train = {row["prompt_hash"] for row in read_rows(root, "train", columns=["prompt_hash"])}
    leaked = [row["id"] for row in heldout if row["prompt_hash"] in train]
    if leaked:
        raise Eagle3Error(
            f"{root / PREPARED_DIR}: {len(leaked)} held-out prompts are also training prompts "
            f"(e.g. {leaked[0]}); rerun `eagle3 prepare`"
        )
    hashes, prompts = [], []
    for row in heldout[:limit]:
        messages = []
        for message in row["messages"]:
            if message["role"] == "assistant":
                break
            messages.append({"role": message["role"], "content": message["content"]})
        if messages and messages[-1]["role"] == "user":
            hashes.append(row["prompt_hash"])
            prompts.append(messages)
    if not prompts:
        raise Eagle3Error(f"{root / prepared_split('heldout')}: no held-out prompts; set prepare.heldout_rows >= 1")
    return hashes, prompts


def summarize(
    method: str, k: int | None, outcome: dict[str, Any], prompts: int, reference: list[list[int]] | None
) -> dict[str, Any]:
    counters = outcome["counters"]
    output_tokens = sum(len(c["token_ids"]) for c in outcome["completions"])
    accepted = counters["num_accepted_tokens"] if method != "none" else 0
    drafts = counters["num_drafts"]
    summary = {
        "method": method,
        "k": k,
        "temperature": outcome["sampling"]["temperature"],
        "prompts": prompts,
        "output_tokens": output_tokens,
        "accepted_tokens": accepted,
        "verifier_steps": output_tokens - accepted,
        "tokens_per_step": round(output_tokens / max(output_tokens - accepted, 1), 4),
        "num_drafts": drafts,
        "num_draft_tokens": counters["num_draft_tokens"],
        "mean_acceptance_length": round(1 + accepted / drafts, 4) if method != "none" and drafts else None,
        "acceptance_by_position": [round(a / drafts, 4) for a in counters["accepted_per_position"]] if drafts else [],
        "output_tokens_per_s": round(output_tokens / outcome["seconds"], 1) if outcome["seconds"] > 0 else None,
        "seconds": outcome["seconds"],
        "lossless_identical": None,
    }
    if reference is not None:
        summary["lossless_identical"] = sum(
            c["token_ids"] == r for c, r in zip(outcome["completions"], reference, strict=True)
        )
    return summary


@torch.no_grad()
def offline_estimate(root: Path, steps: int) -> dict[str, Any]:
    """Expected tokens per verifier step from held-out hidden states and the exported draft (see module doc)."""
    shards = split_shards(root, "heldout")
    draft, d2t = load_exported_draft(root / DRAFT_DIR, verifier_dir(root))
    verifier = load_verifier_tensors(verifier_dir(root))
    embed = torch.nn.Embedding.from_pretrained(verifier["embed"].float())
    head = verifier["lm_head"].float()
    targets = draft_to_target(d2t)
    per_step_correct, positions = torch.zeros(steps), 0
    walk = {"output": 0, "accepted": 0, "drafts": 0, "by_position": [0] * steps}
    for sample in HiddenStateDataset(shards):
        ids, mask, hidden = sample["input_ids"], sample["loss_mask"], sample["hidden"].float()
        tokens = len(ids)
        if tokens < 3:
            continue
        aux = hidden[:-1].transpose(0, 1).reshape(1, tokens, -1)
        verifier_top1 = (hidden[-1] @ head.T).argmax(-1)  # [T]: the verifier's greedy next token at each position
        features = draft.unroll(ids[None], aux, embed, steps)
        correct = torch.zeros(tokens, steps, dtype=torch.bool)
        for i, feature in enumerate(features):
            guess = targets[draft.logits(feature[0]).argmax(-1)]
            valid = tokens - 1 - i
            correct[:valid, i] = guess[:valid] == verifier_top1[1 + i : 1 + i + valid]
        # Positions whose first drafted token is an answer token.
        counted = torch.zeros(tokens, dtype=torch.bool)
        counted[: tokens - 2] = mask[2:]
        per_step_correct += correct[counted].float().sum(0)
        positions += int(counted.sum())
        _walk_answers(correct.int().cumprod(-1).sum(-1).tolist(), mask.tolist(), walk)
    return {
        "k": steps,
        "positions": positions,
        "drafts": walk["drafts"],
        "tokens_per_step": round(walk["output"] / max(walk["output"] - walk["accepted"], 1), 4),
        "mean_acceptance_length": round(1 + walk["accepted"] / max(walk["drafts"], 1), 4),
        "acceptance_by_position": [round(n / max(walk["drafts"], 1), 4) for n in walk["by_position"]],
        "top1_agreement_by_position": [round(float(c) / max(positions, 1), 4) for c in per_step_correct],
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
            position += accepted + 1
        start = end


def run(params: Params, root: Path, options=None) -> None:
    config = params.evaluate
    provenance = read_provenance(root)
    draft_dir = root / DRAFT_DIR
    if not (draft_dir / "config.json").is_file():
        raise Eagle3Error(f"{draft_dir}: no exported draft; run `dvc repro export` (or `eagle3 export`) first")
    hashes, prompts = heldout_prompts(root, config.max_prompts)
    engine = Engine(
        verifier=str(verifier_dir(root)),
        max_model_len=config.vllm.max_model_len,
        cpu_kvcache_space_gib=config.vllm.cpu_kvcache_space_gib,
        gpu_memory_utilization=config.vllm.gpu_memory_utilization,
        enforce_eager=config.vllm.enforce_eager,
        tensor_parallel_size=config.vllm.tensor_parallel_size,
        dtype=provenance.dtype if config.vllm.dtype == "auto" else config.vllm.dtype,
        trust_remote_code=provenance.trust_remote_code,
        seed=config.seed,
    )
    samplings = [
        Sampling(0.0, config.max_tokens, config.seed),
        Sampling(config.temperature, config.max_tokens, config.seed),
    ]
    plan: list[tuple[str, int | None, Speculation | None]] = [("none", None, None)]
    for k in config.num_speculative_tokens:
        plan.append(("eagle3", k, Speculation("eagle3", k, str(draft_dir))))
    for k in config.num_speculative_tokens:
        plan.append(
            (
                "ngram",
                k,
                Speculation(
                    "ngram",
                    k,
                    prompt_lookup_min=config.ngram.prompt_lookup_min,
                    prompt_lookup_max=config.ngram.prompt_lookup_max,
                ),
            )
        )
    runs: list[dict[str, Any]] = []
    reference: list[list[int]] | None = None
    repaired = False
    started = time.monotonic()
    for number, (method, k, speculation) in enumerate(plan, start=1):
        step(
            f"evaluate: run {number}/{len(plan)}: {method}"
            + (f" k={k}" if k else "")
            + f" on {len(prompts)} held-out prompts"
        )
        greedy, sampled = run_engine(Request(engine, speculation, prompts, samplings))
        repaired |= sampled["repaired_token_expansion"]
        environment = sampled["environment"]
        if method == "none":
            reference = [c["token_ids"] for c in greedy["completions"]]
        runs.append(summarize(method, k, greedy, len(prompts), reference))
        runs.append(summarize(method, k, sampled, len(prompts), None))
    k = config.headline_k
    step(f"evaluate: offline estimate at k={k} from held-out hidden states")
    offline = offline_estimate(root, k)
    draft_greedy = _pick(runs, "eagle3", k, 0.0)
    headline = {
        "k": k,
        "tokens_per_step_greedy": draft_greedy["tokens_per_step"],
        "ngram_tokens_per_step_greedy": _pick(runs, "ngram", k, 0.0)["tokens_per_step"],
        "lossless_greedy": f"{draft_greedy['lossless_identical']}/{len(prompts)}",
    }
    metrics = {
        "headline": headline,
        "offline_estimate": {
            **offline,
            "vllm_tokens_per_step": headline["tokens_per_step_greedy"],
            "gap": round(offline["tokens_per_step"] - headline["tokens_per_step_greedy"], 4),
        },
        "runs": runs,
        "prompts": {"split": "heldout", "count": len(prompts), "prompt_hashes": hashes},
        # True where this vLLM build needed eagle3/engines/speculative.py's fix for sampled (temperature > 0) runs.
        "repaired_vllm_temperature_expansion": repaired,
        # What the vLLM engines ran on (eagle3/environment.py): the figures depend on it (README "Reproducibility").
        "environment": environment,
        "seconds": round(time.monotonic() - started, 1),
    }
    write_json(root / EVAL_METRICS, metrics)
    _write_plots(root, runs, config)
    step(
        f"evaluate: k={k} greedy: {headline['tokens_per_step_greedy']} tokens per verifier step with the draft vs "
        f"{headline['ngram_tokens_per_step_greedy']} with ngram; lossless {headline['lossless_greedy']}; "
        f"offline estimate {offline['tokens_per_step']}"
    )


def _pick(runs: list[dict[str, Any]], method: str, k: int, temperature: float) -> dict[str, Any]:
    return next(r for r in runs if r["method"] == method and r["k"] == k and r["temperature"] == temperature)


def _write_plots(root: Path, runs: list[dict[str, Any]], config: EvaluateParams) -> None:
    """CSV for `dvc plots show` (declared in dvc.yaml) and the same two panels as reports/eval.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = config.num_speculative_tokens
    temperatures = (0.0, config.temperature)
    out = root / EVAL_PLOTS_DIR
    lines = ["k,eagle3_greedy,ngram_greedy,eagle3_sampled,ngram_sampled"]
    for k in ks:
        values = [_pick(runs, m, k, t)["tokens_per_step"] for t in temperatures for m in ("eagle3", "ngram")]
        lines.append(f"{k},{values[0]},{values[1]},{values[2]},{values[3]}")
    write_text(out / "tokens_per_step.csv", "\n".join(lines) + "\n")
    top = max(ks)
    greedy, sampled = _pick(runs, "eagle3", top, 0.0), _pick(runs, "eagle3", top, config.temperature)
    lines = ["position,greedy,sampled"] + [
        f"{i},{g},{s}"
        for i, (g, s) in enumerate(
            zip(greedy["acceptance_by_position"], sampled["acceptance_by_position"], strict=True)
        )
    ]
    write_text(out / "acceptance_by_position.csv", "\n".join(lines) + "\n")

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for method, style in (("eagle3", "o-"), ("ngram", "s--")):
        for temperature in temperatures:
            label = f"{method}, {'greedy' if temperature == 0 else f'T={temperature}'}"
            left.plot(ks, [_pick(runs, method, k, temperature)["tokens_per_step"] for k in ks], style, label=label)
    left.set(
        xlabel="k (num_speculative_tokens)",
        ylabel="output tokens per verifier step",
        xticks=ks,
        title="Tokens per verifier step",
    )
    left.legend()
    positions = list(range(len(greedy["acceptance_by_position"])))
    right.bar([p - 0.2 for p in positions], greedy["acceptance_by_position"], 0.4, label="greedy")
    right.bar([p + 0.2 for p in positions], sampled["acceptance_by_position"], 0.4, label=f"T={config.temperature}")
    right.set(xlabel="draft position", ylabel="acceptance rate", xticks=positions, title=f"EAGLE-3 acceptance, k={top}")
    right.legend()
    figure.tight_layout()
    with atomic_path(root / EVAL_FIGURE) as partial:
        figure.savefig(partial, dpi=100, format="png", metadata={"Software": None})
    plt.close(figure)
