"""train.hidden_states `streamed` on the real verifier (hf capture on this CPU): the same training as from stored
shards within float32 rounding, with no training states on disk beyond the buffer; exact resume after kill -9; two
processes train what one does; and the one-line errors."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
import torch
from safetensors.torch import load_file

from eagle3.chat.sequence_plan import load_tokenizer, synthetic_parts
from eagle3.formats.provenance import read_provenance
from eagle3.formats.shards import ShardReader, split_shards
from eagle3.stages.vocab import count_tokens

from conftest import copy_project, draft_params, eagle3, kill_mid_run, losses

pytestmark = pytest.mark.slow

SHORT = {"epochs": 2, "checkpoint_every": 2, "keep_checkpoints": 1000, "log_every": 1, "precision": "float32"}
CURVE = "metrics/train/plots/metrics/train/loss.tsv"


def streamed_params(**train):
    params = draft_params(**{**SHORT, "hidden_states": "streamed", **train})
    params["extract"]["splits"] = ["heldout"]
    return params


def streamed_project(source, root, **train):
    """`source` without any stored states (data/hidden removed), set to stream them."""
    root = copy_project(source, root, streamed_params(**train))
    shutil.rmtree(root / "data/hidden")
    return root


def _final_weights(root):
    newest = sorted((root / "checkpoints").glob("step-*"))[-1]
    return newest.name, load_file(newest / "model.safetensors")


def test_vocab_counts_the_tokens_the_shards_hold(extracted_real):
    """The vocab stage lays the synthetic data out as extract does: the same tokens as its shards, counted
    without them (a streamed run stores none)."""
    provenance = read_provenance(extracted_real)
    parts, tokenizer = synthetic_parts(extracted_real, ["train"]), load_tokenizer(extracted_real, provenance)
    masked, every = count_tokens(extracted_real, parts, tokenizer, 2048, provenance.vocab_size)
    answers, tokens = [], []
    for path in split_shards(extracted_real, "train"):
        reader = ShardReader(path)
        for position in range(len(reader)):
            sample = reader.read(position)
            answers.append(sample.input_ids[sample.loss_mask])
            tokens.append(sample.input_ids)
    assert torch.equal(masked, torch.bincount(torch.cat(answers), minlength=provenance.vocab_size))
    assert torch.equal(every, torch.bincount(torch.cat(tokens), minlength=provenance.vocab_size))
    assert int(masked.sum()) > 1000


# A buffer of about two steps' states, so the producer has to wait for the trainer.
BUFFER = {"stream_buffer_gb": 0.012, "num_workers": 0}


@pytest.fixture(scope="module")
def streamed(extracted_real, tmp_path_factory):
    """One streamed training run, watched: (its project, the spool's sizes as another process saw them)."""
    root = streamed_project(extracted_real, tmp_path_factory.mktemp("streamed") / "project", **BUFFER)
    spool = root / ".eagle3/stream/spool"
    sizes, watching = [], threading.Event()

    def watch():  # independently of the producer's own count
        while not watching.is_set():
            if spool.is_dir():
                sizes.append(sum(p.stat().st_size for p in spool.rglob("step-*.safetensors") if p.exists()))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        eagle3(root, "train")
    finally:
        watching.set()
        watcher.join()
    return root, sizes


def test_streamed_training_equals_stored_and_stays_in_its_buffer(extracted_real, streamed, tmp_path):
    root, sizes = streamed
    stored = copy_project(extracted_real, tmp_path / "stored", draft_params(**SHORT, num_workers=0))
    eagle3(stored, "train")
    metrics = json.loads((root / "metrics/train/metrics.json").read_text())
    assert metrics["hidden_states"] == "streamed"
    assert 0 < metrics["stream_peak_buffer_bytes"] <= 0.012e9 and 0 < max(sizes) <= 0.012e9
    spool = root / ".eagle3/stream/spool"
    assert not list(spool.glob("*.safetensors")) and not (root / "data/hidden").exists()
    one, other = losses(stored), losses(root)
    assert len(one) == len(other) == metrics["total_steps"]
    # Same sequences, batches and targets, trained in float32 on states computed in float32 one sequence per
    # forward pass (draft_params), in a process with as many threads as extract's: the same arithmetic on the same
    # inputs, so the same bits on every CPU kind. Measured equal on AVX2 (EPYC) and AMX (Xeon) alike, where states
    # from batches padded differently had flipped bf16 roundings that training amplified to 4.8e-4 by step 8 on
    # AMX. A wrong sequence, batch order or layer differs by more than 1% from the first step on.
    assert one == other
    # It learns. The summed loss swings with each batch's length mix (18 to 33 over these 8 steps), so the check is
    # the first draft position's accuracy: chance (1/2048) untrained, 0.12 over the last four steps here (AVX2 and
    # AMX alike).
    accuracy = losses(root, "train/acc_0")
    assert accuracy[0] < 0.01 and sum(accuracy[-4:]) / 4 > 0.05, accuracy
    run = json.loads((root / "checkpoints/run.json").read_text())["settings"]
    assert run["streamed_states"]["layer_ids"] == [2, 15, 27, 30] and "shards_index_sha256" not in run


def test_sigkill_then_rerun_ends_at_the_streamed_run_s_weights(extracted_real, streamed, tmp_path):
    reference, _ = streamed
    killed = streamed_project(extracted_real, tmp_path / "killed", **BUFFER)
    kill_mid_run(killed, "train", lambda: any((killed / "checkpoints").glob("step-0000004")))
    left = sorted(p.name for p in (killed / "checkpoints").glob("step-*"))
    assert left and left[-1] < _final_weights(reference)[0], "the kill must land before training finished"
    resumed = eagle3(killed, "train")
    assert "resuming from" in resumed.stderr
    name, weights = _final_weights(killed)
    expected_name, expected = _final_weights(reference)
    assert name == expected_name
    for key in expected:
        assert torch.equal(weights[key], expected[key]), key
    assert (killed / CURVE).read_text() == (reference / CURVE).read_text()


def test_two_processes_stream_what_one_does(extracted_real, streamed, tmp_path):
    """Rank 0 computes every global batch and hands each rank its share through the spool."""
    one, _ = streamed
    two = streamed_project(extracted_real, tmp_path / "two", **BUFFER, launch={"processes_per_node": 2})
    # torchrun would give each process 1 thread: rank 0's forward passes then round otherwise than the single
    # process's (measured 4e-4 apart by step 8 on AMX). With the single process's thread count they make the same
    # states bit for bit.
    threads = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    result = subprocess.run(
        [sys.executable, "-m", "eagle3.cli", "train"], cwd=two, capture_output=True, text=True, timeout=900, env=threads
    )
    assert result.returncode == 0, result.stderr[-2000:]
    single, double = losses(one), losses(two)
    assert len(single) == len(double)
    # Only the gradient sums differ, in order (tests/test_train.py: two processes match one).
    for a, b in zip(single, double, strict=True):
        assert abs(a - b) <= 1e-4 * abs(a), (single, double)


def _error(root, *args):
    result = eagle3(root, *args, check=False)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    return lines[-1]


def test_streamed_mode_s_bad_input_is_one_line(extracted_real, tmp_path):
    small = streamed_project(extracted_real, tmp_path / "small", stream_buffer_gb=0.001)
    line = _error(small, "train")
    assert line.startswith("eagle3 train: error: train.stream_buffer_gb: 0.001 GB holds less than one step's states")
    assert "raise it to at least 0.0" in line
    assert not list((small / "checkpoints").glob("step-*"))

    phases = streamed_project(extracted_real, tmp_path / "phases", stream_buffer_gb=0.01, stream_phase_steps=50)
    assert "holds less than 50 steps' (train.stream_phase_steps) states" in _error(phases, "train")

    both = copy_project(extracted_real, tmp_path / "both", draft_params(hidden_states="streamed"))
    assert _error(both, "train") == (
        "eagle3 train: error: params.yaml: extract.splits: train.hidden_states is streamed, so training computes "
        "the training split's states itself; set extract.splits to [heldout] so extract does not store them too"
    )

    vllm = streamed_params()
    vllm["extract"]["backend"] = "vllm"
    on_cpu = copy_project(extracted_real, tmp_path / "vllm", vllm)
    assert _error(on_cpu, "train") == (
        "eagle3 train: error: train.hidden_states: streamed with extract.backend vllm needs GPUs: vLLM's CPU engine "
        "pins the cores the trainer computes on; on this machine set extract.backend: hf"
    )

    moved = streamed_project(extracted_real, tmp_path / "moved")
    weights = moved / "models/verifier/model.safetensors"
    data = bytearray(weights.read_bytes())
    recorded = hashlib.sha256(data).hexdigest()
    # The same shapes and size, one byte of one weight changed (a fine-tune's copy would differ more).
    data[len(data) // 2] ^= 1
    weights.unlink()  # a hard link into the shared project: replaced, not edited
    weights.write_bytes(data)
    line = _error(moved, "train")
    assert line == (
        f"eagle3 train: error: {weights}: {len(data):,} bytes of sha256 {hashlib.sha256(data).hexdigest()}, the "
        f"verifier stage recorded {len(data):,} bytes of sha256 {recorded} in {moved}/models/verifier/provenance.json"
        ": another copy or revision; fetch the recorded one, or run `dvc repro --force --single-item verifier` to "
        "record this one (a plain `dvc repro` keeps the recorded one: the directory is not a DVC dependency), then "
        "`dvc repro` reruns every later stage"
    ), line
