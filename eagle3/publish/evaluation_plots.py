"""evaluate's plots: CSV for `dvc plots show` (declared in dvc.yaml) and the same panels as PNG in reports/.

reports/eval.png: tokens per verifier step against k, and acceptance by position at the largest k (held-out
prompts). reports/eval_benchmarks.png: tokens per verifier step per prompt set at the headline k, greedy, draft
beside ngram, with the 95% intervals. The CSV columns say `draft` for the trained draft, whichever its method, so
dvc.yaml's plots read them alike.
"""

from pathlib import Path
from typing import Any

from eagle3.files import atomic_path, write_text
from eagle3.params.evaluate import EvaluateParams
from eagle3.params.train import METHOD_NAMES
from eagle3.paths import EVAL_BENCHMARKS_FIGURE, EVAL_FIGURE, EVAL_PLOTS_DIR


def find_run(runs: list[dict[str, Any]], method: str, k: int | None, temperature: float) -> dict[str, Any] | None:
    return next((r for r in runs if r["method"] == method and r["k"] == k and r["temperature"] == temperature), None)


def pick_run(runs: list[dict[str, Any]], method: str, k: int, temperature: float) -> dict[str, Any]:
    found = find_run(runs, method, k, temperature)
    assert found is not None, (method, k, temperature)
    return found


def results_by_set(runs: list[dict[str, Any]], benchmarks: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Every prompt set's results, the held-out set's (`runs`) first: what the per-benchmark table and plot show."""
    return {"heldout": {"results": runs}, **(benchmarks or {})}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, figure, path: Path) -> None:
    figure.tight_layout()
    with atomic_path(path) as partial:
        figure.savefig(partial, dpi=100, format="png", metadata={"Software": None})
    plt.close(figure)


def write_plots(root: Path, runs: list[dict[str, Any]], config: EvaluateParams) -> None:
    """metrics/eval/tokens_per_step.csv, acceptance_by_position.csv and reports/eval.png (held-out prompts)."""
    plt = _pyplot()
    ks = sorted({r["k"] for r in runs if r["method"] != "none"})
    temperatures = (0.0, config.temperature)
    out = root / EVAL_PLOTS_DIR
    draft = config.draft_method

    def figure_at(method: str, k: int, temperature: float) -> float | None:
        found = find_run(runs, method, k, temperature)
        return found["tokens_per_step"] if found else None

    # A configuration that was not measured is an empty cell (and a gap in the curve).
    lines = ["k,draft_greedy,ngram_greedy,draft_sampled,ngram_sampled"]
    for k in ks:
        values = [figure_at(m, k, t) for t in temperatures for m in (draft, "ngram")]
        lines.append(",".join([str(k)] + ["" if v is None else str(v) for v in values]))
    write_text(out / "tokens_per_step.csv", "\n".join(lines) + "\n")
    # The largest k measured both ways (evaluate.sampled_at: every k, or only the headline k).
    top = max(r["k"] for r in runs if r["method"] == draft and r["temperature"] == config.temperature)
    greedy, sampled = pick_run(runs, draft, top, 0.0), pick_run(runs, draft, top, config.temperature)
    lines = ["position,greedy,sampled"] + [
        f"{i},{g},{s}"
        for i, (g, s) in enumerate(
            zip(greedy["acceptance_by_position"], sampled["acceptance_by_position"], strict=True)
        )
    ]
    write_text(out / "acceptance_by_position.csv", "\n".join(lines) + "\n")

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for method, style in ((draft, "o-"), ("ngram", "s--")):
        for temperature in temperatures:
            label = f"{method}, {'greedy' if temperature == 0 else f'T={temperature}'}"
            measured = [(k, figure_at(method, k, temperature)) for k in ks]
            measured = [(k, v) for k, v in measured if v is not None]
            if measured:
                left.plot(*zip(*measured, strict=True), style, label=label)
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
    right.set(
        xlabel="draft position",
        ylabel="acceptance rate",
        xticks=positions,
        title=f"{METHOD_NAMES[draft]} acceptance, k={top}",
    )
    right.legend()
    _save(plt, figure, root / EVAL_FIGURE)


def _figure(cell: str | float) -> float:
    """A measured cell's figure; 0 for one not measured ("")."""
    return 0 if isinstance(cell, str) else cell


def write_benchmark_plots(root: Path, sets: dict[str, dict[str, Any]], draft: str, k: int) -> None:
    """metrics/eval/benchmarks.csv and reports/eval_benchmarks.png: per prompt set, greedy, at the headline k, the
    draft (of method `draft`) beside ngram."""
    # One row per prompt set: its name, then each method's figure and interval, "" where not measured.
    rows: list[list[str | float]] = []
    for name, entry in sets.items():
        cells: list[str | float] = [name]
        for method in (draft, "ngram"):
            found = find_run(entry["results"], method, k, 0.0)
            interval = (found or {}).get("tokens_per_step_ci95") or ["", ""]
            cells += [found["tokens_per_step"] if found else "", *interval]
        rows.append(cells)
    header = "benchmark,draft_greedy,draft_low,draft_high,ngram_greedy,ngram_low,ngram_high"
    write_text(
        root / EVAL_PLOTS_DIR / "benchmarks.csv", "\n".join([header] + [",".join(map(str, r)) for r in rows]) + "\n"
    )

    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(max(5, 1.6 * len(rows)), 4))
    for offset, (method, first) in ((-0.2, (draft, 1)), (0.2, ("ngram", 4))):
        if all(r[first] == "" for r in rows):
            continue  # not measured: no bars rather than bars of height 0
        values = [_figure(r[first]) for r in rows]
        errors = [
            [v - _figure(r[first + 1]) if r[first + 1] != "" else 0 for v, r in zip(values, rows, strict=True)],
            [_figure(r[first + 2]) - v if r[first + 2] != "" else 0 for v, r in zip(values, rows, strict=True)],
        ]
        positions = [i + offset for i in range(len(rows))]
        axes.bar(positions, values, 0.4, yerr=errors, capsize=3, label=method)
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set(
        xticks=list(range(len(rows))),
        xticklabels=[r[0] for r in rows],
        ylabel="output tokens per verifier step",
        title=f"Per prompt set, greedy, k={k} (95% bootstrap intervals)",
    )
    axes.legend()
    _save(plt, figure, root / EVAL_BENCHMARKS_FIGURE)
