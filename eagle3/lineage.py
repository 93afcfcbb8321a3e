"""Stage `report` / `eagle3 lineage`: the provenance record and model card that make a draft publishable.

Writes reports/lineage.json (for machines), reports/lineage.md (for people)
and the model card models/draft/README.md. Everything comes from what the
pipeline recorded, never from what params.yaml says now:

- dvc.lock: every artifact (each stage's outs) with its md5, size and file
  count; the command, inputs and params that made it. Generic over stages:
  whatever dvc.yaml holds, the DAG is rebuilt from which deps are which
  stage's outs. Each artifact gets a `lineage_sha256`, a Merkle hash over its
  own hash, its stage's command and params and its inputs' hashes and
  lineages: it changes exactly when the artifact or anything upstream of it
  changes.
- models/verifier/provenance.json and data/prepared/card.json: the inputs
  from outside (verifier weights, datasets) with their licenses and hashes,
  which pass the license gate (eagle3/licenses.py).
- metrics/eval.json and the exported draft's config.json: the card's numbers.

Nothing is published from a dirty workspace: `dvc status` must report every
other stage up to date first. `eagle3 lineage --check` verifies a published
record instead of writing one: the workspace against dvc.lock, dvc.lock
against reports/lineage.json, the card's hash, and a verifier that lives
outside the repository against its recorded hashes.

The report stage reads dvc.lock but does not declare it as a dep: DVC rewrites
dvc.lock after every stage, the report's own entry included, so that dep
would be stale after every run. Instead the stage depends on everything the
other stages' dvc.lock entries are made from (their deps, outs and params),
so it reruns whenever their lock entries change; `require_report_covers`
enforces that whenever a stage is added. The one gap: DVC refuses dvc.yaml as
a dep, so a changed command whose stage then writes identical outputs leaves
the record stale; `--check` reports that.
"""

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from eagle3 import licenses, model_card
from eagle3.config import read_yaml
from eagle3.errors import Eagle3Error
from eagle3.files import dumps
from eagle3.hashing import sha256_bytes, sha256_file
from eagle3.layout import DRAFT_DIR, METRICS_DIR, PREPARED_DIR, PROVENANCE, VERIFIER_DIR, read_provenance, verifier_dir
from eagle3.progress import step
from eagle3.redaction import check_publishable, dvc_remotes, redact

REPORT_STAGE = "report"
REPORTS_DIR = Path("reports")
LINEAGE_JSON = REPORTS_DIR / "lineage.json"
LINEAGE_MD = REPORTS_DIR / "lineage.md"
EVAL_METRICS = METRICS_DIR / "eval.json"
SCHEMA = "eagle3.lineage/1"
# The verifier hashes that identify a verifier referenced outside the repo (see eagle3/verifier.py).
_VERIFIER_IDENTITY = (
    "config_sha256",
    "tokenizer_sha256",
    "chat_template_sha256",
    "weight_index_sha256",
    "weight_headers_sha256",
)


# What the lineage keeps of each input in data/prepared/card.json (drop counts and examples stay in the card).
_DATASET_FIELDS = (
    "name", "kind", "license", "path", "sha256", "dataset", "revision", "config", "split", "fingerprint", "rows_read", "rows_valid",
)


def run(params, root: Path, options=None) -> None:
    if getattr(options, "check", False):
        check(root)
    else:
        publish(params, root)


# ---------------------------------------------------------------- the pipeline as DVC recorded it


def load_pipeline(root: Path) -> tuple[dict[str, dict], dict[str, dict]]:
    """(stage definitions from dvc.yaml, stage entries from dvc.lock), both keyed by stage name in dvc.yaml order."""
    dvc_yaml = read_yaml(root / "dvc.yaml")
    definitions = (dvc_yaml or {}).get("stages") or {}
    for name, definition in definitions.items():
        if not isinstance(definition, dict) or "cmd" not in definition:
            raise Eagle3Error(f"dvc.yaml: stage {name!r} has no plain `cmd` (foreach/matrix stages are not supported)")
    lock_path = root / "dvc.lock"
    locked = (read_yaml(lock_path) or {}).get("stages", {}) if lock_path.is_file() else {}
    return definitions, {name: locked[name] for name in definitions if name in locked}


def _norm(path: str) -> str:
    return os.path.normpath(path).replace(os.sep, "/")


def _covers(parent: str, child: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def _entry_paths(items: Iterable[Any] | None) -> list[str]:
    """Paths from a dvc.yaml deps/outs/metrics/plots list, whose items are a path or {path: options}."""
    paths = []
    for item in items or []:
        paths.extend([item] if isinstance(item, str) else list(item))
    return [_norm(path) for path in paths]


def _param_keys(items: Iterable[Any] | None) -> dict[str, list[str] | None]:
    """{params file: keys, or None for the whole file} from a dvc.yaml params list."""
    keys: dict[str, list[str] | None] = {}
    for item in items or []:
        if isinstance(item, str):
            if keys.get("params.yaml", []) is not None:
                keys.setdefault("params.yaml", []).append(item)
            continue
        for file, listed in item.items():
            if not listed:
                keys[file] = None
            elif keys.get(file, []) is not None:
                keys.setdefault(file, []).extend(listed)
    return keys


def require_report_covers(definitions: dict[str, dict]) -> None:
    """The report must depend on every other stage's deps, outs and params, or it would go stale silently."""
    if REPORT_STAGE not in definitions:
        raise Eagle3Error(f"dvc.yaml: no `{REPORT_STAGE}` stage; the lineage is made by that stage (see README)")
    report = definitions[REPORT_STAGE]
    report_deps = _entry_paths(report.get("deps"))
    report_params = _param_keys(report.get("params"))
    missing = []
    for name, definition in definitions.items():
        if name == REPORT_STAGE:
            continue
        for field in ("deps", "outs", "metrics", "plots"):
            for path in _entry_paths(definition.get(field)):
                if not any(_covers(dep, path) for dep in report_deps):
                    missing.append(f"{path} ({field[:-1]} of {name})")
        for file, keys in _param_keys(definition.get("params")).items():
            tracked = report_params.get(file, [])
            if tracked is None:
                continue
            for key in keys or [f"{file} (whole file)"]:
                if not any(key == have or key.startswith(have + ".") for have in tracked):
                    missing.append(f"param {key} ({name})")
    if missing:
        raise Eagle3Error(
            f"dvc.yaml: stage {REPORT_STAGE} must depend on everything the other stages read and write, or its "
            f"lineage goes stale without DVC noticing; add to its deps/params: {', '.join(missing)}"
        )


def workspace_problems(root: Path, stages: list[str]) -> list[str]:
    """What `dvc status` finds out of date among `stages`, one line per stage."""
    if not stages:
        return []
    # dvc.yaml:<name> so that a stage named like a file or directory is never taken for a path.
    command = [sys.executable, "-m", "dvc", "status", "--json", *(f"dvc.yaml:{name}" for name in stages)]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True)
    if result.returncode != 0:
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        raise Eagle3Error(f"dvc status failed in {root.name}: {lines[-1] if lines else 'no output'}")
    status = json.loads(result.stdout or "{}")
    problems = []
    for stage, changes in status.items():
        parts = []
        for change in changes:
            if isinstance(change, str):
                parts.append(change)
                continue
            for kind, paths in change.items():
                # "not in cache": the file matches dvc.lock, only the local cache lacks a copy (e.g. after a clone).
                parts.extend(
                    f"{kind.removeprefix('changed ')[:-1]} {path} {state}" for path, state in paths.items() if state != "not in cache"
                )
        if parts:
            problems.append(f"stage {stage.split(':')[-1]}: {', '.join(parts)}")
    return problems


def _hash_fields(entry: dict[str, Any]) -> dict[str, Any]:
    return {key: entry[key] for key in ("md5", "size", "nfiles") if key in entry}


def stage_records(lock: dict[str, dict], root: Path) -> dict[str, dict]:
    """The lock entries of every stage but the report, redacted: what lineage.json records and --check compares."""
    records = {}
    for name, entry in lock.items():
        if name == REPORT_STAGE:
            continue
        records[name] = redact(
            {
                "cmd": entry.get("cmd"),
                "deps": [{"path": _norm(dep["path"]), **_hash_fields(dep)} for dep in entry.get("deps", [])],
                "params": entry.get("params", {}),
                "outs": [{"path": _norm(out["path"]), **_hash_fields(out)} for out in entry.get("outs", [])],
            },
            root,
        )
    return records


def build_graph(records: dict[str, dict]) -> dict[str, Any]:
    """Artifacts (stage outs) with producers, inputs and Merkle lineage hashes; sources (deps no stage makes);
    the stages in dependency order and their edges."""
    producer = {out["path"]: name for name, record in records.items() for out in record["outs"]}

    def made_by(path: str) -> list[str]:
        return sorted(out for out in producer if _covers(out, path) or _covers(path, out))

    upstream = {
        name: sorted({producer[out] for dep in record["deps"] for out in made_by(dep["path"])} - {name})
        for name, record in records.items()
    }
    order: list[str] = []
    while len(order) < len(records):
        ready = [name for name in records if name not in order and all(up in order for up in upstream[name])]
        if not ready:
            raise Eagle3Error(f"dvc.lock: stages {sorted(set(records) - set(order))} depend on each other in a cycle")
        order.extend(ready)

    artifacts: dict[str, dict] = {}
    sources: dict[str, dict] = {}
    for name in order:
        record = records[name]
        for dep in record["deps"]:
            if not made_by(dep["path"]):
                source = sources.setdefault(dep["path"], {**_hash_fields(dep), "used_by": []})
                source["used_by"].append(name)
        for out in record["outs"]:
            merkle = {
                "artifact": out,
                "cmd": record["cmd"],
                "params": record["params"],
                "inputs": [
                    {**dep, "lineage": sorted(artifacts[path]["lineage_sha256"] for path in made_by(dep["path"]))}
                    for dep in record["deps"]
                ],
            }
            ancestors = {path for dep in record["deps"] for path in made_by(dep["path"])}
            for path in list(ancestors):
                ancestors.update(artifacts[path]["upstream"])
            artifacts[out["path"]] = {
                "stage": name,
                **_hash_fields(out),
                "inputs": [dep["path"] for dep in record["deps"]],
                "upstream": sorted(ancestors),
                "lineage_sha256": sha256_bytes(dumps(merkle).encode("utf-8")),
            }
    edges = sorted(
        {(producer[out], name, out) for name, record in records.items() for dep in record["deps"] for out in made_by(dep["path"])}
    )
    return {"order": order, "artifacts": artifacts, "sources": sources, "edges": [list(edge) for edge in edges]}


def mermaid(order: list[str], edges: list[list[str]]) -> str:
    ids = {name: f"s{index}" for index, name in enumerate(order)}
    lines = ["flowchart TD"]
    lines += [f'  {ids[name]}["{name}"]' for name in order]
    lines += [f'  {ids[source]} -->|"{path}"| {ids[target]}' for source, target, path in edges]
    return "\n".join(lines)


def git_state(root: Path, code_paths: list[str], generated: list[str]) -> dict[str, Any]:
    """The commit the pipeline ran from, and which of the stages' code/data deps differ from it."""
    head = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=root, capture_output=True, text=True)
    if head.returncode != 0:
        return {"commit": None, "uncommitted": []}
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--no-renames"], cwd=root, capture_output=True, text=True
    )
    changed = sorted(
        path
        for path in (line[3:].strip().strip('"') for line in status.stdout.splitlines())
        if any(_covers(code, path) for code in code_paths) and not any(_covers(out, path) for out in generated)
    )
    return {"commit": head.stdout.strip(), "uncommitted": changed}


# ---------------------------------------------------------------- inputs from outside, licenses, evaluation


def _read_json(path: Path, hint: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Eagle3Error(f"{path.as_posix()}: missing; {hint}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Eagle3Error(f"{path.as_posix()}: not valid JSON ({exc})") from None


def external_inputs(root: Path, sub_source_licenses: dict[str, str]) -> dict[str, Any]:
    provenance = read_provenance(root)
    card = _read_json(root / PREPARED_DIR / "card.json", "run `dvc repro prepare` first")
    datasets = [
        {key: item[key] for key in _DATASET_FIELDS if item.get(key) is not None} for item in card.get("inputs", [])
    ]
    # A sub-source named like its input is the whole input, not a part of it.
    present = {name: counts for name, counts in card.get("by_source", {}).items() if name not in {d["name"] for d in datasets}}
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
    }


def licensed_inputs(inputs: dict[str, Any]) -> list[licenses.LicensedInput]:
    items = [licenses.LicensedInput("verifier", inputs["verifier"].get("name", str(VERIFIER_DIR)), inputs["verifier"].get("license"))]
    items += [licenses.LicensedInput("dataset", item["name"], item.get("license")) for item in inputs["datasets"]]
    items += [licenses.LicensedInput("sub-source", item["name"], item["license"]) for item in inputs["sub_sources"] if item["license"]]
    return items


def read_evaluation(root: Path) -> dict[str, Any]:
    """metrics/eval.json, checked enough that the card can show it: a card without evaluation is not published."""
    path = root / EVAL_METRICS
    if not path.is_file():
        raise Eagle3Error(
            f"{EVAL_METRICS.as_posix()}: missing; a draft is not published without evaluation metrics: run the evaluate "
            "stage (`dvc repro`) first"
        )
    evaluation = _read_json(path, "")
    runs = evaluation.get("runs") if isinstance(evaluation, dict) else None
    if not isinstance(runs, list) or not any(isinstance(run, dict) and run.get("method") == "eagle3" for run in runs):
        raise Eagle3Error(f"{EVAL_METRICS.as_posix()}: runs: no eagle3 run to report; rerun the evaluate stage")
    headline = evaluation.get("headline")
    for key in ("tokens_per_step_k3_greedy", "ngram_tokens_per_step_k3_greedy"):
        if not isinstance(headline, dict) or not isinstance(headline.get(key), (int, float)):
            raise Eagle3Error(f"{EVAL_METRICS.as_posix()}: headline.{key}: missing or not a number; rerun the evaluate stage")
    return evaluation


def read_draft_config(root: Path) -> dict[str, Any]:
    path = root / DRAFT_DIR / "config.json"
    config = _read_json(path, "a card needs the exported draft: run the export stage (`dvc repro`) first")
    if not (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"):
        raise Eagle3Error(
            f"{path.as_posix()}: eagle_config.eagle_aux_hidden_state_layer_ids missing; vLLM would silently use the wrong "
            "layers; re-export the draft"
        )
    return config


# ---------------------------------------------------------------- publish and check


def publish(params, root: Path) -> None:
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
    config = params.report
    records = stage_records(lock, root)
    graph = build_graph(records)
    inputs = redact(external_inputs(root, config.sub_source_licenses), root)
    candidates = licensed_inputs(inputs)
    decisions = licenses.gate(candidates, config.license_overrides)
    evaluation = read_evaluation(root)
    draft_config = read_draft_config(root)

    draft_license = licenses.normalize(config.license or inputs["verifier"].get("license"))
    report_outs = _entry_paths(definitions[REPORT_STAGE].get("outs"))
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
        "evaluation": {"path": EVAL_METRICS.as_posix(), "headline": evaluation["headline"]},
    }
    card = model_card.render(lineage, evaluation, draft_config, config, params.export.num_speculative_tokens)
    lineage["card"] = {"path": model_card.CARD.as_posix(), "sha256": sha256_bytes(card.encode("utf-8"))}
    outputs = {LINEAGE_JSON.as_posix(): dumps(lineage), LINEAGE_MD.as_posix(): render_markdown(lineage), model_card.CARD.as_posix(): card}
    check_publishable(outputs, root)
    for name, text in outputs.items():
        _write_text(root / name, text)
    headline = evaluation["headline"]
    step(
        f"lineage: {len(graph['artifacts'])} artifacts from {len(records)} stages, {len(decisions)} licensed inputs "
        f"({sum(1 for d in decisions if d['override_reason'])} by override); card: {headline['tokens_per_step_k3_greedy']:.2f} "
        f"tokens/step vs ngram {headline['ngram_tokens_per_step_k3_greedy']:.2f} -> {', '.join(outputs)}"
    )


def check(root: Path) -> None:
    """Verify the published record against the workspace; print every problem, fail if there is one."""
    definitions, lock = load_pipeline(root)
    require_report_covers(definitions)
    problems = [f"not run: stage {name}" for name in definitions if name not in lock]
    problems += [f"dirty: {problem}" for problem in workspace_problems(root, [name for name in definitions if name in lock])]
    path = root / LINEAGE_JSON
    if not path.is_file():
        problems.append(f"missing: {LINEAGE_JSON.as_posix()} (run `dvc repro`)")
    else:
        recorded = _read_json(path, "")
        current = stage_records(lock, root)
        for name in sorted(set(current) | set(recorded.get("stages", {}))):
            if recorded.get("stages", {}).get(name) != current.get(name):
                problems.append(f"stale: {LINEAGE_JSON.as_posix()} records stage {name} differently from dvc.lock")
        card = recorded.get("card", {})
        card_path = root / card.get("path", str(model_card.CARD))
        if not card_path.is_file():
            problems.append(f"missing: {card_path.relative_to(root).as_posix()}")
        elif sha256_file(card_path) != card.get("sha256"):
            problems.append(f"modified: {card_path.relative_to(root).as_posix()} differs from the sha256 in {LINEAGE_JSON.as_posix()}")
        problems += _verifier_problems(root, recorded.get("inputs", {}).get("verifier", {}))
    if problems:
        for problem in problems:
            print(problem)
        raise Eagle3Error(f"lineage check: {len(problems)} problem(s), the workspace is not what the lineage describes (listed above)")
    step(f"lineage check: {len(lock)} stages and every recorded hash match the workspace")


def _verifier_problems(root: Path, recorded: dict[str, Any]) -> list[str]:
    """A verifier referenced outside the repo is not hashed by DVC: re-hash its identity files."""
    if (recorded.get("source") or {}).get("kind") != "local":
        return []
    from eagle3.verifier import describe_model_dir, weights_fingerprint

    model_dir = verifier_dir(root)
    if not model_dir.is_dir():
        return [f"missing: the verifier directory named in {VERIFIER_DIR.as_posix()}/{PROVENANCE}"]
    try:
        current = {**describe_model_dir(model_dir, True), **weights_fingerprint(model_dir)}
    except Eagle3Error as exc:
        return [f"verifier: {exc}"]
    return [
        f"modified: verifier {key} is {current.get(key)}, the lineage records {recorded.get(key)} (run `dvc repro -f verifier`)"
        for key in _VERIFIER_IDENTITY
        if recorded.get(key) != current.get(key)
    ]


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


# ---------------------------------------------------------------- lineage.md


def _size(size: int | None) -> str:
    if size is None:
        return ""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return ""


def render_markdown(lineage: dict[str, Any]) -> str:
    code, inputs, verifier = lineage["code"], lineage["inputs"], lineage["inputs"]["verifier"]
    out = [
        "# Lineage",
        "",
        "Generated by `eagle3 lineage` (stage `report`) from dvc.lock and the stages' outputs; "
        "`eagle3 lineage --check` verifies it against a workspace.",
        "",
        f"- code: git commit `{code['commit'] or 'none'}`"
        + (f", with uncommitted changes to {', '.join(f'`{p}`' for p in code['uncommitted'])}" if code["uncommitted"] else "")
        + f"; eagle3 {code['eagle3']}, DVC {code['dvc']}; every file's md5 is listed per stage below",
        f"- verifier: `{verifier.get('name')}` ({verifier.get('license')})",
        f"- draft license: `{lineage['licenses']['draft']}`",
    ]
    for remote in lineage["remotes"]:
        out.append(f"- DVC remote `{remote['name']}`{' (default)' if remote['default'] else ''}: `{remote['url']}`")
    out += ["", "## Licenses", "", "| input | name | license | class | terms | decision |", "|---|---|---|---|---|---|"]
    for decision in lineage["licenses"]["decisions"]:
        verdict = "allowed" if not decision["override_reason"] else f"override: {decision['override_reason']}"
        out.append(
            f"| {decision['kind']} | `{decision['name']}` | {decision['license']} | {decision['class']} | {decision['terms']} | {verdict} |"
        )
    unlicensed = [item["name"] for item in inputs["sub_sources"] if not item["license"]]
    if unlicensed:
        out += ["", f"Sub-sources without a license of their own (covered by their dataset's): {', '.join(f'`{n}`' for n in unlicensed)}."]
    if lineage["licenses"]["unused_overrides"]:
        out += ["", f"Overrides no input needs: {', '.join(lineage['licenses']['unused_overrides'])}."]
    out += ["", "## External inputs", "", "### Verifier", "", "```json", dumps(verifier).rstrip(), "```", "", "### Datasets", ""]
    out += ["| name | source | license | sha256 / fingerprint | rows read | rows valid |", "|---|---|---|---|---|---|"]
    for item in inputs["datasets"]:
        where = f"{item['dataset']}@{item.get('revision')}" if item.get("kind") == "hf" else item.get("path", "")
        digest = item.get("sha256") or item.get("fingerprint", "")
        counts = f"{item.get('rows_read', '')} | {item.get('rows_valid', '')}"
        out.append(f"| `{item['name']}` | `{where}` | {item.get('license')} | `{digest}` | {counts} |")
    out += ["", "## Pipeline", "", "```mermaid", lineage["dag_mermaid"], "```", "", "## Artifacts", ""]
    out += ["| path | made by | md5 | size | files | lineage sha256 |", "|---|---|---|---|---|---|"]
    for path, artifact in lineage["artifacts"].items():
        out.append(
            f"| `{path}` | {artifact['stage']} | `{artifact.get('md5')}` | {_size(artifact.get('size'))} | "
            f"{artifact.get('nfiles', 1)} | `{artifact['lineage_sha256']}` |"
        )
    out += ["", "## Stages", ""]
    for name in lineage["order"]:
        record = lineage["stages"][name]
        out += [f"### {name}", "", f"`{record['cmd']}`", ""]
        if record["deps"]:
            out += ["| input | md5 | size | made by |", "|---|---|---|---|"]
        for dep in lineage_inputs(lineage, name):
            out.append(f"| `{dep['path']}` | `{dep.get('md5')}` | {_size(dep.get('size'))} | {', '.join(dep['made_by']) or 'source'} |")
        out += ["", "Outputs: " + ", ".join(f"`{o['path']}`" for o in record["outs"])]
        if record["params"]:
            out += ["", "Params:", "", "```json", dumps(record["params"]).rstrip(), "```"]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def lineage_inputs(lineage: dict[str, Any], stage: str) -> list[dict[str, Any]]:
    producers = {path: artifact["stage"] for path, artifact in lineage["artifacts"].items()}
    return [
        {**dep, "made_by": sorted({stage_ for out, stage_ in producers.items() if _covers(out, dep["path"]) or _covers(dep["path"], out)})}
        for dep in lineage["stages"][stage]["deps"]
    ]
