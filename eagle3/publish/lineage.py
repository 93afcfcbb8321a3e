"""The provenance record and model card that make a draft publishable (stage `report`).

Writes reports/lineage.json (for machines), reports/lineage.md (for people,
eagle3/publish/lineage_markdown.py) and the model card models/draft/README.md
(eagle3/publish/model_card.py). Everything comes from what the pipeline
recorded, never from what params.yaml says now:

- dvc.lock: every artifact (each stage's outs) with its md5, size and file
  count; the command, inputs and params that made it; the DAG and a Merkle
  lineage hash per artifact (eagle3/publish/dvc_graph.py).
- models/verifier/provenance.json and data/prepared/card.json: the inputs
  from outside (verifier weights, datasets) with their licenses and hashes,
  which pass the license gate (eagle3/publish/licenses.py).
- data/benchmarks/benchmarks.json: the prompt sets the draft was evaluated on, with their sources, hashes and
  licenses (listed, not gated: nothing was trained on them).
- metrics/eval.json and the exported draft's config.json: the card's numbers.

Nothing is published from a dirty workspace: `dvc status` must report every
other stage up to date first. `check` verifies a published record instead of
writing one: the workspace against dvc.lock, dvc.lock against
reports/lineage.json, the card's hash, and a verifier that lives outside the
repository against its recorded hashes.
"""

import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from eagle3.environment import capture, differences, read_environments
from eagle3.errors import Eagle3Error
from eagle3.files import dumps, read_json, write_text
from eagle3.formats.benchmarks import read_benchmarks
from eagle3.formats.eval_metrics import read_eval_metrics
from eagle3.formats.exported_method import aux_layer_ids, aux_layer_key
from eagle3.formats.prepared import read_card
from eagle3.formats.provenance import (
    describe_model_dir,
    read_provenance,
    verifier_dir,
    weights_fingerprint,
)
from eagle3.hashing import sha256_bytes, sha256_file
from eagle3.locked_environment import environment_differences
from eagle3.params.export import ExportParams
from eagle3.params.report import ReportParams
from eagle3.paths import (
    CHECKPOINT_DIR,
    DRAFT_DIR,
    EVAL_METRICS,
    HIDDEN_DIR,
    LINEAGE_JSON,
    LINEAGE_MD,
    MODEL_CARD,
    VERIFIER_DIR,
)
from eagle3.progress import status
from eagle3.publish import licenses, model_card
from eagle3.publish.dvc_graph import (
    REPORT_STAGE,
    build_graph,
    entry_paths,
    git_state,
    load_pipeline,
    mermaid,
    require_report_covers,
    stage_records,
    workspace_problems,
)
from eagle3.publish.lineage_markdown import render_markdown
from eagle3.publish.redaction import check_publishable, dvc_remotes, redact

SCHEMA = "eagle3.lineage/1"
# The verifier hashes that identify a verifier referenced outside the repo (eagle3/formats/provenance.py).
_VERIFIER_IDENTITY = (
    "config_sha256",
    "tokenizer_sha256",
    "chat_template_sha256",
    "weights_sha256",
    "weight_index_sha256",
)
# What the lineage keeps of each input in data/prepared/card.json (drop counts and examples stay in the card).
_DATASET_FIELDS = (
    "name",
    "kind",
    "license",
    "path",
    "sha256",
    "dataset",
    "revision",
    "config",
    "split",
    "fingerprint",
    "rows_read",
    "rows_valid",
)


def external_inputs(root: Path, sub_source_licenses: dict[str, str]) -> dict[str, Any]:
    provenance = read_provenance(root).to_json()
    card = read_card(root)
    datasets = [
        {key: item[key] for key in _DATASET_FIELDS if item.get(key) is not None} for item in card.get("inputs", [])
    ]
    # A sub-source named like its input is the whole input, not a part of it.
    present = {
        name: counts for name, counts in card.get("by_source", {}).items() if name not in {d["name"] for d in datasets}
    }
    sub_sources = [
        {"name": name, "rows": sum(counts.values()), "license": sub_source_licenses.get(name)}
        for name, counts in sorted(present.items())
    ]
    return {
        "verifier": provenance,
        "datasets": datasets,
        "sub_sources": sub_sources,
        "unused_sub_source_licenses": sorted(set(sub_source_licenses) - set(present)),
        "rows_out": card.get("rows_out", {}),
        "benchmarks": benchmark_inputs(root),
    }


def benchmark_inputs(root: Path) -> list[dict[str, Any]]:
    """The prompt sets the draft was evaluated on (data/benchmarks): source with its hashes, license and counts.
    Evaluation inputs, not training data: listed with their licenses, not put through the license gate."""
    return [
        {
            "name": entry["name"],
            "license": entry.get("license"),
            "format": entry.get("format"),
            "source": entry.get("source"),
            "records": entry.get("records"),
            "contaminated": (entry.get("contaminated") or {}).get("count"),
            "capped": entry.get("capped"),
            "prompts": len(entry["prompts"]),
        }
        for entry in read_benchmarks(root)
    ]


def licensed_inputs(inputs: dict[str, Any]) -> list[licenses.LicensedInput]:
    items = [
        licenses.LicensedInput(
            "verifier", inputs["verifier"].get("name", str(VERIFIER_DIR)), inputs["verifier"].get("license")
        )
    ]
    items += [licenses.LicensedInput("dataset", item["name"], item.get("license")) for item in inputs["datasets"]]
    items += [
        licenses.LicensedInput("sub-source", item["name"], item["license"])
        for item in inputs["sub_sources"]
        if item["license"]
    ]
    return items


def read_draft_config(root: Path) -> dict[str, Any]:
    path = root / DRAFT_DIR / "config.json"
    config = read_json(path, "a card needs the exported draft: run the export stage (`dvc repro`) first")
    if not aux_layer_ids(config):
        raise Eagle3Error(
            f"{path.as_posix()}: {aux_layer_key(config)} missing; vLLM would silently use the wrong layers; re-export "
            "the draft"
        )
    return config


def publish(config: ReportParams, export: ExportParams, root: Path) -> None:
    definitions, lock = load_pipeline(root)
    require_report_covers(definitions)
    upstream = [name for name in definitions if name != REPORT_STAGE]
    not_run = [name for name in upstream if name not in lock]
    if not_run:
        raise Eagle3Error(f"dvc.lock: stage(s) {', '.join(not_run)} have not run; run `dvc repro` first")
    problems = workspace_problems(root, upstream)
    if problems:
        raise Eagle3Error(
            f"workspace does not match dvc.lock, not publishing: {'; '.join(problems)}; run `dvc repro` "
            "(or `dvc checkout` to restore the recorded outputs) first"
        )
    records = stage_records(lock, root)
    graph = build_graph(records)
    inputs = redact(external_inputs(root, config.sub_source_licenses), root)
    candidates = licensed_inputs(inputs)
    decisions = licenses.gate(candidates, config.license_overrides)
    evaluation = read_eval_metrics(root)
    draft_config = read_draft_config(root)

    draft_license = licenses.normalize(config.license or inputs["verifier"].get("license"))
    report_outs = entry_paths(definitions[REPORT_STAGE].get("outs"))
    code_paths = sorted(graph["sources"])
    lineage = {
        "schema": SCHEMA,
        "code": {
            **git_state(root, code_paths, [*graph["artifacts"], *report_outs]),
            "eagle3": metadata.version("eagle3"),
            "dvc": metadata.version("dvc"),
        },
        "remotes": dvc_remotes(root),
        "stages": records,
        "order": graph["order"],
        "dag_mermaid": mermaid(graph["order"], graph["edges"]),
        "artifacts": graph["artifacts"],
        "sources": graph["sources"],
        "inputs": inputs,
        "licenses": {
            "draft": draft_license,
            "decisions": decisions,
            "unused_overrides": licenses.unused_overrides(candidates, config.license_overrides),
        },
        "evaluation": {"path": EVAL_METRICS.as_posix(), "headline": evaluation.headline.model_dump(mode="json")},
        "training_states": training_states(root, records),
        "environments": redact(artifact_environments(root, graph["artifacts"]), root),
    }
    card = model_card.render(lineage, evaluation, draft_config, config, export.num_speculative_tokens)
    lineage["card"] = {"path": MODEL_CARD.as_posix(), "sha256": sha256_bytes(card.encode("utf-8"))}
    outputs = {
        LINEAGE_JSON.as_posix(): dumps(lineage),
        LINEAGE_MD.as_posix(): render_markdown(lineage),
        MODEL_CARD.as_posix(): card,
    }
    check_publishable(outputs, root)
    for name, text in outputs.items():
        write_text(root / name, text)
    headline = evaluation.headline
    status(
        f"lineage: {len(graph['artifacts'])} artifacts from {len(records)} stages, {len(decisions)} licensed inputs "
        f"({sum(1 for d in decisions if d['override_reason'])} by override); card: "
        f"{headline.tokens_per_step_greedy:.2f} tokens/step at k={headline.k}"
        + (
            f" vs ngram {headline.ngram_tokens_per_step_greedy:.2f}"
            if headline.ngram_tokens_per_step_greedy is not None
            else ""
        )
        + " -> "
        f"{', '.join(outputs)}"
    )


def training_states(root: Path, records: dict[str, Any]) -> dict[str, Any] | None:
    """How the states the draft trained on were made: stored by extract (data/hidden) or streamed by train
    (train.hidden_states), with the layers, compute dtype and engine, from the run keys and environment records
    of the outputs that hold them; None for a pipeline without those stages."""
    train = records.get("train", {}).get("params", {}).get("params.yaml", {}).get("train", {})
    streamed = train.get("hidden_states", "stored") == "streamed"
    if ("train" if streamed else "extract") not in records:
        return None
    made_in = root / (CHECKPOINT_DIR if streamed else HIDDEN_DIR)
    run = read_json(made_in / "run.json", "run `dvc repro` first")["settings"]
    facts = run["streamed_states"] if streamed else {**run, "backend": run["extract"]["backend"]}
    package = "transformers" if facts["backend"] == "hf" else "vllm"
    versions = sorted(
        {
            f"{name} {version}"
            for entry in read_environments(made_in)
            for name, version in entry["environment"].get("packages", {}).items()
            if name.split("-")[0] == package
        }
    )
    return {
        "mode": "streamed" if streamed else "stored",
        "layer_ids": facts["layer_ids"],
        "compute_dtype": facts["compute_dtype"],
        "backend": facts["backend"],
        "engine": versions,
    }


def check(root: Path) -> None:
    """Verify the published record against the workspace; print every problem, fail if there is one."""
    definitions, lock = load_pipeline(root)
    require_report_covers(definitions)
    problems = [f"not run: stage {name}" for name in definitions if name not in lock]
    absent: list[str] = []
    problems += [
        f"dirty: {problem}"
        for problem in workspace_problems(root, [name for name in definitions if name in lock], absent)
    ]
    path = root / LINEAGE_JSON
    recorded: dict[str, Any] = {}
    if not path.is_file():
        problems.append(f"missing: {LINEAGE_JSON.as_posix()} (run `dvc repro`)")
    else:
        recorded = read_json(path, "")
        current = stage_records(lock, root)
        for name in sorted(set(current) | set(recorded.get("stages", {}))):
            if recorded.get("stages", {}).get(name) != current.get(name):
                problems.append(f"stale: {LINEAGE_JSON.as_posix()} records stage {name} differently from dvc.lock")
        card = recorded.get("card", {})
        card_path = root / card.get("path", str(MODEL_CARD))
        if not card_path.is_file():
            problems.append(f"missing: {card_path.relative_to(root).as_posix()}")
        elif sha256_file(card_path) != card.get("sha256"):
            problems.append(
                f"modified: {card_path.relative_to(root).as_posix()} differs from the sha256 in "
                f"{LINEAGE_JSON.as_posix()}"
            )
        problems += _verifier_problems(root, recorded.get("inputs", {}).get("verifier", {}))
    for warning in environment_warnings(recorded):
        print(f"warning: {warning}", file=sys.stderr)
    if absent:
        print(f"not in this workspace, so not verified here (`dvc pull` them to): {', '.join(sorted(absent))}")
    if problems:
        for problem in problems:
            print(problem)
        raise Eagle3Error(
            f"lineage check: {len(problems)} problem(s), the workspace is not what the lineage describes (listed above)"
        )
    unverified = f" ({len(absent)} output(s) not here, listed above)" if absent else ""
    status(f"lineage check: {len(lock)} stages and every recorded hash match the workspace{unverified}")


def artifact_environments(root: Path, artifacts: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """{artifact: [{environment, made}]} for every artifact that records the environment that made it: resumable
    outputs in their environments/ directory, metrics files in their `environment` field."""
    found: dict[str, list[dict[str, Any]]] = {}
    for path in artifacts:
        target = root / path
        entries: list[dict[str, Any]] = []
        if target.is_dir():
            entries = read_environments(target)
        elif target.suffix == ".json" and target.is_file():
            data = read_json(target, "")
            if isinstance(data, dict) and isinstance(data.get("environment"), dict):
                entries = [{"environment": data["environment"], "made": [target.name]}]
        if entries:
            found[path] = entries
    return found


def environment_warnings(recorded: dict[str, Any]) -> list[str]:
    """Artifacts made on another machine or software stack than this one: rerunning their stage here will not
    reproduce their bytes (docs/reproducibility.md); then every way this environment differs from its lock
    (eagle3/locked_environment.py): what a stage makes here is made off-lock. Warnings, not problems: the record
    itself is intact."""
    warnings = []
    environments = recorded.get("environments") or {}
    if environments:
        current = capture()
        for path, entries in sorted(environments.items()):
            stage = (recorded.get("artifacts", {}).get(path) or {}).get("stage", "?")
            for entry in entries:
                changed = differences(entry["environment"], current)
                if changed:
                    warnings.append(
                        f"{path} (stage {stage}) was made with {'; '.join(changed)} (recorded -> here): rerunning "
                        f"{stage} here will not reproduce it byte for byte; `dvc pull` it instead"
                    )
    checked = environment_differences()
    if checked is not None:
        lock, found = checked
        warnings += [
            f"this environment differs from {lock}: {difference}: a stage run here runs off-lock; run `make setup`"
            for difference in found
        ]
    return warnings


def _verifier_problems(root: Path, recorded: dict[str, Any]) -> list[str]:
    """A verifier referenced outside the repo is not hashed by DVC: re-hash its identity files."""
    if (recorded.get("source") or {}).get("kind") != "local":
        return []
    try:
        model_dir = verifier_dir(root)
        current = {**describe_model_dir(model_dir, True), **weights_fingerprint(model_dir)}
    except Eagle3Error as exc:
        return [f"verifier: {exc}"]
    return [
        f"modified: verifier {key} is {current.get(key)}, the lineage records {recorded.get(key)} (run `dvc repro -f "
        "verifier`)"
        for key in _VERIFIER_IDENTITY
        if recorded.get(key) != current.get(key)
    ]
