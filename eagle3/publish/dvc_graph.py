"""The pipeline as DVC recorded it: dvc.yaml's stages, dvc.lock's entries, and the artifact graph built from them.

Generic over stages: whatever dvc.yaml holds, the DAG is rebuilt from which deps are which stage's outs. Each
artifact gets a `lineage_sha256`, a Merkle hash over its own hash, its stage's command and params and its
inputs' hashes and lineages: it changes exactly when the artifact or anything upstream of it changes.

The report stage reads dvc.lock but does not declare it as a dep: DVC rewrites dvc.lock after every stage,
the report's own entry included, so that dep would be stale after every run. Instead the stage depends on
everything the other stages' dvc.lock entries are made from (their deps, outs and params), so it reruns
whenever their lock entries change; `require_report_covers` enforces that whenever a stage is added. The one
gap: DVC refuses dvc.yaml as a dep, so a changed command whose stage then writes identical outputs leaves the
record stale; `eagle3 report --check` reports that.
"""

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.files import dumps
from eagle3.hashing import sha256_bytes
from eagle3.params.loading import read_yaml
from eagle3.publish.redaction import redact

REPORT_STAGE = "report"


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


def norm_path(path: str) -> str:
    return os.path.normpath(path).replace(os.sep, "/")


def covers(parent: str, child: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def entry_paths(items: Iterable[Any] | None) -> list[str]:
    """Paths from a dvc.yaml deps/outs/metrics/plots list, whose items are a path or {path: options}."""
    paths = []
    for item in items or []:
        paths.extend([item] if isinstance(item, str) else list(item))
    return [norm_path(path) for path in paths]


def param_keys(items: Iterable[Any] | None) -> dict[str, list[str] | None]:
    """{params file: keys, or None for the whole file} from a dvc.yaml params list."""
    keys: dict[str, list[str] | None] = {}
    for item in items or []:
        if isinstance(item, str):
            if (whole := keys.setdefault("params.yaml", [])) is not None:
                whole.append(item)
            continue
        for file, listed in item.items():
            if not listed:
                keys[file] = None
            elif (named := keys.setdefault(file, [])) is not None:
                named.extend(listed)
    return keys


def require_report_covers(definitions: dict[str, dict]) -> None:
    """The report must depend on every other stage's deps, outs and params, or it would go stale silently."""
    if REPORT_STAGE not in definitions:
        raise Eagle3Error(f"dvc.yaml: no `{REPORT_STAGE}` stage; the lineage is made by that stage (docs/pipeline.md)")
    report = definitions[REPORT_STAGE]
    report_deps = entry_paths(report.get("deps"))
    report_params = param_keys(report.get("params"))
    missing = []
    for name, definition in definitions.items():
        if name == REPORT_STAGE:
            continue
        for field in ("deps", "outs", "metrics", "plots"):
            for path in entry_paths(definition.get(field)):
                if not any(covers(dep, path) for dep in report_deps):
                    missing.append(f"{path} ({field[:-1]} of {name})")
        for file, keys in param_keys(definition.get("params")).items():
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


def workspace_problems(root: Path, stages: list[str], absent: list[str] | None = None) -> list[str]:
    """What `dvc status` finds out of date among `stages`, one line per stage. With `absent` (a list), outputs
    missing from the workspace (another machine made them and they were not pulled here) are added to it instead:
    nothing here contradicts dvc.lock about them."""
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
                for path, state in paths.items():
                    # "not in cache": the file matches dvc.lock, only the local cache lacks a copy (after a clone).
                    if state == "not in cache":
                        continue
                    if absent is not None and kind in ("changed outs", "changed deps") and state == "deleted":
                        if path not in absent:
                            absent.append(path)
                        continue
                    parts.append(f"{kind.removeprefix('changed ')[:-1]} {path} {state}")
        if parts:
            problems.append(f"stage {stage.split(':')[-1]}: {', '.join(parts)}")
    return problems


def hash_fields(entry: dict[str, Any]) -> dict[str, Any]:
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
                "deps": [{"path": norm_path(dep["path"]), **hash_fields(dep)} for dep in entry.get("deps", [])],
                "params": entry.get("params", {}),
                "outs": [{"path": norm_path(out["path"]), **hash_fields(out)} for out in entry.get("outs", [])],
            },
            root,
        )
    return records


def build_graph(records: dict[str, dict]) -> dict[str, Any]:
    """Artifacts (stage outs) with producers, inputs and Merkle lineage hashes; sources (deps no stage makes);
    the stages in dependency order and their edges."""
    producer = {out["path"]: name for name, record in records.items() for out in record["outs"]}

    def made_by(path: str) -> list[str]:
        return sorted(out for out in producer if covers(out, path) or covers(path, out))

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
                source = sources.setdefault(dep["path"], {**hash_fields(dep), "used_by": []})
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
                **hash_fields(out),
                "inputs": [dep["path"] for dep in record["deps"]],
                "upstream": sorted(ancestors),
                "lineage_sha256": sha256_bytes(dumps(merkle).encode("utf-8")),
            }
    edges = sorted(
        {
            (producer[out], name, out)
            for name, record in records.items()
            for dep in record["deps"]
            for out in made_by(dep["path"])
        }
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
        ["git", "status", "--porcelain", "--untracked-files=all", "--no-renames"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    changed = sorted(
        path
        for path in (line[3:].strip().strip('"') for line in status.stdout.splitlines())
        if any(covers(code, path) for code in code_paths) and not any(covers(out, path) for out in generated)
    )
    return {"commit": head.stdout.strip(), "uncommitted": changed}
