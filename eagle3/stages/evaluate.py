"""Stage `evaluate`: what users judge a draft by, measured inside vLLM on held-out prompts.

Configurations, all on the same prompts: the verifier alone (`none`, the lossless reference); the exported draft
(`eagle3`) and vLLM's `ngram` proposer (the baseline to beat) at each k. Each runs greedy, and at
`evaluate.temperature` where `evaluate.sampled_at` says (`none` always, the headline k by default).
Two backends measure them alike: `engines` starts a fresh in-process vLLM engine per configuration
(eagle3/engines/speculative.py; `evaluate.methods` x `num_speculative_tokens` choose which, so a GPU user can run
exactly one), `servers` sends the prompts to running `vllm serve` endpoints labelled with what each serves and reads
their Prometheus counters around its own requests (eagle3/engines/served_speculation.py).

Headline: tokens per verifier step = output tokens / (output tokens - accepted tokens). A step on which a
method proposed nothing still counts as one token, so methods that often propose nothing (ngram) are not
flattered. vLLM's own "mean acceptance length" (1 + accepted / drafts) averages only over steps that had a
draft; it is reported too, under that name. Acceptance per position = accepted at position i / drafts.
Lossless: greedy completions with speculation identical to the verifier's own greedy completions, as a share.
Exactness is expected only in float32 (the CPU default); in bf16, verifying k+1 tokens at once rounds differently
from decoding one and near-tied greedy tokens flip, so there it is a measured agreement (`lossless` in the metrics).
Output tokens/s is wall time on this machine: on CPU, speculation is usually slower in wall time.

Offline estimate: eagle3/modeling/offline_estimate.py.

Prompt sets: the held-out split from prepare (first user turn; the stage refuses to run if any of them is also a
training prompt) and each benchmark of data/benchmarks (stage `benchmarks`: MT-bench, HumanEval, ...). One engine
per configuration serves every set; a multi-turn benchmark is asked turn by turn, every method after the same
history, the verifier's own greedy answers to the earlier turns (the `none` run, measured first). Per set (and per
category where the set has them): tokens per verifier step, mean acceptance length (the published drafts'
figure) and acceptance by position, each with a 95% bootstrap interval over the set's prompts
(eagle3/engines/acceptance.py). `runs` and the headline are the held-out set's, as before.
"""

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3.engines.acceptance import counters_agree, figures
from eagle3.engines.served_speculation import Retries, Served, ServerClient, check_server_info
from eagle3.engines.server_access import auth_headers
from eagle3.engines.speculative import Engine, Request, Sampling, Speculation
from eagle3.engines.speculative import run as run_engine
from eagle3.engines.turn_by_turn import ask_turn_by_turn
from eagle3.engines.vllm_env import on_cpu_build
from eagle3.environment import capture
from eagle3.errors import Eagle3Error
from eagle3.files import write_json
from eagle3.formats.benchmarks import read_benchmarks
from eagle3.formats.eval_metrics import EvalMetrics
from eagle3.formats.hf_config import read_config, text_config, uses_mla
from eagle3.formats.prepared import read_rows
from eagle3.formats.provenance import Provenance, read_provenance, verifier_dir
from eagle3.modeling.offline_estimate import offline_estimate
from eagle3.params.base import StageParams
from eagle3.params.evaluate import EvaluateParams
from eagle3.paths import DRAFT_DIR, EVAL_METRICS, PREPARED_DIR, prepared_split
from eagle3.precision import engine_device_type, resolve
from eagle3.progress import step
from eagle3.publish.evaluation_plots import find_run, pick_run, results_by_set, write_benchmark_plots, write_plots


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


@dataclass(frozen=True)
class PromptSet:
    name: str
    # Each: {"id", "category", "first" (chat messages of the first turn), "later" (the user turns after it)}.
    conversations: list[dict[str, Any]]
    # A benchmark's facts for the metrics: license, records read, dropped as training prompts, over the cap.
    facts: dict[str, Any] = field(default_factory=dict)


def prompt_sets(root: Path, config: EvaluateParams) -> list[PromptSet]:
    """The held-out set first, then each benchmark set in data/benchmarks' order."""
    hashes, prompts = heldout_prompts(root, config.max_prompts)
    sets = [
        PromptSet(
            "heldout",
            [{"id": h, "category": None, "first": p, "later": []} for h, p in zip(hashes, prompts, strict=True)],
        )
    ]
    for entry in read_benchmarks(root):
        conversations = [
            {
                "id": prompt["id"],
                "category": prompt["category"],
                "first": [{"role": "user", "content": prompt["turns"][0]}],
                "later": prompt["turns"][1:],
            }
            for prompt in entry["prompts"]
        ]
        facts = {
            "license": entry["license"],
            "records": entry["records"],
            "contaminated": entry["contaminated"]["count"],
            "capped": entry["capped"],
        }
        sets.append(PromptSet(entry["name"], conversations, facts))
    return sets


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


def _run_record(summary: dict[str, Any], outcome: dict[str, Any], method: str, k: int | None) -> dict[str, Any]:
    """A held-out `runs` entry: its figures, and the wall time of the configuration's whole run (every set: they
    share its batches), with the output tokens/s over all of them."""
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
        "output_tokens_per_s": round(tokens / outcome["seconds"], 1) if outcome["seconds"] > 0 else None,
        "seconds": outcome["seconds"],
    }


def run(params: Params, root: Path, options=None) -> None:
    config = params.evaluate
    provenance = read_provenance(root)
    draft_dir = root / DRAFT_DIR
    if not (draft_dir / "config.json").is_file():
        raise Eagle3Error(f"{draft_dir}: no exported draft; run `dvc repro export` (or `eagle3 export`) first")
    sets = prompt_sets(root, config)
    conversations = [c for prompt_set in sets for c in prompt_set.conversations]
    heldout = sets[0]
    if config.backend == "servers":
        measurer = ServerMeasurer(config)
    else:
        measurer = EngineMeasurer(config, provenance, root)
    runs: list[dict[str, Any]] = []
    by_set: dict[str, dict[str, Any]] = {
        s.name: {**s.facts, "prompts": len(s.conversations), "results": [], "categories": {}} for s in sets[1:]
    }
    reference: dict[tuple[int, int], list[int]] | None = None
    answers: list[list[str]] | None = None
    started = time.monotonic()
    configurations = config.configurations()
    turns = sum(1 + len(c["later"]) for c in conversations)
    for number, (method, k) in enumerate(configurations, start=1):
        step(
            f"evaluate: run {number}/{len(configurations)}: {method}"
            + (f" k={k}" if k else "")
            + f" on {turns} turns of {len(conversations)} prompts in {len(sets)} sets{measurer.where(method, k)}"
        )
        outcomes = measurer.measure(method, k, conversations, answers, config.temperatures(k))
        greedy = outcomes[0]
        if method == "none":
            reference = {(c["conversation"], c["turn"]): c["token_ids"] for c in greedy["completions"]}
            answers = _answers(conversations, greedy["completions"])
        for outcome, compared in zip(outcomes, [reference] + [None] * (len(outcomes) - 1), strict=True):
            units = _units(sets, outcome["completions"])
            runs.append(
                _run_record(summarize(method, k, outcome, units["heldout"], compared, config.seed), outcome, method, k)
            )
            for prompt_set in sets[1:]:
                entry = by_set[prompt_set.name]
                entry["results"].append(summarize(method, k, outcome, units[prompt_set.name], compared, config.seed))
                if method == "none":
                    continue
                for category, members in _categories(prompt_set, units[prompt_set.name]).items():
                    entry["categories"].setdefault(category, []).append(
                        summarize(method, k, outcome, members, None, config.seed)
                    )
    k = config.headline_k
    step(f"evaluate: offline estimate at k={k} from held-out hidden states")
    offline = offline_estimate(root, k, config.offline)
    draft_greedy = pick_run(runs, "eagle3", k, 0.0)
    ngram_greedy = find_run(runs, "ngram", k, 0.0)
    identical = draft_greedy["lossless_identical"]
    prompts = len(heldout.conversations)
    headline = {
        "k": k,
        "tokens_per_step_greedy": draft_greedy["tokens_per_step"],
        "ngram_tokens_per_step_greedy": ngram_greedy["tokens_per_step"] if ngram_greedy else None,
        "lossless_greedy": f"{identical}/{prompts}" if identical is not None else None,
        "benchmarks": {name: _headline(entry["results"], k) for name, entry in by_set.items()},
    }
    metrics = EvalMetrics.model_validate(
        {
            "headline": headline,
            "lossless": {
                "identical": identical,
                "prompts": prompts,
                "rate": round(identical / prompts, 4) if identical is not None else None,
                "exact_expected": measurer.dtype == "float32",
                "dtype": measurer.dtype,
            },
            "offline_estimate": {
                **offline,
                "vllm_tokens_per_step": headline["tokens_per_step_greedy"],
                "gap": round(offline["tokens_per_step"] - headline["tokens_per_step_greedy"], 4),
            },
            "mla": measurer.mla,
            "runs": runs,
            "benchmarks": by_set,
            "later_turns_follow": "none" if ("none", None) in configurations else "each configuration's own",
            "prompts": {
                "split": "heldout",
                "count": prompts,
                "prompt_hashes": [c["id"] for c in heldout.conversations],
            },
            "max_tokens": config.max_tokens,
            "repaired_vllm_temperature_expansion": measurer.repaired,
            "environment": measurer.environment,
            "seconds": round(time.monotonic() - started, 1),
        }
    )
    write_json(root / EVAL_METRICS, metrics.as_json())
    write_plots(root, runs, config)
    write_benchmark_plots(root, results_by_set(runs, by_set), k)
    ngram_words = f" vs {headline['ngram_tokens_per_step_greedy']} with ngram" if ngram_greedy else ""
    step(
        f"evaluate: k={k} greedy: {headline['tokens_per_step_greedy']} tokens per verifier step with the draft"
        f"{ngram_words}; lossless {headline['lossless_greedy'] or 'not measured (no reference run)'}; "
        f"offline estimate {offline['tokens_per_step']}"
    )
    for name, figures_at_k in headline["benchmarks"].items():
        step(f"evaluate: {name}: {figures_at_k}")


def _answers(conversations: list[dict[str, Any]], completions: list[dict[str, Any]]) -> list[list[str]]:
    """Per conversation, the reference's greedy answers to every turn that has a later one."""
    texts = {(c["conversation"], c["turn"]): c["text"] for c in completions}
    return [[texts[(i, t)] for t in range(len(c["later"]))] for i, c in enumerate(conversations)]


def _units(sets: list[PromptSet], completions: list[dict[str, Any]]) -> dict[str, list[list[dict[str, Any]]]]:
    """Per set, each prompt's completions (its turns in order)."""
    by_conversation: dict[int, list[dict[str, Any]]] = {}
    for completion in completions:
        by_conversation.setdefault(completion["conversation"], []).append(completion)
    units, first = {}, 0
    for prompt_set in sets:
        count = len(prompt_set.conversations)
        units[prompt_set.name] = [
            sorted(by_conversation[i], key=lambda c: c["turn"]) for i in range(first, first + count)
        ]
        first += count
    return units


def _categories(prompt_set: PromptSet, units: list[list[dict[str, Any]]]) -> dict[str, list[list[dict[str, Any]]]]:
    grouped: dict[str, list[list[dict[str, Any]]]] = {}
    for conversation, unit in zip(prompt_set.conversations, units, strict=True):
        if conversation["category"] is not None:
            grouped.setdefault(conversation["category"], []).append(unit)
    return grouped


def _headline(results: list[dict[str, Any]], k: int) -> dict[str, Any]:
    draft, ngram = find_run(results, "eagle3", k, 0.0), find_run(results, "ngram", k, 0.0)
    return {
        "mean_acceptance_length": draft["mean_acceptance_length"] if draft else None,
        "mean_acceptance_length_ci95": draft["mean_acceptance_length_ci95"] if draft else None,
        "tokens_per_step": draft["tokens_per_step"] if draft else None,
        "ngram_tokens_per_step": ngram["tokens_per_step"] if ngram else None,
    }


def mla_in_vllm(model_dir: Path) -> dict[str, Any] | None:
    """How an MLA verifier (Kimi-K2.5) runs in these engines; None for other attention.

    vLLM-CPU cannot run an EAGLE-3 draft beside MLA: its CPU MLA backend allows only KV blocks of 16 and the
    draft's attention backend only multiples of 32 ("No common block size for 16"). There every configuration,
    the reference included, runs with VLLM_MLA_DISABLE=1 (MLA computed as plain attention), so the lossless check
    still compares like with like. On GPUs vLLM serves Kimi-K2.5 drafts with MLA on, and so do these engines."""
    if not uses_mla(text_config(read_config(model_dir))):
        return None
    if not on_cpu_build():
        return {"disabled": False, "reason": None}
    return {
        "disabled": True,
        "reason": "vLLM-CPU has no KV block size common to its MLA backend (16) and the draft's attention "
        "(multiples of 32); every configuration ran with VLLM_MLA_DISABLE=1",
    }


class EngineMeasurer:
    """Each configuration in a fresh in-process vLLM engine (eagle3/engines/speculative.py)."""

    def __init__(self, config: EvaluateParams, provenance: Provenance, root: Path):
        self.config, self.draft_dir = config, root / DRAFT_DIR
        self.dtype = resolve(config.vllm.dtype, engine_device_type())
        model_dir = verifier_dir(root)
        self.mla = mla_in_vllm(model_dir)
        self.engine = Engine(
            verifier=str(model_dir),
            max_model_len=config.vllm.max_model_len,
            cpu_kvcache_space_gib=config.vllm.cpu_kvcache_space_gib,
            gpu_memory_utilization=config.vllm.gpu_memory_utilization,
            enforce_eager=config.vllm.enforce_eager,
            tensor_parallel_size=config.vllm.tensor_parallel_size,
            dtype=self.dtype,
            trust_remote_code=provenance.trust_remote_code,
            seed=config.seed,
            disable_mla=bool(self.mla and self.mla["disabled"]),
        )
        self.repaired = False
        self.environment: dict[str, Any] | None = None

    def where(self, method: str, k: int | None) -> str:
        return " (VLLM_MLA_DISABLE=1)" if self.engine.disable_mla else ""

    def measure(
        self, method: str, k: int | None, conversations: list[dict[str, Any]], answers, temperatures: tuple[float, ...]
    ) -> list[dict[str, Any]]:
        """One run per temperature (greedy first) over every conversation, turn by turn (after `answers`, or its
        own greedy ones)."""
        config = self.config
        speculation = None
        if method == "eagle3":
            speculation = Speculation("eagle3", k, str(self.draft_dir))
        elif method == "ngram":
            speculation = Speculation(
                "ngram",
                k,
                prompt_lookup_min=config.ngram.prompt_lookup_min,
                prompt_lookup_max=config.ngram.prompt_lookup_max,
            )
        samplings = [Sampling(temperature, config.max_tokens, config.seed) for temperature in temperatures]
        request = Request(
            self.engine,
            speculation,
            [c["first"] for c in conversations],
            samplings,
            later_turns=[c["later"] for c in conversations],
            answers=answers,
        )
        outcomes = run_engine(request)
        self.repaired |= any(o["repaired_token_expansion"] for o in outcomes)
        self.environment = outcomes[-1]["environment"]
        return outcomes


class ServerMeasurer:
    """Each configuration on the running server labelled with it (eagle3/engines/served_speculation.py)."""

    def __init__(self, config: EvaluateParams):
        assert config.servers is not None
        servers = config.servers
        headers = auth_headers(servers.api_key_env, "evaluate.servers.api_key_env")
        retries = Retries(servers.concurrency, servers.timeout_s, servers.max_retries, servers.backoff_s)
        self.config = config
        # What each server runs is its own: no float32 exactness to expect.
        self.dtype = "as served"
        self.mla = None  # the servers' business: their own flags
        self.clients = {}
        reported = []
        for endpoint in servers.endpoints:
            served = Served(str(endpoint.url).rstrip("/"), endpoint.model, endpoint.serves, endpoint.k)
            client = ServerClient(served, retries, headers)
            identity = check_server_info(served, client.server_info())
            self.clients[(endpoint.serves, endpoint.k)] = client
            # URLs stay out of the record: it is published.
            reported.append({"serves": served.label, "vllm": client.version(), "identity": identity})
        self.repaired = False
        # The servers computed the vLLM figures; this machine ran the offline estimate.
        self.environment = {**capture(), "backend": "servers", "servers": reported}

    def where(self, method: str, k: int | None) -> str:
        return f" at {self.clients[(method, k)].served.root}"

    def measure(
        self, method: str, k: int | None, conversations: list[dict[str, Any]], answers, temperatures: tuple[float, ...]
    ) -> list[dict[str, Any]]:
        """As EngineMeasurer.measure, on the server labelled (method, k)."""
        client, config = self.clients[(method, k)], self.config

        def ask(messages, number):
            batch = client.measure(messages, temperatures[number], config.max_tokens, config.seed)
            return batch["completions"], batch["counters"], batch["seconds"]

        results = ask_turn_by_turn(
            [c["first"] for c in conversations], [c["later"] for c in conversations], answers, len(temperatures), ask
        )
        for temperature, result in zip(temperatures, results, strict=True):
            result.update(
                sampling={"temperature": temperature, "max_tokens": config.max_tokens, "seed": config.seed},
                repaired_token_expansion=False,
            )
        return results
