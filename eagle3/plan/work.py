"""What the runbook's steps count, for `eagle3 plan`: the answers generate asks for and their tokens, the turns
evaluate asks each server, the serving rate here, with the source of each count. Each comes from what the project
already holds where it is there (the prepared prompts, the benchmark sets, generate's metrics: a count once its
stage has run), else from the params with the assumption said. Reads no model.
"""

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.errors import Eagle3Error
from eagle3.paths import (
    BENCHMARKS_DIR,
    BENCHMARKS_FILE,
    GENERATE_METRICS,
    HIDDEN_DIR,
    HIDDEN_INDEX,
    PREPARED_DIR,
    PROVENANCE,
    SYNTHETIC_DIR,
    VERIFIER_DIR,
    prepared_split,
)
from eagle3.plan.configured import Configured

if TYPE_CHECKING:
    from eagle3.params.params_file import Params


@dataclass(frozen=True)
class EvaluationRun:
    """One configuration evaluate measures: its server (or engine), the sampling runs it makes (greedy first, then
    sampled where evaluate.sampled_at puts them) and the turns each run asks."""

    configuration: str
    runs: int
    turns: int


@dataclass(frozen=True)
class RunWork:
    answers: int
    answers_source: str
    # per answer: generate's measured mean, else generate.sampling.max_tokens (a bound)
    answer_tokens: float
    answer_tokens_source: str
    evaluation: list[EvaluationRun]
    evaluation_source: str
    evaluate_max_tokens: int
    # evaluate.backend servers: each configuration a server started for it; engines: one engine each
    evaluate_on_servers: bool
    # extract.backend vllm: extraction (and preflight's extraction check) start an engine on the verifier
    extract_on_vllm: bool
    held_out_tokens: int  # the offline estimate's bound: evaluate.offline.max_tokens
    # What the runbook ships, measured where it is here: the outputs `dvc pull --with-deps generate benchmarks`
    # brings (the verifier's record, the prompts, the benchmark sets, the answers), and extract's (layout A).
    text_bytes: float | None = None
    states_bytes: float | None = None


def measured_verifier(root: Path) -> str | None:
    """The verifier the project's metrics were measured on: the verifier stage's record (what extract read, as long
    as `dvc status` is clean). None where the project has none."""
    try:
        return str(json.loads((root / PROVENANCE).read_text())["name"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _generated(root: Path, verifier: str | None) -> dict[str, Any] | None:
    """generate's metrics, where it ran on `verifier`."""
    try:
        metrics = json.loads((root / GENERATE_METRICS).read_text())
    except (OSError, ValueError):
        return None
    return metrics if isinstance(metrics, dict) and verifier and measured_verifier(root) == verifier else None


def count_answers(params: "Params", root: Path, verifier: str | None) -> tuple[int, str, float, str]:
    """(answers, source, tokens per answer, source): generate's own counts where it ran, else the prepared rows'
    user turns (generate.turns all) or one per row (last), else prepare's row limits at one answer per row."""
    config = params.generate
    generated = _generated(root, verifier)
    if generated is not None:
        answers = int(generated["assistant_turns"])
        tokens = int(generated["completion_tokens"]) / max(answers, 1)
        return answers, "generate's metrics", tokens, "generate's mean"
    bound = float(config.sampling.max_tokens)
    bound_source = "at most: generate.sampling.max_tokens"
    paths = [root / prepared_split(split) for split in config.splits]
    if all(path.is_file() for path in paths):
        from eagle3.formats.prepared import read_rows

        answers = 0
        for split in config.splits:
            for row in read_rows(root, split, columns=["messages"]):
                users = sum(message["role"] == "user" for message in row["messages"])
                answers += users if config.turns == "all" else min(users, 1)
        return answers, "the prepared user turns", bound, bound_source
    rows = (params.prepare.max_rows or 0) * ("train" in config.splits)
    rows += params.prepare.heldout_rows * ("heldout" in config.splits)
    if not rows:
        raise Eagle3Error("plan: prepare.max_rows is null and no prepared data is here to count the answers from")
    return rows, "prepare's rows, one answer each: assumed until prepare runs", bound, bound_source


def count_evaluation(params: "Params", root: Path) -> tuple[list[EvaluationRun], str]:
    """Per configuration evaluate measures, its runs and turns: the held-out prompts and benchmark sets it asks (read
    from the project where prepare and benchmarks ran), plus the long-context probes."""
    from eagle3.chat.evaluation_sets import prompt_sets

    config = params.evaluate
    probes = config.long_context.conversations if config.long_context is not None else 0
    if (root / prepared_split("heldout")).is_file() and (root / BENCHMARKS_FILE).is_file():
        sets = prompt_sets(root, config)
        turns = sum(1 + len(c["later"]) for s in sets for c in s.conversations) + probes
        source = ", ".join(s.name for s in sets) + (f", {probes} long-context probes" if probes else "")
    else:
        heldout = min(params.prepare.heldout_rows, config.max_prompts or params.prepare.heldout_rows)
        declared = [
            (s.name, min(s.records, s.max_prompts or s.records), s.turns_per_record or 1)
            for s in params.benchmarks.sets
            if s.records is not None
        ]
        undeclared = [s.name for s in params.benchmarks.sets if s.records is None]
        turns = heldout + probes + sum(records * per for _, records, per in declared)
        parts = [f"{heldout} held-out", *(f"{name} {records} x {per}" for name, records, per in declared)]
        source = ", ".join(parts) + f", {probes} long-context probes (benchmarks.sets[].records until they are made)"
        if undeclared:
            source += f"; {', '.join(undeclared)} counted once made (no records declared)"
    runs = [
        EvaluationRun(method if k is None else f"{method} k={k}", len(config.temperatures(k)), turns)
        for method, k in config.configurations()
    ]
    return runs, source


def _size(paths: list[Path]) -> float:
    return float(sum(f.stat().st_size for path in paths for f in path.rglob("*") if f.is_file()))


def shipped_sizes(root: Path, verifier: str | None) -> tuple[float | None, float | None]:
    """(text, states) bytes as the outputs here are, where their stages ran on `verifier`; None where not."""
    if verifier is None or measured_verifier(root) != verifier:
        return None, None
    text = [root / path for path in (VERIFIER_DIR, PREPARED_DIR, BENCHMARKS_DIR, SYNTHETIC_DIR)]
    states = root / HIDDEN_DIR
    return (
        _size(text) if all(path.is_dir() for path in text) else None,
        _size([states]) if (root / HIDDEN_INDEX).is_file() else None,
    )


def run_work(params: "Params", root: Path, verifier: str | None) -> RunWork:
    answers, answers_source, tokens, tokens_source = count_answers(params, root, verifier)
    evaluation, evaluation_source = count_evaluation(params, root)
    text_bytes, states_bytes = shipped_sizes(root, verifier)
    return RunWork(
        answers=answers,
        answers_source=answers_source,
        answer_tokens=tokens,
        answer_tokens_source=tokens_source,
        evaluation=evaluation,
        evaluation_source=evaluation_source,
        evaluate_max_tokens=params.evaluate.max_tokens,
        evaluate_on_servers=params.evaluate.backend == "servers",
        extract_on_vllm=params.extract.backend == "vllm",
        held_out_tokens=params.evaluate.offline.max_tokens,
        text_bytes=text_bytes,
        states_bytes=states_bytes,
    )


def serving_rate(args: argparse.Namespace, root: Path, configured: Configured) -> tuple[float | None, str]:
    """Output tokens/s of the verifier's server here: --serve-tokens-per-s, else what generate measured on it (its
    servers, or its engine), else None (assumed per GPU: eagle3/plan/model.py), with the source."""
    from eagle3.plan.model import SERVE_TOKENS_PER_S_PER_GPU

    if args.serve_tokens_per_s is not None:
        return args.serve_tokens_per_s, "--serve-tokens-per-s"
    try:
        metrics = json.loads((root / GENERATE_METRICS).read_text())
        rate = float(metrics["this_run"]["completion_tokens_per_s"])
    except (OSError, ValueError, KeyError, TypeError):
        rate = 0.0
    measured_on = measured_verifier(root)
    if rate > 0 and measured_on is not None and measured_on == configured.verifier_name:
        return rate, f"measured by generate on {measured_on} ({GENERATE_METRICS})"
    return None, (
        f"assumed: {SERVE_TOKENS_PER_S_PER_GPU:g} output tokens/s per GPU of a busy server (generate measures it; "
        "or --serve-tokens-per-s)"
    )


def measured_mean_tokens(args: argparse.Namespace, root: Path, configured: Configured) -> str:
    """--mean-tokens, else generate's: the tokens of a training sequence (its prompt with the history, and the
    answer) per assistant turn, where generate ran on the verifier the params configure; its source."""
    if args.mean_tokens is not None:
        return "--mean-tokens"
    path = root / GENERATE_METRICS
    verifier = measured_verifier(root)
    if verifier is None or verifier != configured.verifier_name:
        raise Eagle3Error(
            f"--mean-tokens: give the mean tokens per sample (e.g. 16384); generate has not run on "
            f"{configured.verifier_name or 'the planned verifier'} here to measure them"
            + (f" ({path} is {verifier}'s)" if verifier else "")
        )
    try:
        metrics = json.loads(path.read_text())
        turns = int(metrics["assistant_turns"])
        tokens = int(metrics["prompt_tokens"]) + int(metrics["completion_tokens"])
    except (OSError, ValueError, KeyError, TypeError):
        raise Eagle3Error(
            f"--mean-tokens: give the mean tokens per sample (e.g. 16384); {path} has no generate metrics to measure "
            "them from (`dvc repro generate` writes them)"
        ) from None
    if turns <= 0:
        raise Eagle3Error(f"--mean-tokens: {path} counts no assistant turns; give --mean-tokens")
    args.mean_tokens = tokens / turns
    return f"{GENERATE_METRICS}: {tokens:,} prompt and answer tokens over {turns:,} turns, measured on {verifier}"
