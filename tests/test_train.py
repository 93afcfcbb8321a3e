"""vocab -> train -> export on the real verifier's regenerated answers, and the exported draft inside vLLM."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3.environment import read_environments
from eagle3.formats.exported_draft import write_drafts
from eagle3.formats.provenance import read_provenance
from eagle3.formats.shards import HiddenStateDataset, ShardReader, split_shards
from eagle3.modeling.draft import DraftConfig, Eagle3Draft
from eagle3.precision import resolve

from conftest import (
    TRAIN_SMALL,
    copy_project,
    draft_params,
    eagle3,
    kill_mid_run,
    losses,
    served_counters,
    write_params,
)

pytestmark = pytest.mark.slow


def test_vocab_covers_the_answers_and_maps_draft_to_target_ids(extracted_real):
    tensors = load_file(extracted_real / "data/vocab/vocab.safetensors")
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool and len(d2t) == 2048 and len(t2d) == 49152
    targets = torch.arange(2048) + d2t
    assert bool((targets[1:] > targets[:-1]).all()) and int(t2d.sum()) == 2048 and bool(t2d[targets].all())
    answer_tokens = set()
    total = 0
    for path in split_shards(extracted_real, "train"):
        reader = ShardReader(path)
        for position in range(len(reader)):
            sample = reader.read(position)
            answer_tokens |= set(sample.input_ids[sample.loss_mask].tolist())
            total += int(sample.loss_mask.sum())
    metrics = json.loads((extracted_real / "metrics/vocab.json").read_text())
    assert len(answer_tokens) < 2048 and answer_tokens <= set(targets.tolist())
    assert metrics["coverage"] == 1.0 and metrics["loss_tokens"] == total
    assert metrics["distinct_loss_tokens"] == len(answer_tokens)


def test_training_learns_and_logs_curves_for_dvc_plots(trained):
    plots = trained / "metrics/train/plots/metrics/train"
    rows = [line.split("\t") for line in (plots / "loss.tsv").read_text().splitlines()[1:]]
    steps, losses = [int(r[0]) for r in rows], [float(r[1]) for r in rows]
    total = json.loads((trained / "metrics/train/metrics.json").read_text())["total_steps"]
    sequences = sum(len(ShardReader(path)) for path in split_shards(trained, "train"))
    assert steps == list(range(2, total + 1, 2)) and total == TRAIN_SMALL["epochs"] * (sequences // 8)
    assert losses[-1] < 0.5 * losses[0]
    accuracy = [float(line.split("\t")[1]) for line in (plots / "acc_0.tsv").read_text().splitlines()[1:]]
    assert accuracy[-1] > 0.4 > accuracy[0]
    checkpoints = sorted(p.name for p in (trained / "checkpoints").glob("step-*"))
    assert checkpoints[-1] == f"step-{total:07d}" and len(checkpoints) == 2  # keep_checkpoints
    result = eagle3(trained, "validate-draft", "models/draft", "--verifier", "models/verifier")
    assert "valid EAGLE-3 draft" in result.stdout
    # train.precision auto, resolved for this CPU: in the run key, the environment record and the metrics.
    resolved = resolve("auto", "cpu")
    assert json.loads((trained / "checkpoints/run.json").read_text())["settings"]["precision"] == resolved
    assert json.loads((trained / "metrics/train/metrics.json").read_text())["precision"] == resolved
    (logged,) = read_environments(trained / "checkpoints")
    assert logged["environment"]["compute_dtype"] == resolved


def _final_state(root):
    newest = sorted((root / "checkpoints").glob("step-*"))[-1]
    return newest.name, load_file(newest / "model.safetensors"), load_file(newest / "optimizer.safetensors")


# The block draft resumes through the same checkpoints: its objective's anchors are a function of the batch alone.
BLOCK_DRAFT = {"draft_method": "dflash", "dflash": {"layers": 2, "block_size": 4, "anchors": 16}}


@pytest.mark.parametrize("method", [{}, BLOCK_DRAFT], ids=["eagle3", "dflash"])
def test_sigkill_then_rerun_ends_at_the_same_weights(extracted_real, tmp_path, method):
    short = {"epochs": 2, "checkpoint_every": 2, **method}
    reference = copy_project(extracted_real, tmp_path / "reference", draft_params(**short))
    eagle3(reference, "train")
    killed = copy_project(extracted_real, tmp_path / "killed", draft_params(**short))
    kill_mid_run(killed, "train", lambda: any((killed / "checkpoints").glob("step-0000004")))
    left = sorted(p.name for p in (killed / "checkpoints").glob("step-*"))
    assert left and left[-1] < _final_state(reference)[0], "the kill must land before training finished"
    resumed = eagle3(killed, "train")
    assert "resuming from" in resumed.stderr
    name, model, optimizer = _final_state(killed)
    expected_name, expected_model, expected_optimizer = _final_state(reference)
    assert name == expected_name
    for key in expected_model:
        assert torch.equal(model[key], expected_model[key]), key
    for key in expected_optimizer:
        assert torch.equal(optimizer[key], expected_optimizer[key]), key
    curve = "metrics/train/plots/metrics/train/loss.tsv"
    assert (killed / curve).read_text() == (reference / curve).read_text()


def _train(root):
    # What `dvc repro` runs: the stage itself starts torchrun when train.launch says so.
    result = subprocess.run(
        [sys.executable, "-m", "eagle3.cli", "train"], cwd=root, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def _rewound(source, root, step, params):
    """`source` with its checkpoints after `step` gone, under `params`: training there resumes at `step`. The
    curves and checkpoints are copied, not linked, since training rewrites them in place."""
    rewritten = {source: {"params.yaml", "checkpoints"}, source / "metrics": {"train"}}

    def linked(directory, names):
        return rewritten.get(Path(directory), set()) & set(names)

    shutil.copytree(source, root, copy_function=os.link, ignore=linked)
    shutil.copytree(source / "checkpoints", root / "checkpoints", dirs_exist_ok=True)
    shutil.copytree(source / "metrics/train", root / "metrics/train", dirs_exist_ok=True)
    for later in (root / "checkpoints").glob("step-*"):
        if int(later.name.removeprefix("step-")) > step:
            shutil.rmtree(later)
    write_params(root, params)
    return root


@pytest.mark.parametrize("method", [{}, BLOCK_DRAFT], ids=["eagle3", "dflash"])
def test_two_processes_match_one_and_resume_across_process_counts(extracted_real, tmp_path, method):
    # A token budget the longest samples fill alone: those steps leave the second process an empty share.
    longest = int(HiddenStateDataset(split_shards(extracted_real, "train")).lengths.max())
    settings = {
        **method,
        "epochs": 2,
        "precision": "float32",
        "log_every": 1,
        "num_workers": 0,
        "max_tokens_per_batch": longest,
        "checkpoint_every": 2,
        "keep_checkpoints": 1000,
    }
    single = copy_project(extracted_real, tmp_path / "single", draft_params(**settings))
    eagle3(single, "train")
    one = losses(single)
    total = json.loads((single / "metrics/train/metrics.json").read_text())["total_steps"]
    assert len(one) == total and one[-1] < one[0]

    def same_curve(root):
        other = losses(root)
        assert len(other) == total
        # float32 sums the two halves' gradients in another order than one process does, and training amplifies
        # the rounding difference step by step (on a Sapphire Rapids CPU: 1e-7 relative at first, 1.5e-3 late in
        # the curve). A wrong gradient average or a lost sample shows within the first steps, far above 1e-4.
        for a, b in zip(one[:8], other[:8], strict=True):
            assert abs(a - b) <= 1e-4 * abs(a), (one, other)
        for a, b in zip(one, other, strict=True):
            assert abs(a - b) <= 2e-2 * abs(a), (one, other)

    two = {**settings, "launch": {"processes_per_node": 2}}
    double = copy_project(extracted_real, tmp_path / "ddp", draft_params(**two))
    _train(double)
    same_curve(double)
    # Resumed on two processes with train.sharding fsdp from one process's checkpoint, then back on one process
    # from theirs: the checkpoints hold whole tensors whatever wrote them.
    into_two, back = 2 * (total // 6), 2 * (total // 3)
    sharded = _rewound(single, tmp_path / "fsdp", into_two, draft_params(**two, sharding="fsdp"))
    assert f"resuming from step-{into_two:07d}" in _train(sharded).stderr
    returned = _rewound(sharded, tmp_path / "back", back, draft_params(**settings))
    assert f"resuming from step-{back:07d}" in _train(returned).stderr
    same_curve(sharded)
    same_curve(returned)


def _untrained_draft(root, directory):
    trained_config = json.loads((root / "models/draft/config.json").read_text())
    tensors = load_file(root / "data/vocab/vocab.safetensors")
    config = DraftConfig.from_verifier(
        json.loads((root / "models/verifier/config.json").read_text()),
        tuple(trained_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]),
        2048,
    )
    draft = Eagle3Draft(config)
    draft.init_weights(torch.Generator().manual_seed(1))
    provenance = read_provenance(root)
    write_drafts(
        draft,
        tensors["d2t"],
        tensors["t2d"],
        directory,
        directory.with_name("spec"),
        dtype="bfloat16",
        num_speculative_tokens=3,
        verifier_name=provenance.name,
        verifier_architectures=provenance.architectures,
    )
    return directory


def test_vllm_serves_the_draft_losslessly_and_training_makes_it_accepted(trained, tmp_path):
    drafts = {"trained": trained / "models/draft", "untrained": _untrained_draft(trained, tmp_path / "untrained")}
    counters = served_counters(trained, "eagle3", 3, drafts)
    trained_rate = counters["trained"]["num_accepted_tokens"] / counters["trained"]["num_draft_tokens"]
    untrained_rate = counters["untrained"]["num_accepted_tokens"] / counters["untrained"]["num_draft_tokens"]
    assert counters["trained"]["num_drafts"] > 0 and len(counters["trained"]["accepted_per_position"]) == 3
    assert trained_rate > 0.15, counters["trained"]
    assert untrained_rate < 0.05, counters["untrained"]
