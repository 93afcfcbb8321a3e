import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from eagle3.environment import read_environments
from eagle3.formats.synthetic import finished_parts, iter_records

from conftest import eagle3, kill_mid_run, make_project, smoke_params

pytestmark = pytest.mark.slow

LONG_PROMPT = {"conversations": [{"from": "human", "value": "Summarise: " + "lorem ipsum dolor " * 300}]}


def _params(generate: dict | None = None, shipped_rows: int = 40) -> dict:
    params = smoke_params()
    params["prepare"] = {
        "sources": [
            {**params["prepare"]["sources"][0], "max_rows": shipped_rows},
            {"kind": "local", "name": "long", "path": "long.jsonl", "license": "apache-2.0"},
        ],
        "heldout_rows": 8,
        "seed": 0,
    }
    params["generate"]["chunk_size"] = 8
    for key, value in (generate or {}).items():
        if isinstance(value, dict):
            params["generate"].setdefault(key, {}).update(value)
        else:
            params["generate"][key] = value
    return params


def project(root: Path, verifier_project: Path, params: dict) -> Path:
    """A project with the converted verifier (hard-linked) and prepared prompts, ready for `generate`."""
    make_project(root, params)
    shutil.copytree(verifier_project / "models", root / "models", copy_function=os.link)
    (root / "long.jsonl").write_text(json.dumps(LONG_PROMPT) + "\n")
    eagle3(root, "prepare")
    return root


def records(root: Path) -> dict[str, list[dict]]:
    return {split: list(iter_records(root, split)) for split in ("train", "heldout")}


def prepared(root: Path) -> dict[str, list[dict]]:
    return {split: pq.read_table(root / f"data/prepared/{split}.parquet").to_pylist() for split in ("train", "heldout")}


def output_files(root: Path) -> dict[str, bytes]:
    """The generated data, without the environment logs: those say which run made which part, so they differ
    between runs that made the same bytes in different ways (killed and resumed, split over ranks)."""
    base = root / "data/synthetic"
    files = (p for p in sorted(base.rglob("*")) if p.is_file() and p.parent.name != "environments")
    return {str(p.relative_to(base)): p.read_bytes() for p in files}


def _parts(root: Path, split: str) -> list[str]:
    return sorted(p.name for p in (root / "data/synthetic" / split).glob("part-*"))


@pytest.fixture(scope="module")
def vllm_run(vllm_generated) -> Path:
    return vllm_generated


def test_vllm_backend_regenerates_every_turn(vllm_run):
    out, source = records(vllm_run), prepared(vllm_run)
    for split in ("train", "heldout"):
        assert [r["id"] for r in out[split]] == [r["id"] for r in source[split]]
    flat = [r for split in out.values() for r in split]
    skipped = [r for r in flat if r["status"] == "skipped"]
    assert [(r["origin"], r["skip_reason"]) for r in skipped] == [("long", "prompt_too_long")]

    originals = {r["id"]: r for split in source.values() for r in split}
    multi_turn = 0
    for record in (r for r in flat if r["status"] == "ok"):
        roles = [m["role"] for m in record["messages"]]
        users = [m["content"] for m in record["messages"] if m["role"] == "user"]
        assert users == [m["content"] for m in originals[record["id"]]["messages"] if m["role"] == "user"]
        assert roles == ["user", "assistant"] * len(users)
        assert len(record["turns"]) == len(users)
        for turn in record["turns"]:
            assert turn["finish_reason"] in ("stop", "length") and 0 < turn["completion_tokens"] <= 32
        if len(users) > 1:
            multi_turn += 1
            first, second = record["turns"][:2]
            # The second turn is conditioned on the regenerated first answer, not on the dataset's.
            assert second["prompt_tokens"] >= first["prompt_tokens"] + first["completion_tokens"]
            original_answer = next(m for m in originals[record["id"]]["messages"] if m["role"] == "assistant")
            assert record["messages"][1]["content"] != original_answer["content"]
        assert record["verifier"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
        assert record["sampling"] == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 32, "seed": 0}
    assert multi_turn >= 1

    metrics = json.loads((vllm_run / "metrics/generate.json").read_text())
    assert metrics["samples"] == len(flat) == 41 and metrics["ok"] == 40
    assert metrics["skipped"] == {"prompt_too_long": 1}
    assert metrics["completion_tokens"] == sum(t["completion_tokens"] for r in flat for t in r["turns"])
    assert metrics["this_run"]["completion_tokens_per_s"] > 0
    manifest = json.loads((vllm_run / "data/synthetic/manifest.json").read_text())
    assert [p["part"] for p in manifest["train"]] == [f"part-{i:05d}.jsonl.zst" for i in range(5)]
    assert sum(p["records"] for split in manifest.values() for p in split) == 41


def test_sigkill_then_rerun_equals_uninterrupted_run(vllm_run, verifier_project, tmp_path):
    root = project(tmp_path, verifier_project, _params())
    kill_mid_run(root, "generate", lambda: bool(finished_parts(root / "data/synthetic/train")))
    killed_with = len(finished_parts(root / "data/synthetic/train"))
    assert 1 <= killed_with < 5
    assert not (root / "data/synthetic/manifest.json").exists()

    result = eagle3(root, "generate")

    assert f"{5 + 1 - killed_with} parts to make" in result.stderr
    assert output_files(root) == output_files(vllm_run)


def test_ranks_on_separate_machines_merge_to_the_single_run(verifier_project, tmp_path):
    params = _params({"backend": "transformers", "chunk_size": 4, "sampling": {"max_tokens": 12}}, shipped_rows=16)
    single = project(tmp_path / "single", verifier_project, params)
    eagle3(single, "generate")
    machines = [project(tmp_path / f"rank{rank}", verifier_project, params) for rank in (0, 1)]
    for rank, root in enumerate(machines):
        result = eagle3(root, "generate", "--rank", str(rank), "--world-size", "2")
        assert "parts still missing" in result.stderr
        assert not (root / "data/synthetic/manifest.json").exists()
    for piece in (machines[1] / "data/synthetic").glob("*/*"):
        if piece.name.startswith("part-") or piece.parent.name == "environments":
            shutil.copy2(piece, machines[0] / "data/synthetic" / piece.parent.name / piece.name)

    result = eagle3(machines[0], "generate")

    assert "parts to make" not in result.stderr
    assert output_files(machines[0]) == output_files(single)
    assert len(output_files(single)) == 2 + 3 + 2  # run.json, manifest.json, 3 train parts, 2 held-out parts
    logs = {p.name for p in (machines[0] / "data/synthetic/environments").iterdir()}
    (rank0,) = {name for name in logs if "-rank" not in name}
    assert logs == {rank0, rank0.replace(".json", "-rank1.json")}
    (merged,) = read_environments(machines[0] / "data/synthetic")
    assert merged["environment"]["parallel"]["world_size"] == 2
    every_part = sorted(f"{split}/{part}" for split in ("heldout", "train") for part in _parts(single, split))
    assert merged["made"] == every_part
    (alone,) = read_environments(single / "data/synthetic")
    assert alone["environment"]["parallel"]["world_size"] == 1 and alone["made"] == merged["made"]


def test_changed_settings_discard_old_parts_and_execution_settings_do_not(verifier_project, tmp_path):
    server_params = {"backend": "openai", "openai": {"base_urls": ["http://127.0.0.1:9/v1"], "model": "m"}}
    root = project(tmp_path, verifier_project, _params(server_params))
    from eagle3.environment import capture, fingerprint
    from eagle3.formats.provenance import read_provenance
    from eagle3.params.params_file import load_params
    from eagle3.resume import resume_or_reset, run_key
    from eagle3.stages.generate import run_settings

    from conftest import write_params

    def settings(params: dict) -> dict:
        return run_settings(load_params(write_params(root, params)).generate, read_provenance(root), root)

    base = settings(_params(server_params))
    out = root / "data/synthetic"
    resume_or_reset(out, base)
    (out / "train").mkdir()
    (out / "train/part-00000.jsonl.zst").write_bytes(b"x")

    faster = settings(
        _params({**server_params, "openai": {**server_params["openai"], "concurrency": 99, "timeout_s": 5}})
    )
    assert run_key(faster) == run_key(base)
    assert resume_or_reset(out, faster) == (run_key(base), True)
    assert (out / "train/part-00000.jsonl.zst").exists()

    hotter = settings(_params({**server_params, "sampling": {"temperature": 0.7}}))
    hotter_key = run_key(hotter)
    assert hotter_key != run_key(base)
    assert resume_or_reset(out, hotter) == (hotter_key, False)
    assert not (out / "train").exists()

    # The environment is provenance only, unless pinned: then it is part of the key and an upgrade starts over.
    assert "environment" not in base
    pinned = settings(_params({**server_params, "pin_environment": True}))
    assert pinned["environment"] == fingerprint(capture()) and run_key(pinned) != run_key(base)
    upgraded = {**pinned, "environment": {**pinned["environment"], "python": "3.99.0"}}
    assert run_key(upgraded) != run_key(pinned)
    assert json.loads((out / "run.json").read_text())["key"] == hotter_key
