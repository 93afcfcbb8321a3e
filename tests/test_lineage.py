"""`eagle3 report` (stage report) in a real git + DVC repository in a temporary directory.

The pipeline there is small but real where it matters: the real `verifier`
stage referencing a tiny HF directory outside the repository (as the 1T
verifier is), the real `prepare` stage on a 12-row prompt file, and the real
report stage. `export` and `evaluate` are stand-ins that write files in the
formats the real stages write (config.json, metrics/eval.json), so the test
does not train or run vLLM. (Longer than most modules: the project it builds serves every test of the
report, and apart they would each build their own.)
"""

import copy
import json
import os
import re
import shutil
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from eagle3.errors import Eagle3Error
from eagle3.formats.eval_metrics import EvalMetrics, read_eval_metrics
from eagle3.hashing import sha256_file
from eagle3.params.params_file import load_params
from eagle3.publish import licenses, model_card
from eagle3.publish.dvc_graph import require_report_covers

from conftest import REPO, eagle3, ran_stages, run_in, smoke_params, write_params

pytestmark = pytest.mark.slow

VERIFIER_NAME = "moonshotai/Kimi-K2.5"
SECRET_IN_CONFIG_LOCAL = "AKIAsecretLocalValue42"
PASSWORD_IN_REMOTE_URL = "hunter2remotePassword"

STAND_INS = """
import hashlib, json, sys
from pathlib import Path

def digest(*paths):
    files = (p for d in paths for p in sorted(Path(d).rglob("*")) if p.is_file())
    return hashlib.sha256(b"".join(sorted(p.read_bytes() for p in files))).hexdigest()

if sys.argv[1] == "export":
    config = json.loads(Path("fixture/draft_config.json").read_text())
    config["trained_from"] = digest("models/verifier", "data/prepared")
    Path("models/draft").mkdir(parents=True, exist_ok=True)
    Path("models/draft/config.json").write_text(json.dumps(config, indent=2))
    Path("models/draft/model.safetensors").write_bytes(bytes.fromhex(config["trained_from"]))
else:
    Path("metrics").mkdir(exist_ok=True)
    Path("metrics/eval.json").write_text(Path("fixture/eval.json").read_text())
"""

DRAFT_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 16,
    "vocab_size": 64,
    "draft_vocab_size": 32,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "use_aux_hidden_state": True},
}


def _eval_run(method: str, k: int | None, tokens_per_step: float, length: float | None, by_position: list[float], rate):
    """A held-out run as metrics/eval.json records it (eagle3/formats/eval_metrics.py): 100 tokens, 2 prompts."""
    steps = round(100 / tokens_per_step)
    return {
        "method": method,
        "k": k,
        "temperature": 0.0,
        "prompts": 2,
        "completions": 2,
        "output_tokens": 100,
        "accepted_tokens": 100 - steps,
        "verifier_steps": steps,
        "num_drafts": steps if k else 0,
        "num_draft_tokens": steps * k if k else 0,
        "tokens_per_step": tokens_per_step,
        "tokens_per_step_ci95": None,
        "mean_acceptance_length": length,
        "mean_acceptance_length_ci95": None,
        "acceptance_by_position": by_position,
        "lossless_identical": None if method == "none" else 2,
        "all_sets_output_tokens": 100,
        "all_sets_by_context": [
            {
                "from_tokens": 0,
                "to_tokens": 256,
                "prompts": 2,
                "completions": 2,
                "output_tokens": 100,
                "tokens_per_step": tokens_per_step,
                "tokens_per_step_ci95": None,
                "mean_acceptance_length": length,
                "mean_acceptance_length_ci95": None,
                "acceptance_by_position": by_position,
            }
        ],
        "output_tokens_per_s": rate,
        "seconds": round(100 / rate, 3),
    }


EVAL = {
    "runs": [
        _eval_run("none", None, 1.0, None, [], 50.0),
        _eval_run("ngram", 3, 1.27, 1.9, [0.3, 0.2, 0.1], 45.0),
        _eval_run("eagle3", 3, 1.84, 2.1, [0.6, 0.4, 0.2], 40.0),
    ],
    "headline": {
        "k": 3,
        "tokens_per_step_greedy": 1.84,
        "ngram_tokens_per_step_greedy": 1.27,
        "lossless_greedy": "2/2",
        "benchmarks": {},
    },
    "lossless": {"identical": 2, "prompts": 2, "rate": 1.0, "exact_expected": True, "dtype": "float32"},
    "offline_estimate": {
        "k": 3,
        "heldout_tokens_read": 200,
        "device": "cpu float32",
        "positions": 120,
        "drafts": 60,
        "tokens_per_step": 1.9,
        "mean_acceptance_length": 2.0,
        "acceptance_by_position": [0.6, 0.3, 0.1],
        "top1_agreement_by_position": [0.6, 0.5, 0.4],
        "acceptance_by_context": [{"from_tokens": 0, "to_tokens": 256, "drafts": 60, "mean_acceptance_length": 2.0}],
        "vllm_tokens_per_step": 1.84,
        "gap": 0.06,
    },
    "mla": None,
    "benchmarks": {},
    "long_context": None,
    "later_turns_follow": "none",
    "prompts": {"split": "heldout", "count": 2, "prompt_hashes": ["a" * 64, "b" * 64]},
    "chat_template_kwargs": {"thinking": False},
    "max_tokens": 64,
    "repaired_vllm_temperature_expansion": False,
    # As the evaluate stage records it (eagle3/environment.py), from a machine unlike any that runs this test.
    "environment": {
        "python": "3.10.1",
        "packages": {"torch": "0.0.1", "vllm": "0.0.2"},
        "cpu": {"model": "Test CPU", "logical_cpus": 2, "machine": "x86_64"},
        "threads": {"torch": 2, "usable_cpus": 2},
        "parallel": {"tensor_parallel_size": 1, "world_size": 1},
        "switches": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        "accelerator": {"kind": "cpu"},
    },
    "seconds": 7.5,
}
DVC_YAML = {
    "stages": {
        "verifier": {"cmd": "python -m eagle3.cli verifier", "params": ["verifier"], "outs": ["models/verifier"]},
        "prepare": {
            "cmd": "python -m eagle3.cli prepare",
            "deps": ["prompts/tiny.jsonl"],
            "params": ["prepare"],
            "outs": ["data/prepared"],
        },
        "benchmarks": {
            "cmd": "python -m eagle3.cli benchmarks",
            "deps": ["prompts/bench.jsonl", "data/prepared"],
            "params": ["benchmarks"],
            "outs": ["data/benchmarks"],
        },
        "export": {
            "cmd": "python tools/stand_ins.py export",
            "deps": ["tools/stand_ins.py", "fixture/draft_config.json", "models/verifier", "data/prepared"],
            "outs": ["models/draft/config.json", "models/draft/model.safetensors"],
        },
        "evaluate": {
            "cmd": "python tools/stand_ins.py evaluate",
            "deps": [
                "tools/stand_ins.py",
                "fixture/eval.json",
                "models/draft/config.json",
                "models/draft/model.safetensors",
            ],
            "metrics": [{"metrics/eval.json": {"cache": False}}],
        },
        "report": {
            "cmd": "python -m eagle3.cli report",
            "deps": [
                "tools",
                "fixture",
                "prompts",
                "models/verifier",
                "data/prepared",
                "data/benchmarks",
                "models/draft/config.json",
                "models/draft/model.safetensors",
                "metrics/eval.json",
            ],
            "params": [{"params.yaml": None}],
            "outs": [
                {"reports/lineage.json": {"cache": False}},
                {"reports/lineage.md": {"cache": False}},
                "models/draft/README.md",
            ],
        },
    }
}
DOWNSTREAM_OF_PROMPTS = {
    "data/prepared",
    "data/benchmarks",
    "models/draft/config.json",
    "models/draft/model.safetensors",
    "metrics/eval.json",
}


def _tiny_verifier(directory: Path) -> Path:
    directory.mkdir(parents=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 16,
        "num_hidden_layers": 6,
        "num_attention_heads": 2,
        "vocab_size": 64,
        "max_position_embeddings": 32768,
    }
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (directory / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    save_file({"w": np.zeros((2, 2), dtype=np.float32)}, str(directory / "model.safetensors"))
    return directory


def _params(
    root: Path, verifier_dir: Path, verifier_license: str, dataset_license: str, report: dict | None = None
) -> None:
    params = smoke_params()
    params["verifier"] = {
        "source": {"kind": "local", "path": str(verifier_dir), "name": VERIFIER_NAME, "license": verifier_license}
    }
    params["prepare"] = {
        "sources": [{"kind": "local", "name": "tiny", "path": "prompts/tiny.jsonl", "license": dataset_license}],
        "heldout_rows": 2,
    }
    params["benchmarks"] = {
        "sets": [
            {
                "name": "bench",
                "source": {"kind": "local", "path": "prompts/bench.jsonl"},
                "license": "mit",
                "format": "question",
            }
        ]
    }
    params["vocab"] = {"draft_vocab_size": DRAFT_CONFIG["draft_vocab_size"]}  # within the tiny verifier's 64
    params["report"] = report or {}
    write_params(root, params)


def _project(tmp_path: Path, verifier_license="apache-2.0", dataset_license="apache-2.0", report=None) -> Path:
    root = tmp_path / "project"
    (root / "prompts").mkdir(parents=True)
    rows = [
        {"messages": [{"role": "user", "content": f"Question number {i}: what is {i} squared?"}], "source": "tiny/math"}
        for i in range(6)
    ]
    rows += [
        {"messages": [{"role": "user", "content": f"Question number {i}: what is {i} squared?"}]} for i in range(6, 12)
    ]
    (root / "prompts/tiny.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (root / "prompts/bench.jsonl").write_text('{"question": "What is 2 + 2?"}\n{"question": "Name a colour."}\n')
    (root / "tools").mkdir()
    (root / "tools/stand_ins.py").write_text(STAND_INS)
    (root / "fixture").mkdir()
    (root / "fixture/draft_config.json").write_text(json.dumps(DRAFT_CONFIG))
    (root / "fixture/eval.json").write_text(json.dumps(EVAL))
    (root / "dvc.yaml").write_text(yaml.safe_dump(DVC_YAML, sort_keys=False))
    _params(root, _tiny_verifier(tmp_path / "outside" / "Kimi-K2.5"), verifier_license, dataset_license, report)
    run_in(root, "git", "init", "-q")
    run_in(root, "dvc", "init", "-q")
    run_in(root, "git", "add", "-A")
    run_in(root, "git", "commit", "-q", "-m", "fixture")
    return root


def _lineage(root: Path) -> dict:
    return json.loads((root / "reports/lineage.json").read_text())


def _front_matter(card: str) -> dict:
    match = re.match(r"^---\n(.*?)\n---\n", card, re.S)
    assert match, "the card must start with YAML front matter"
    return yaml.safe_load(match.group(1))


def test_lineage_card_and_check_on_a_real_pipeline(tmp_path):
    root = _project(
        tmp_path,
        verifier_license="modified-mit",
        report={
            "license_overrides": [
                {
                    "license": "modified-mit",
                    "reason": "Kimi's modified MIT allows redistribution; the card names Kimi-K2.5.",
                }
            ],
            "draft_repo": "example-org/Kimi-K2.5-EAGLE3",
        },
    )
    every_stage = {"verifier", "prepare", "benchmarks", "export", "evaluate", "report"}
    ran_stages(run_in(root, "dvc", "repro").stdout, root, every_stage)
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    lineage = _lineage(root)

    # Every artifact of every other stage, with the hashes dvc.lock holds, its maker and its upstream.
    locked_outs = {
        out["path"]: (name, out) for name, stage in lock.items() if name != "report" for out in stage["outs"]
    }
    assert set(lineage["artifacts"]) == set(locked_outs)
    for path, (stage, out) in locked_outs.items():
        artifact = lineage["artifacts"][path]
        assert (artifact["stage"], artifact["md5"], artifact["size"]) == (stage, out["md5"], out["size"])
    assert lineage["artifacts"]["models/verifier"]["upstream"] == []
    assert lineage["artifacts"]["metrics/eval.json"]["upstream"] == [
        "data/prepared",
        "models/draft/config.json",
        "models/draft/model.safetensors",
        "models/verifier",
    ]
    assert lineage["order"] == ["verifier", "prepare", "benchmarks", "export", "evaluate"]
    (benchmark,) = lineage["inputs"]["benchmarks"]
    bench_sha256 = sha256_file(root / "prompts/bench.jsonl")
    assert (benchmark["name"], benchmark["license"], benchmark["prompts"]) == ("bench", "mit", 2)
    assert benchmark["source"] == {"kind": "local", "path": "prompts/bench.jsonl", "sha256": bench_sha256}
    assert lineage["sources"]["prompts/tiny.jsonl"]["used_by"] == ["prepare"]
    assert lineage["stages"]["prepare"]["params"]["params.yaml"]["prepare"]["heldout_rows"] == 2
    assert lineage["code"]["commit"] == run_in(root, "git", "rev-parse", "HEAD").stdout.strip()
    assert '-->|"data/prepared"|' in lineage["dag_mermaid"]
    decisions = {d["kind"]: d for d in lineage["licenses"]["decisions"]}
    assert (
        decisions["verifier"]["class"] == "conditional"
        and "names Kimi-K2.5" in decisions["verifier"]["override_reason"]
    )
    assert decisions["dataset"]["class"] == "permissive" and decisions["dataset"]["override_reason"] is None
    markdown = (root / "reports/lineage.md").read_text()
    assert "override: Kimi's modified MIT allows redistribution" in markdown
    assert lock["prepare"]["outs"][0]["md5"] in markdown

    card = (root / "models/draft/README.md").read_text()
    meta = _front_matter(card)
    assert (meta["license"], meta["license_name"]) == ("other", "modified-mit")
    assert meta["base_model"] == VERIFIER_NAME
    assert meta["training_data"] == [
        {
            "name": "tiny",
            "path": "prompts/tiny.jsonl",
            "sha256": lineage["inputs"]["datasets"][0]["sha256"],
            "license": "apache-2.0",
        }
    ]
    assert set(model_card.TAGS) <= set(meta["tags"]) and meta["pipeline_tag"] == "text-generation"
    values = [metric["value"] for metric in meta["model-index"][0]["results"][0]["metrics"]]
    assert values == [1.84, 1.27, 2.1]
    assert (
        "vllm serve moonshotai/Kimi-K2.5 --speculative-config "
        """'{"method": "eagle3", "model": "example-org/Kimi-K2.5-EAGLE3", "num_speculative_tokens": 3}'"""
    ) in card
    assert "| eagle3 | 3 | 0.0 | 2 | 100 | 1.84 | 2.10 | 0.60, 0.40, 0.20 |" in card
    assert "| heldout | 2 (2) | 0.0 | 2.10 | 1.84 | 1.27 | 3 |" in card
    # By context length: the draft's greedy run at the headline k, not n-gram's (1.90, 1.27) beside it.
    assert "| 0-256 | 2 | 2.10 | 1.84 |" in card and "with the long-context probe" not in card
    assert f"| bench | `prompts/bench.jsonl` | `{bench_sha256}` | mit | 0 | 2 / 2 |" in card
    assert "Measured with in-process vllm 0.0.2 engines (cpu)" in card
    assert "chat template arguments the training answers were generated with (`thinking: false`)" in card
    assert f"| `bench` | `prompts/bench.jsonl` | mit | `{bench_sha256}` | 2 | 0 | 2 |" in markdown
    assert "names Kimi-K2.5" in card and lineage["card"]["sha256"] in (root / "reports/lineage.json").read_text()

    # The verifier's absolute path outside the project is reduced to its name everywhere.
    for text in (card, markdown, (root / "reports/lineage.json").read_text()):
        assert str(tmp_path) not in text
    # The params still name where the weights were (redacted); the verifier's record is its content, no path.
    assert '"path": "<local>/Kimi-K2.5"' in markdown and "path" not in lineage["inputs"]["verifier"]["source"]
    assert lineage["inputs"]["verifier"]["source"]["kind"] == "local"
    assert "Data and pipelines are up to date" in run_in(root, "dvc", "status").stdout
    # The environment that made each recording artifact is in all three outputs; a record from another machine is
    # a warning on --check (rerunning there will not reproduce it), never a failure.
    assert lineage["environments"] == {
        "metrics/eval.json": [{"environment": EVAL["environment"], "made": ["eval.json"]}]
    }
    shown = "vllm 0.0.2, torch 0.0.1, Python 3.10.1; CPU Test CPU (2 logical); TP 1"
    assert f"| `metrics/eval.json` | eval.json | {shown} |" in markdown
    assert f"- `metrics/eval.json`: {shown}" in card
    checked = eagle3(root, "report", "--check")
    assert checked.returncode == 0
    warning = next(line for line in checked.stderr.splitlines() if line.startswith("warning: "))
    assert warning.startswith("warning: metrics/eval.json (stage evaluate) was made with ")
    assert f"packages.torch: 0.0.1 -> {metadata.version('torch')}" in warning and "python: 3.10.1 -> " in warning

    # One byte of one input: exactly the artifacts downstream of it get a new lineage.
    prompts = root / "prompts/tiny.jsonl"
    prompts.write_bytes(prompts.read_bytes().replace(b"number 7", b"number 8", 1))
    ran_stages(run_in(root, "dvc", "repro").stdout, root, {"prepare", "benchmarks", "export", "evaluate", "report"})
    changed = _lineage(root)
    assert {
        path for path in lineage["artifacts"] if lineage["artifacts"][path] != changed["artifacts"][path]
    } == DOWNSTREAM_OF_PROMPTS
    assert {
        path
        for path in lineage["artifacts"]
        if lineage["artifacts"][path]["lineage_sha256"] != changed["artifacts"][path]["lineage_sha256"]
    } == DOWNSTREAM_OF_PROMPTS
    # metrics/eval.json has the same bytes (evaluate copied the same numbers), but it was made from a different draft.
    assert lineage["artifacts"]["metrics/eval.json"]["md5"] == changed["artifacts"]["metrics/eval.json"]["md5"]
    assert eagle3(root, "report", "--check").returncode == 0


def test_dirty_or_stale_workspace_is_reported_and_not_published(tmp_path):
    root = _project(tmp_path)
    run_in(root, "dvc", "repro")
    card_path = root / "data/prepared/card.json"
    card_path.write_text(card_path.read_text().replace('"heldout": 2', '"heldout": 3', 1))

    checked = eagle3(root, "report", "--check", check=False)
    assert checked.returncode == 2 and "lineage check: 4 problem(s)" in checked.stderr
    assert sorted(checked.stdout.splitlines()) == [
        "dirty: stage benchmarks: dep data/prepared modified",
        "dirty: stage export: dep data/prepared modified",
        "dirty: stage prepare: out data/prepared modified",
        "dirty: stage report: dep data/prepared modified",
    ]
    published = eagle3(root, "report", check=False)
    assert published.returncode == 2
    assert "workspace does not match dvc.lock, not publishing: " in published.stderr
    assert "stage prepare: out data/prepared modified" in published.stderr and "stage report" not in published.stderr

    # Restored from the cache, then a rerun of one stage without the report: the lineage is now stale.
    run_in(root, "dvc", "checkout", "-f")
    assert eagle3(root, "report", "--check").returncode == 0
    # A fresh clone has the files but not the local cache: that is not a dirty workspace.
    shutil.rmtree(root / ".dvc/cache")
    assert eagle3(root, "report", "--check").returncode == 0
    (root / "prompts/tiny.jsonl").write_text((root / "prompts/tiny.jsonl").read_text().replace("number 3", "numbr 3"))
    run_in(root, "dvc", "repro", "--single-item", "prepare")
    problems = eagle3(root, "report", "--check", check=False).stdout.splitlines()
    assert "stale: reports/lineage.json records stage prepare differently from dvc.lock" in problems
    assert any(line.startswith("dirty: stage export: dep data/prepared modified") for line in problems)

    # A verifier outside the repository is re-hashed: replacing its config in place is caught.
    run_in(root, "dvc", "repro")
    config = tmp_path / "outside/Kimi-K2.5/config.json"
    config.write_text(config.read_text().replace('"vocab_size": 64', '"vocab_size": 65'))
    problems = eagle3(root, "report", "--check", check=False).stdout.splitlines()
    assert [line.split(" is ")[0] for line in problems] == ["modified: verifier config_sha256"]


def test_license_gate_stops_forbidden_and_unknown_and_records_override(tmp_path):
    root = _project(tmp_path, dataset_license="cc-by-nc-4.0")
    failed = run_in(root, "dvc", "repro", check=False)
    assert failed.returncode != 0
    assert (
        "license gate: 1 input(s) do not allow publishing derived weights: dataset 'tiny' is cc-by-nc-4.0 (forbidden: "
        "non-commercial)" in failed.stderr
    )
    assert not (root / "reports/lineage.json").exists() and not (root / "models/draft/README.md").exists()

    _params(root, tmp_path / "outside/Kimi-K2.5", verifier_license="other", dataset_license="some-custom-terms")
    failed = run_in(root, "dvc", "repro", check=False)
    assert failed.returncode != 0
    assert "2 input(s)" in failed.stderr and "verifier 'moonshotai/Kimi-K2.5' is other (unknown" in failed.stderr
    assert "dataset 'tiny' is some-custom-terms (unknown" in failed.stderr

    reason = "Written permission from the dataset's authors, 2026-11-02, ticket LEGAL-42."
    _params(
        root,
        tmp_path / "outside/Kimi-K2.5",
        verifier_license="apache-2.0",
        dataset_license="cc-by-nc-4.0",
        report={"license_overrides": [{"license": "cc-by-nc-4.0", "reason": reason}]},
    )
    run_in(root, "dvc", "repro")
    decision = next(d for d in _lineage(root)["licenses"]["decisions"] if d["kind"] == "dataset")
    assert (decision["class"], decision["allowed"], decision["override_reason"]) == ("forbidden", True, reason)
    assert f"override: {reason}" in (root / "reports/lineage.md").read_text()
    assert f"override: {reason}" in (root / "models/draft/README.md").read_text()
    assert _front_matter((root / "models/draft/README.md").read_text())["license"] == "apache-2.0"

    # A sub-source with a known license is gated too; only the report reruns.
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["report"]["sub_source_licenses"] = {"tiny/math": "cc-by-nc-nd-4.0"}
    write_params(root, params)
    failed = run_in(root, "dvc", "repro", check=False)
    ran_stages(failed.stdout, root, {"report"})
    assert "sub-source 'tiny/math' is cc-by-nc-nd-4.0 (forbidden: non-commercial and no derivatives)" in failed.stderr


def test_no_secrets_or_local_paths_are_published(tmp_path):
    root = _project(tmp_path)
    run_in(
        root,
        "dvc",
        "remote",
        "add",
        "-d",
        "storage",
        f"https://alice:{PASSWORD_IN_REMOTE_URL}@dvc.example.com/store?sig=abc",
    )
    run_in(root, "dvc", "remote", "modify", "--local", "storage", "password", SECRET_IN_CONFIG_LOCAL)
    # A directory remote on this machine: its path is this machine's, never published.
    run_in(root, "dvc", "remote", "add", "mounted", str(tmp_path / "mnt" / "eagle3-remote"))
    run_in(root, "dvc", "repro")
    outputs = [
        (root / name).read_text() for name in ("reports/lineage.json", "reports/lineage.md", "models/draft/README.md")
    ]
    assert _lineage(root)["remotes"] == [
        {"name": "mounted", "url": "<local>/eagle3-remote", "default": False},
        {"name": "storage", "url": "https://dvc.example.com/store", "default": True},
    ]
    for text in outputs:
        for leak in (
            SECRET_IN_CONFIG_LOCAL,
            PASSWORD_IN_REMOTE_URL,
            "alice",
            str(tmp_path),
            os.path.expanduser("~") + "/",
        ):
            assert leak not in text

    # A secret that reaches an output by any other route (here a token pasted into the repo name) stops publication.
    token = "hf_plantedTokenValue9"
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["report"]["draft_repo"] = f"example-org/{token}"
    write_params(root, params)
    leaked = eagle3(root, "report", check=False, env={"HF_TOKEN": token})
    assert (
        leaked.returncode == 2 and "would publish environment variable HF_TOKEN; nothing was written" in leaked.stderr
    )
    assert token not in leaked.stderr and token not in (root / "reports/lineage.json").read_text()


def test_real_dvc_yaml_report_stage_is_last_and_covers_every_stage():
    definitions = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    require_report_covers(definitions)
    assert list(definitions)[-1] == "report"
    report_outs = {next(iter(o)) if isinstance(o, dict) else o for o in definitions["report"]["outs"]}
    for name, stage in definitions.items():
        deps = set(stage.get("deps", []))
        assert not deps & report_outs, f"stage {name} must not read the report's outputs"

    extra = dict(
        definitions,
        later={"cmd": "x", "deps": ["data/new-input.jsonl"], "params": [{"other.yaml": ["lr"]}], "outs": ["out/x"]},
    )
    with pytest.raises(
        Eagle3Error, match=r"data/new-input.jsonl \(dep of later\), out/x \(out of later\), param lr \(later\)"
    ):
        require_report_covers(extra)


@pytest.mark.parametrize(
    "license_id, expected",
    [
        ("Apache 2.0", "permissive"),
        ("MIT", "permissive"),
        ("cc-by-4.0", "permissive"),
        ("CC0-1.0", "permissive"),
        ("cc-by-sa-4.0", "conditional"),
        ("modified-mit", "conditional"),
        ("llama3.1", "conditional"),
        ("gemma", "conditional"),
        ("cc-by-nc-4.0", "forbidden"),
        ("cc-by-nc-sa-4.0", "forbidden"),
        ("cc-by-nd-4.0", "forbidden"),
        ("cc-by-nc-nd-3.0", "forbidden"),
        ("", "unknown"),
        (None, "unknown"),
        ("other", "unknown"),
        ("my-own-license", "unknown"),
    ],
)
def test_license_classes(license_id, expected):
    assert licenses.classify(license_id)[0] == expected


def test_card_metadata_pins_hub_datasets_by_revision():
    revision = "0123456789abcdef0123456789abcdef01234567"
    lineage = {
        "inputs": {
            "verifier": {"name": "HuggingFaceTB/SmolLM2-135M-Instruct"},
            "datasets": [
                {
                    "name": "blend",
                    "kind": "hf",
                    "dataset": "mlabonne/open-perfectblend",
                    "revision": revision,
                    "license": "apache-2.0",
                },
                {
                    "name": "local",
                    "kind": "local",
                    "path": "data/prompts/p.jsonl",
                    "sha256": "ab" * 32,
                    "license": "mit",
                },
            ],
        },
        "licenses": {"draft": "apache-2.0"},
    }
    meta = yaml.safe_load(yaml.safe_dump(model_card.metadata(lineage, EvalMetrics.model_validate(EVAL), "x/y")))
    assert meta["datasets"] == ["mlabonne/open-perfectblend"]
    assert meta["training_data"][0] == {
        "name": "blend",
        "dataset": "mlabonne/open-perfectblend",
        "revision": revision,
        "license": "apache-2.0",
    }
    assert meta["training_data"][1]["sha256"] == "ab" * 32
    assert meta["license"] == "apache-2.0" and "license_name" not in meta


@pytest.mark.parametrize(
    "report, message",
    [
        (
            {"license_overrides": [{"license": "cc-by-nc-4.0", "reason": "fine"}]},
            "report.license_overrides[0].reason: string should have at least 20 characters",
        ),
        (
            {"license_overrides": [{"license": "cc-by-nc-4.0", "reason": "approved-by-legal-team-yes"}]},
            "report.license_overrides[0].reason: reason must say in a sentence why publishing is allowed",
        ),
        (
            {
                "license_overrides": [
                    {"license": "gemma", "reason": "We signed the Gemma terms, see LEGAL-7."},
                    {"license": "Gemma", "reason": "We signed the Gemma terms, see LEGAL-8."},
                ]
            },
            "report.license_overrides: each license may be overridden once, repeated: gemma",
        ),
        ({"licence": "mit"}, "report.licence: unknown key"),
    ],
)
def test_report_params_errors_name_the_key(tmp_path, report, message):
    params = smoke_params()
    params["report"] = report
    with pytest.raises(Eagle3Error, match=re.escape(message)):
        load_params(write_params(tmp_path, params))


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda m: m["headline"].update(ngram_tokens_per_step_greedy=None), None),  # n-gram not measured
        (
            lambda m: m["headline"].update(ngram_tokens_per_step_greedy="1.27"),
            "headline.ngram_tokens_per_step_greedy: ",
        ),
        (lambda m: m["headline"].pop("ngram_tokens_per_step_greedy"), "headline.ngram_tokens_per_step_greedy: Field"),
        (lambda m: m["runs"][2].update(tokens_per_step_ci95=[1.5]), "runs.2.tokens_per_step_ci95: List should have"),
        (
            lambda m: m["runs"][0].update(method="medusa"),
            "runs.0.method: Input should be 'none', 'eagle3', 'dflash' or 'ngram'",
        ),
        (lambda m: m["lossless"].update(agreement=1.0), "lossless.agreement: Extra inputs are not permitted"),
        (lambda m: m["runs"].pop(2), "runs: one draft method expected (eagle3, dflash), got []"),
        (lambda m: m["runs"][2].update(k=5), "runs: no greedy eagle3 run at k=3"),
        (
            lambda m: m["runs"][0].update(method="dflash"),
            "runs: one draft method expected (eagle3, dflash), got ['dflash', 'eagle3']",
        ),
        (lambda m: m.update(later_turns_follow="the dataset's"), "later_turns_follow: Input should be"),
    ],
)
def test_eval_metrics_are_read_through_their_format(tmp_path, edit, problem):
    """metrics/eval.json is read back through eagle3/formats/eval_metrics.py: what evaluate writes reads back
    equal; a wrong or missing key is one error naming it."""
    metrics = copy.deepcopy(EVAL)
    edit(metrics)
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics/eval.json").write_text(json.dumps(metrics))
    if problem is None:
        assert read_eval_metrics(tmp_path).as_json() == metrics
    else:
        with pytest.raises(Eagle3Error, match=re.escape(f"metrics/eval.json: {problem}")):
            read_eval_metrics(tmp_path)


def test_eval_metrics_with_nan_or_missing_are_one_error(tmp_path):
    with pytest.raises(Eagle3Error, match=r"metrics/eval.json: missing; a draft is not published without"):
        read_eval_metrics(tmp_path)
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics/eval.json").write_text(json.dumps(EVAL).replace("1.84", "NaN", 1))
    with pytest.raises(Eagle3Error, match=r"NaN is not a number a figure may be"):
        read_eval_metrics(tmp_path)
