"""Stage `evaluate`: what users judge a draft by, measured inside vLLM on held-out prompts.

Configurations, all on the same prompts: the verifier alone (`none`, the lossless reference); the exported draft
(`eagle3`, a chain draft, at each k; `dflash`, a block draft, at its block size less one) and vLLM's `ngram` proposer
(the baseline to beat) at each k. Each runs greedy, and at
`evaluate.temperature` where `evaluate.sampled_at` says (`none` always, the headline k by default).
Two backends measure them alike: `engines` starts a fresh in-process vLLM engine per configuration
(eagle3/engines/speculative.py; `evaluate.methods` x `num_speculative_tokens` choose which, so a GPU user can run
exactly one), `servers` sends the prompts to running `vllm serve` endpoints labelled with what each serves and reads
their Prometheus counters around its own requests (eagle3/engines/served_speculation.py); eagle3/engines/measurers.py
holds both.

Headline: tokens per verifier step = output tokens / (output tokens - accepted tokens). A step on which a
method proposed nothing still counts as one token, so methods that often propose nothing (ngram) are not
flattered. vLLM's own "mean acceptance length" (1 + accepted / drafts) averages only over steps that had a
draft; it is reported too, under that name. Acceptance per position = accepted at position i / drafts.
Lossless: greedy completions with speculation identical to the verifier's own greedy completions, as a share.
Exactness is expected only in float32 (the CPU default); in bf16, verifying k+1 tokens at once rounds differently
from decoding one and near-tied greedy tokens flip, so there it is a measured agreement (`lossless` in the metrics).
Output tokens/s is wall time on this machine: on CPU, speculation is usually slower in wall time.

Offline estimate: eagle3/engines/offline_estimate.py.

Prompt sets: the held-out split from prepare (first user turn; the stage refuses to run if any of them is also a
training prompt) and each benchmark of data/benchmarks (stage `benchmarks`: MT-bench, HumanEval, ...). One engine
per configuration serves every set; a multi-turn benchmark is asked turn by turn, every method after the same
history, the verifier's own greedy answers to the earlier turns (the `none` run, measured first). Per set (and per
category where the set has them): tokens per verifier step, mean acceptance length (the published drafts'
figure) and acceptance by position, each with a 95% bootstrap interval over the set's prompts
(eagle3/engines/acceptance.py). `runs` and the headline are the held-out set's. `evaluate.long_context` adds a
probe set of long held-out histories (eagle3/chat/long_context.py), and every run also reports its turns over all
sets by prompt tokens.
"""

import argparse
import hashlib
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

from eagle3.chat.evaluation_sets import PromptSet, prompt_sets
from eagle3.chat.long_context import long_context_probes
from eagle3.chat.reasoning import render
from eagle3.chat.sequence_plan import load_tokenizer
from eagle3.engines.acceptance import run_record, summarize, units_by_category, units_by_set
from eagle3.engines.measurers import EngineMeasurer, Measurer, ServerMeasurer, measured_dtype, mla_in_vllm
from eagle3.engines.offline_estimate import offline_estimate
from eagle3.engines.turn_by_turn import ask_turn_by_turn
from eagle3.environment import capture
from eagle3.errors import Eagle3Error
from eagle3.files import write_json
from eagle3.formats.eval_metrics import EvalMetrics
from eagle3.formats.evaluation_kept import OFFLINE_ESTIMATE, KeptEvaluation, KeptItem, item_name
from eagle3.formats.exported_method import exported_method
from eagle3.formats.hf_config import read_config
from eagle3.formats.provenance import TEXT_IDENTITY, Provenance, read_provenance, verifier_dir
from eagle3.formats.synthetic import generated_template_kwargs, iter_records
from eagle3.hashing import sha256_bytes, sha256_file
from eagle3.params.base import StageParams, pinned_settings
from eagle3.params.evaluate import EvaluateParams
from eagle3.params.train import DRAFT_METHODS, METHOD_NAMES
from eagle3.paths import DRAFT_DIR, EVAL_METRICS, EVALUATION_KEPT_DIR, HIDDEN_INDEX
from eagle3.progress import status
from eagle3.publish.evaluation_plots import find_run, pick_run, results_by_set, write_benchmark_plots, write_plots

# Runs on the GPUs where there are any: refused where nvidia-smi lists GPUs that torch cannot see (eagle3/runner.py).
USES_GPUS = True


class Params(StageParams):
    evaluate: EvaluateParams = EvaluateParams()


def long_context_set(
    root: Path, config: EvaluateParams, provenance: Provenance, template_kwargs: dict[str, Any]
) -> PromptSet | None:
    """The long-context probe (eagle3/chat/long_context.py) as a prompt set; None where it is off. Its facts are
    each probe's prompt tokens and the held-out conversations it chains."""
    probe = config.long_context
    if probe is None:
        return None
    tokenizer = load_tokenizer(root, provenance)

    def prompt_tokens(messages: list[dict[str, str]]) -> int:
        return len(tokenizer(render(tokenizer, messages, True, template_kwargs), add_special_tokens=False)["input_ids"])

    probes = long_context_probes(
        list(iter_records(root, "heldout")), probe.conversations, probe.context_tokens, prompt_tokens
    )
    conversations = [
        {"id": f"long-context-{i}", "category": None, "first": p.messages, "later": []} for i, p in enumerate(probes)
    ]
    facts = {
        "context_tokens": probe.context_tokens,
        "probes": [{"prompt_tokens": p.prompt_tokens, "prompt_hashes": p.prompt_hashes} for p in probes],
    }
    return PromptSet("long-context probe", conversations, facts)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="ITEM",
        help="measure only these and keep them for the stage's next run, writing no metrics: configurations (none, "
        f"eagle3-k3, ngram-k5, ...) and {OFFLINE_ESTIMATE} (e.g. one server up at a time, or the estimate while no "
        "server holds the GPU)",
    )


def _file_sha256(path: Path) -> str:
    if not path.is_file():
        raise Eagle3Error(f"{path}: missing; run `dvc repro export` (or `eagle3 export`) first")
    return sha256_file(path)


def _kept_settings(
    config: EvaluateParams, provenance: Provenance, conversations: list[dict[str, Any]], template_kwargs: dict[str, Any]
):
    """What every kept item's measurements depend on, besides its own configuration."""
    verifier = {**provenance.identity(*TEXT_IDENTITY), **provenance.weights_identity()}
    prompts = hashlib.sha256(json.dumps(conversations, sort_keys=True).encode()).hexdigest()
    common = {
        "verifier": verifier,
        "prompts": prompts,
        "chat_template_kwargs": template_kwargs,
        "max_tokens": config.max_tokens,
        "seed": config.seed,
    }
    if config.backend == "engines":
        return {**common, "engine": {**pinned_settings(config.vllm), "dtype": measured_dtype(config)}}
    return common


def _configuration_settings(
    config: EvaluateParams, common: dict[str, Any], method: str, k: int | None, draft: str, reference: str | None
) -> dict[str, Any]:
    settings = {**common, "method": method, "k": k, "temperatures": list(config.temperatures(k))}
    if config.backend == "servers":
        assert config.servers is not None
        endpoint = next(e for e in config.servers.endpoints if (e.serves, e.k) == (method, k))
        settings["endpoint"] = {"model": endpoint.model, "serves": endpoint.serves, "k": endpoint.k}
    if method in DRAFT_METHODS:
        settings["draft"] = draft
    if method == "ngram":
        settings["ngram"] = pinned_settings(config.ngram)
    if method != "none" and reference is not None:
        # Later turns follow the reference's greedy answers: measured again, they may differ.
        settings["reference"] = reference
    return settings


class _NotKept(Exception):
    pass


def _measured(
    item: KeptItem,
    measurer_for: Callable[[], Measurer],
    config: EvaluateParams,
    method: str,
    k: int | None,
    conversations: list[dict[str, Any]],
    answers: list[list[str]] | None,
) -> list[dict[str, Any]]:
    """The configuration's outcomes: its kept batches where it is done, else measured (keeping each batch)."""
    temperatures = config.temperatures(k)
    if item.done is not None:
        try:
            outcomes = ask_turn_by_turn(
                [c["first"] for c in conversations],
                [c["later"] for c in conversations],
                answers,
                len(temperatures),
                _must_be_kept,
                item,
            )
        except _NotKept:
            outcomes = None
        if outcomes is not None:
            record = item.done
            for temperature, outcome in zip(temperatures, outcomes, strict=True):
                outcome.update(
                    sampling={"temperature": temperature, "max_tokens": config.max_tokens, "seed": config.seed},
                    repaired_token_expansion=record["repaired_token_expansion"],
                )
            return outcomes
    outcomes, record = measurer_for().measure(method, k, conversations, answers, temperatures, item)
    item.finish(record)
    return outcomes


def _must_be_kept(messages, number):
    raise _NotKept


def _offline(root: Path, config: EvaluateParams, kept: KeptEvaluation, provenance: Provenance, draft: str):
    """The offline estimate at the headline k, kept like a configuration."""
    settings = {
        "verifier": {**provenance.identity(*TEXT_IDENTITY), **provenance.weights_identity()},
        "draft": draft,
        "hidden_index": _file_sha256(root / HIDDEN_INDEX),
        "k": config.headline_k,
        "limits": pinned_settings(config.offline),
    }
    item = kept.item(OFFLINE_ESTIMATE, settings)
    if item.done is None:
        status(f"evaluate: offline estimate at k={config.headline_k} from held-out hidden states")
        item.finish(offline_estimate(root, config.headline_k, config.offline))
    return item.done


def exported_draft_sha256(root: Path) -> str:
    """What identifies the draft a kept measurement was made with."""
    draft_dir = root / DRAFT_DIR
    if not (draft_dir / "config.json").is_file():
        raise Eagle3Error(f"{draft_dir}: no exported draft; run `dvc repro export` (or `eagle3 export`) first")
    return sha256_bytes(
        "\n".join(_file_sha256(draft_dir / name) for name in ("config.json", "model.safetensors")).encode()
    )


def selected_items(options: argparse.Namespace | None, names: Iterable[str]) -> set[str] | None:
    """`evaluate --only`'s items, each one these params measure; None: all of them."""
    only = set(getattr(options, "only", None) or []) or None
    unknown = sorted((only or set()) - set(names) - {OFFLINE_ESTIMATE})
    if unknown:
        raise Eagle3Error(
            f"evaluate --only: {', '.join(unknown)} is not measured by these params; one of "
            f"{', '.join([*names, OFFLINE_ESTIMATE])}"
        )
    return only


def check_exported_method(root: Path, config: EvaluateParams) -> None:
    """The exported draft is of the method the params evaluate (a stale export of the other method, say)."""
    exported = exported_method(read_config(root / DRAFT_DIR))
    if exported != config.draft_method:
        raise Eagle3Error(
            f"{DRAFT_DIR}: a {METHOD_NAMES[exported]} draft, but evaluate measures {config.draft_method}; rerun "
            "`dvc repro export` with the params' train.draft_method"
        )


def run(params: Params, root: Path, options=None) -> None:
    config = params.evaluate
    provenance = read_provenance(root)
    draft = exported_draft_sha256(root)
    check_exported_method(root, config)
    heldout, *benchmark_sets = prompt_sets(root, config)
    # Asked as generate asked for the training answers (e.g. a template's thinking switch).
    template_kwargs = generated_template_kwargs(root)
    probe = long_context_set(root, config, provenance, template_kwargs)
    sets = [heldout, *benchmark_sets] + ([probe] if probe is not None else [])
    conversations = [c for prompt_set in sets for c in prompt_set.conversations]
    configurations = config.configurations()
    names = {item_name(method, k): (method, k) for method, k in configurations}
    only = selected_items(options, names)
    kept = KeptEvaluation(root / EVALUATION_KEPT_DIR)
    started = time.monotonic()
    # First, while no server holds the GPU where the runbook runs it alone.
    offline = _offline(root, config, kept, provenance, draft) if only is None or OFFLINE_ESTIMATE in only else None
    measurer: Measurer | None = None

    def measurer_for() -> Measurer:
        nonlocal measurer
        if measurer is None:
            if config.backend == "servers":
                measurer = ServerMeasurer(config, template_kwargs)
            else:
                measurer = EngineMeasurer(config, provenance, root, template_kwargs)
        return measurer

    common = _kept_settings(config, provenance, conversations, template_kwargs)
    reference_key: str | None = None
    answers: list[list[str]] | None = None
    measured: list[tuple[str, int | None, list[dict[str, Any]], dict[str, Any]]] = []
    turns = sum(1 + len(c["later"]) for c in conversations)
    for number, (method, k) in enumerate(configurations, start=1):
        name = item_name(method, k)
        item = kept.item(name, _configuration_settings(config, common, method, k, draft, reference_key))
        if method == "none":
            reference_key = item.key
        if only is not None and name not in only:
            if method == "none" and item.done is None and only - {OFFLINE_ESTIMATE}:
                raise Eagle3Error(
                    "evaluate --only: later turns follow the reference's greedy answers, and none is not measured yet: "
                    "measure it first (`eagle3 evaluate --only none` with its server up)"
                )
            if method == "none" and item.done is not None:
                answers = _answers(conversations, _kept_reference(item, config, conversations))
            continue
        where = "" if item.done is not None else measurer_for().where(method, k)
        status(
            f"evaluate: run {number}/{len(configurations)}: {method}"
            + (f" k={k}" if k else "")
            + f" on {turns} turns of {len(conversations)} prompts in {len(sets)} sets{where}"
            + (" (kept)" if item.done is not None else "")
        )
        outcomes = _measured(item, measurer_for, config, method, k, conversations, answers)
        if method == "none":
            answers = _answers(conversations, outcomes[0]["completions"])
        record = item.done
        if record is None:  # _measured keeps the record of what it measured
            raise RuntimeError(f"evaluate: {name} has no record of its measurement")
        measured.append((method, k, outcomes, record))
    if only is not None:
        status(
            f"evaluate: kept {', '.join(sorted(only))} in {EVALUATION_KEPT_DIR}; the stage's next run (`dvc repro "
            "evaluate`) measures the rest and writes the metrics"
        )
        return
    kept.forget_others({*names, OFFLINE_ESTIMATE})
    assert offline is not None
    write_metrics(root, config, sets, measured, offline, provenance, started, template_kwargs)


def _kept_reference(item: KeptItem, config: EvaluateParams, conversations) -> list[dict[str, Any]]:
    """The kept reference's greedy completions."""
    outcomes = _measured(item, _no_measurer, config, "none", None, conversations, None)
    return outcomes[0]["completions"]


def _no_measurer() -> NoReturn:
    raise AssertionError("a kept reference is never measured again here")


def write_metrics(
    root: Path, config: EvaluateParams, sets, measured, offline, provenance, started, template_kwargs: dict[str, Any]
) -> None:
    """metrics/eval.json, the plots and the summary lines, from every configuration's outcomes and records."""
    heldout, *rest = sets
    benchmark_sets = [s for s in rest if s.name != "long-context probe"]
    probe = next((s for s in rest if s.name == "long-context probe"), None)
    runs: list[dict[str, Any]] = []
    by_set: dict[str, dict[str, Any]] = {
        s.name: {**s.facts, "prompts": len(s.conversations), "results": [], "categories": {}} for s in benchmark_sets
    }
    long_context = None if probe is None else {**probe.facts, "results": []}
    reference: dict[tuple[int, int], list[int]] | None = None
    for method, k, outcomes, _ in measured:
        greedy = outcomes[0]
        if method == "none":
            reference = {(c["conversation"], c["turn"]): c["token_ids"] for c in greedy["completions"]}
        for outcome, compared in zip(outcomes, [reference] + [None] * (len(outcomes) - 1), strict=True):
            units = units_by_set(sets, outcome["completions"])
            runs.append(
                run_record(
                    summarize(method, k, outcome, units[0], compared, config.seed), outcome, method, k, config.seed
                )
            )
            for prompt_set, set_units in zip(benchmark_sets, units[1 : 1 + len(benchmark_sets)], strict=True):
                entry = by_set[prompt_set.name]
                entry["results"].append(summarize(method, k, outcome, set_units, compared, config.seed))
                if method == "none":
                    continue
                for category, members in units_by_category(prompt_set, set_units).items():
                    entry["categories"].setdefault(category, []).append(
                        summarize(method, k, outcome, members, None, config.seed)
                    )
            if long_context is not None:
                long_context["results"].append(summarize(method, k, outcome, units[-1], compared, config.seed))
    k, method = config.headline_k, config.draft_method
    draft_greedy = pick_run(runs, method, k, 0.0)
    ngram_greedy = find_run(runs, "ngram", k, 0.0)
    identical = draft_greedy["lossless_identical"]
    prompts = len(heldout.conversations)
    headline = {
        "k": k,
        "tokens_per_step_greedy": draft_greedy["tokens_per_step"],
        "ngram_tokens_per_step_greedy": ngram_greedy["tokens_per_step"] if ngram_greedy else None,
        "lossless_greedy": f"{identical}/{prompts}" if identical is not None else None,
        "benchmarks": {name: _headline(entry["results"], method, k) for name, entry in by_set.items()},
    }
    records = [record for _, _, _, record in measured]
    dtype = measured_dtype(config)
    metrics = EvalMetrics.model_validate(
        {
            "headline": headline,
            "lossless": {
                "identical": identical,
                "prompts": prompts,
                "rate": round(identical / prompts, 4) if identical is not None else None,
                "exact_expected": dtype == "float32",
                "dtype": dtype,
            },
            "offline_estimate": {
                **offline,
                "vllm_tokens_per_step": headline["tokens_per_step_greedy"],
                "gap": round(offline["tokens_per_step"] - headline["tokens_per_step_greedy"], 4),
            },
            "mla": mla_in_vllm(verifier_dir(root), root / DRAFT_DIR) if config.backend == "engines" else None,
            "runs": runs,
            "benchmarks": by_set,
            "long_context": long_context,
            "later_turns_follow": "none" if measured and measured[0][0] == "none" else "each configuration's own",
            "prompts": {
                "split": "heldout",
                "count": prompts,
                "prompt_hashes": [c["id"] for c in heldout.conversations],
            },
            "chat_template_kwargs": template_kwargs,
            "max_tokens": config.max_tokens,
            "repaired_vllm_temperature_expansion": any(r["repaired_token_expansion"] for r in records),
            "environment": _environment(config, records),
            "seconds": round(time.monotonic() - started, 1),
        }
    )
    write_json(root / EVAL_METRICS, metrics.as_json())
    write_plots(root, runs, config)
    write_benchmark_plots(root, results_by_set(runs, by_set), method, k)
    ngram_words = f" vs {headline['ngram_tokens_per_step_greedy']} with ngram" if ngram_greedy else ""
    status(
        f"evaluate: k={k} greedy: {headline['tokens_per_step_greedy']} tokens per verifier step with the "
        f"{METHOD_NAMES[method]} draft"
        f"{ngram_words}; lossless {headline['lossless_greedy'] or 'not measured (no reference run)'}; "
        f"offline estimate {offline['tokens_per_step']}"
    )
    for name, figures_at_k in headline["benchmarks"].items():
        status(f"evaluate: {name}: {figures_at_k}")
    by_context = ", ".join(
        f"{b['from_tokens']}-{b['to_tokens']}: {b['tokens_per_step']} ({b['completions']} turns)"
        for b in draft_greedy["all_sets_by_context"]
    )
    status(f"evaluate: k={k} greedy, tokens per verifier step by prompt tokens, every set: {by_context}")


def _environment(config: EvaluateParams, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the figures were computed: the engines' environment (the last configuration's), or this machine's
    (the offline estimate's) with each server's version, identity and whether it ran on this machine."""
    if config.backend == "engines":
        return records[-1]["environment"]
    return {**capture(), "backend": "servers", "servers": [record["server"] for record in records]}


def _answers(conversations: list[dict[str, Any]], completions: list[dict[str, Any]]) -> list[list[str]]:
    """Per conversation, the reference's greedy answers to every turn that has a later one."""
    texts = {(c["conversation"], c["turn"]): c["text"] for c in completions}
    return [[texts[(i, t)] for t in range(len(c["later"]))] for i, c in enumerate(conversations)]


def _headline(results: list[dict[str, Any]], method: str, k: int) -> dict[str, Any]:
    draft, ngram = find_run(results, method, k, 0.0), find_run(results, "ngram", k, 0.0)
    return {
        "mean_acceptance_length": draft["mean_acceptance_length"] if draft else None,
        "mean_acceptance_length_ci95": draft["mean_acceptance_length_ci95"] if draft else None,
        "tokens_per_step": draft["tokens_per_step"] if draft else None,
        "ngram_tokens_per_step": ngram["tokens_per_step"] if ngram else None,
    }
