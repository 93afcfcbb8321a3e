"""A scratch project for the benchmarks that rerun stages on this project's data (storage_8bit.py,
draft_layouts.py, peer_trainer.py): this project's outputs linked in, and the real stages run one at a time in it;
`measure` reads what evaluate and train wrote there, as the draft benchmarks compare it."""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from eagle3.formats.evaluation_kept import item_name
from eagle3.paths import EVAL_METRICS, EVALUATION_KEPT_DIR, TRAIN_LOG_DIR

K = 3  # the draft benchmarks evaluate at k=3 only


def link(root: Path, work: Path, paths) -> None:
    """`work`/path -> `root`/path for each of `paths`: inputs the scratch project reads and never writes."""
    for path in paths:
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).symlink_to(root / path)


def run_stage(work: Path, stage: str) -> float:
    """`eagle3 STAGE` in `work` with this interpreter; its wall time in seconds."""
    started = time.monotonic()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, "-m", "eagle3.cli", stage], cwd=work, env=env)
    if result.returncode:
        raise SystemExit(f"eagle3 {stage} failed in {work} (exit {result.returncode})")
    return time.monotonic() - started


def evaluate(work: Path, reference: Path) -> float:
    """`eagle3 evaluate` in `work`, the verifier alone measured once for every arm: what the first arm measured is
    kept at `reference` and copied into each later arm, whose evaluate keeps it (the same verifier, prompts and
    engine: the same key). Its wall time in seconds."""
    kept = work / EVALUATION_KEPT_DIR / item_name("none", None)
    if reference.is_dir() and not kept.exists():
        shutil.copytree(reference, kept)
    seconds = run_stage(work, "evaluate")
    if not reference.exists():
        shutil.copytree(kept, reference)
    return seconds


def evaluate_at_k(params: dict, method: str = "eagle3", k: int = K) -> dict:
    """params' evaluate section measuring the draft (of `method`) at k only, beside the verifier alone (no n-gram
    baseline, which does not depend on the draft)."""
    evaluate = {**params["evaluate"], "methods": ["none", method], "num_speculative_tokens": [k]}
    evaluate["headline_k"] = k
    return evaluate


def measure(work: Path, train_s: float, tokens_per_s: float | None = None) -> dict[str, Any]:
    """What evaluate measured in `work` (vLLM at K greedy and sampled, per set, the long-context probe, lossless,
    the offline estimate) and the training's speed (the train stage's own figure unless `tokens_per_s`)."""
    metrics = json.loads((work / EVAL_METRICS).read_text())
    if tokens_per_s is None:
        tokens_per_s = json.loads((work / TRAIN_LOG_DIR / "metrics.json").read_text())["tokens_per_s_this_run"]
    drafted = next(r["method"] for r in metrics["runs"] if r["method"] != "none")
    runs = {(r["method"], r["temperature"]): r for r in metrics["runs"] if r["method"] == drafted}
    sampled = next(r for (method, t), r in runs.items() if t > 0)
    greedy = runs[(drafted, 0.0)]
    long_context = next(
        r for r in metrics["long_context"]["results"] if r["method"] == drafted and r["temperature"] == 0
    )
    offline = metrics["offline_estimate"]
    return {
        "heldout": metrics["headline"]["tokens_per_step_greedy"],
        **{name: entry["tokens_per_step"] for name, entry in metrics["headline"]["benchmarks"].items()},
        "heldout_sampled": sampled["tokens_per_step"],
        "long_context": long_context["tokens_per_step"],
        "lossless": metrics["headline"]["lossless_greedy"],
        "offline": offline["tokens_per_step"],
        "offline_top1": offline["top1_agreement_by_position"],
        "offline_by_context": {
            f"{b['from_tokens']}-{b['to_tokens']}": (b["mean_acceptance_length"], b["drafts"])
            for b in offline["acceptance_by_context"]
        },
        "vllm_by_context": {
            f"{b['from_tokens']}-{b['to_tokens']}": (b["tokens_per_step"], b["completions"])
            for b in greedy["all_sets_by_context"]
        },
        "train_tokens_per_s": tokens_per_s,
        "train_s": round(train_s, 1),
        # A chain draft runs one forward per drafted token, a block draft one per block.
        "draft_forwards_per_step": round(
            greedy["num_drafts"] * (greedy["k"] if drafted == "eagle3" else 1) / greedy["verifier_steps"], 4
        ),
        "acceptance_by_position": greedy["acceptance_by_position"],
    }


def keep(results: list[dict], result: dict, path: Path | None) -> None:
    """An arm's result added to `results`, printed as one JSON line and, with `path`, all of them written there
    (a long run stopped half-way keeps what it measured)."""
    results.append(result)
    print(json.dumps(result), flush=True)
    if path:
        path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


def _cell(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.4f} (±{(max(values) - min(values)) / 2:.4f})" if len(values) > 1 else f"{mean:.4f}"


def summary(results: list[dict]) -> list[str]:
    """Per arm: the mean over seeds, ± half the seeds' spread; the ratio to the first arm's mean."""
    names = list(dict.fromkeys(r["arm"] for r in results))
    by_arm = {name: [r for r in results if r["arm"] == name] for name in names}
    tables = {"offline_by_context", "vllm_by_context"}
    positional = {"offline_top1", "acceptance_by_position"}
    sets = [k for k in results[0] if k not in {"arm", "seed", "lossless"} | positional | tables]
    shown = [key for key in ("offline_top1", "acceptance_by_position") if key in results[0]]
    lines = ["arm | seeds | " + " | ".join(sets + [f"{key} by position" for key in shown])]
    first = by_arm[names[0]]
    for name, arms in by_arm.items():
        cells = []
        for key in sets:
            values = [r[key] for r in arms]
            baseline = statistics.fmean(r[key] for r in first)
            cells.append(f"{_cell(values)} x{statistics.fmean(values) / baseline:.3f}")
        for key in shown:
            positions = min(len(r[key]) for r in arms)
            means = [statistics.fmean(r[key][i] for r in arms) for i in range(positions)]
            cells.append(" / ".join(f"{a:.3f}" for a in means))
        lines.append(f"{name} | {len(arms)} | " + " | ".join(cells))
    for key, what, counted in (
        ("vllm_by_context", "vLLM tokens per step (greedy, every set's turns) by prompt tokens", "turns"),
        ("offline_by_context", "offline mean acceptance length by context tokens", "drafts"),
    ):
        lines.append("")
        buckets = sorted({b for r in results for b in r[key]}, key=lambda b: int(b.split("-")[0]))
        lines.append(f"arm | {what}: " + " | ".join(buckets))
        for name, arms in by_arm.items():
            cells = []
            for bucket in buckets:
                values = [r[key][bucket][0] for r in arms if bucket in r[key]]
                count = sum(r[key].get(bucket, (0, 0))[1] for r in arms)
                cells.append(f"{_cell(values)} ({count} {counted})" if values else "n/a")
            lines.append(f"{name} | " + " | ".join(cells))
    return lines
