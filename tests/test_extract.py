import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from eagle3.formats.provenance import read_provenance
from eagle3.formats.shards import HiddenStateDataset, ShardReader
from eagle3.formats.synthetic import iter_records

from conftest import eagle3, kill_mid_run, write_params
from fake_openai import FakeServer, completion
from test_generate import _params, project

# These tests extract in float32 (the shards store bf16 either way) and run their reference forward passes in it:
# two ways of computing the same states then differ by bf16 storage rounding alone, on every CPU kind. In bf16 the
# padding, the thread count and the CPU's bf16 units (AMX or not) move the states by percents, 30 layers deep.
COMPUTE_DTYPE = torch.float32
# bf16 keeps 8 significant bits: a stored value is within half a unit in its last place of the float32 one, at most
# 2**-8 relative, so a stored layer is within 2**-8 of the float32 states, norm-relative (measured: <= 2.5e-3 on an
# AVX2 EPYC). Two engines' float32 states stored in bf16 differ only where float32 rounding moves a value across a
# bf16 rounding boundary, which few do (measured: <= 1.8e-4).
STORAGE_ROUNDING = 2**-8

pytestmark = pytest.mark.slow


def _answer(body):
    question = body["messages"][-1]["content"]
    return completion(f"Here is a careful answer about {question[:60]} with a few more words to learn from.")


def _extract_params(server_url: str, **extract) -> dict:
    params = _params({"backend": "openai", "openai": {"base_urls": [server_url], "model": "verifier"}})
    # 1 MB of raw states (~227 tokens of this verifier): several shards per part, so shard boundaries are exercised.
    params["extract"].update({"shard_raw_mb": 1, "dtype": "float32", **extract})
    return params


@pytest.fixture(scope="module")
def extracted(verifier_project, tmp_path_factory):
    root = tmp_path_factory.mktemp("extracted")
    with FakeServer(_answer) as server:
        project(root, verifier_project, _extract_params(server.url))
        eagle3(root, "generate")
    eagle3(root, "extract")
    return root


def _shards(root, split="train"):
    return sorted((root / "data/hidden" / split).glob("shard-*.e3sh"))


def test_states_match_an_unbatched_forward_and_layers_are_in_vllm_order(extracted):
    from transformers import AutoModelForCausalLM

    provenance = read_provenance(extracted)
    reader = ShardReader(_shards(extracted)[1])
    assert reader.meta.layer_ids == (2, 15, 27, 30)
    model = AutoModelForCausalLM.from_pretrained(extracted / "models/verifier", dtype=COMPUTE_DTYPE).eval()
    for position in (0, len(reader) - 1):
        sample = reader.read(position)
        with torch.no_grad():
            states = model(sample.input_ids[None], output_hidden_states=True).hidden_states
        assert len(states) == provenance.num_hidden_layers + 1

        def error(stored, layer, states=states):
            expected = states[layer][0].float()
            return ((stored.float() - expected).norm() / expected.norm()).item()

        for stored, layer in zip(sample.hidden, reader.meta.layer_ids, strict=True):
            # Batched vs unbatched: storage rounding only; the neighbouring layer is far off.
            own, neighbour = error(stored, layer), error(stored, layer - 1)
            assert own < STORAGE_ROUNDING and neighbour > 3 * own, (layer, own, neighbour)
        # The final layer is the normed output: lm_head over it gives the verifier's own logits.
        with torch.no_grad():
            from_stored = model.lm_head(sample.hidden[-1][None].to(COMPUTE_DTYPE)).argmax(-1)
            direct = model(sample.input_ids[None]).logits.argmax(-1)
        assert (from_stored == direct).float().mean() > 0.9  # bf16 near-ties aside; an un-normed state gets ~0


def test_loss_mask_covers_exactly_the_assistant_turns(extracted):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(extracted / "models/verifier")
    records = {r["id"]: r for r in iter_records(extracted, "train") if r["status"] == "ok"}
    dataset = HiddenStateDataset(_shards(extracted))
    multi_turn = 0
    for position in range(len(dataset)):
        item = dataset[position]
        record = records[item["id"]]
        masked = tokenizer.decode(item["input_ids"][item["loss_mask"]])
        expected = "".join(m["content"] + "<|im_end|>" for m in record["messages"] if m["role"] == "assistant")
        assert masked == expected
        multi_turn += sum(m["role"] == "assistant" for m in record["messages"]) > 1
    # Every ok record is there but the long prompt, whose answer lies past max_seq_len (see test_metrics_and_index).
    assert multi_turn >= 1 and len(dataset) == len(records) - 1
    # Batches run shortest first, but records stay in plan (prepared) order.
    stored = [dataset[position]["id"] for position in range(len(dataset))]
    assert stored == [sample_id for sample_id in records if sample_id in set(stored)]
    lengths = [len(dataset[position]["input_ids"]) for position in range(len(dataset))]
    assert lengths != sorted(lengths)  # else plan order and length order could not be told apart


def test_metrics_and_index(extracted):
    metrics = json.loads((extracted / "metrics/extract.json").read_text())
    shards = _shards(extracted) + _shards(extracted, "heldout")
    assert metrics["samples"] == 40 and metrics["raw_bytes_per_token"] == 4 * 576 * 2
    assert metrics["bytes_on_disk"] == sum(p.stat().st_size for p in shards)
    assert metrics["compression_ratio"] == round(4608 * metrics["tokens"] / metrics["bytes_on_disk"], 3) > 1.3
    assert metrics["truncated"] == 1 and metrics["skipped"] == {"no_loss_tokens_after_truncation": 1}
    index = json.loads((extracted / "data/hidden/index.json").read_text())
    assert sum(s["tokens"] for split in index["splits"].values() for s in split) == metrics["tokens"]
    assert len(_shards(extracted)) >= 3


def test_sigkill_then_rerun_is_byte_identical(extracted, verifier_project, tmp_path):
    with FakeServer(_answer) as server:
        root = project(tmp_path, verifier_project, _extract_params(server.url))
        eagle3(root, "generate")
    kill_mid_run(root, "extract", lambda: bool(_shards(root)))
    assert 1 <= len(_shards(root)) < len(_shards(extracted))
    done = len(list((root / "data/hidden").glob("*/part-*.done.json")))
    rerun = eagle3(root, "extract")
    # Finished parts are not planned again: only the remaining ones (6 parts: 5 train, 1 held-out).
    assert f"extract: {6 - done} of 6 parts to do (rank 0/1)" in rerun.stderr
    assert _files(root) == _files(extracted)


def test_ranks_sharing_a_directory_equal_one_process(extracted, tmp_path):
    root = tmp_path / "ranks"
    shutil.copytree(extracted, root, copy_function=os.link)
    shutil.rmtree(root / "data/hidden")
    (root / "metrics/extract.json").unlink()
    ranks = [
        subprocess.Popen(
            [sys.executable, "-m", "eagle3.cli", "extract", "--rank", str(rank), "--world-size", "2"],
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    logs = [rank.communicate(timeout=600)[1] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], logs
    # Rank 0 takes parts 0, 2, 4 of train and 0 of held-out; rank 1 parts 1 and 3 of train.
    assert "extract: 4 of 6 parts to do (rank 0/2)" in logs[0] and "extract: 2 of 6 parts to do (rank 1/2)" in logs[1]
    if not (root / "metrics/extract.json").is_file():  # both finished at once: neither saw the other's parts done
        eagle3(root, "extract")

    def data(project):
        return {name: data for name, data in _files(project).items() if not name.startswith("environments/")}

    assert data(root) == data(extracted)
    logs = sorted(p.name for p in (root / "data/hidden/environments").iterdir())
    assert len(logs) == 2 and logs[0].endswith("-rank1.json") != logs[1].endswith("-rank1.json")
    ours, theirs = (json.loads((p / "metrics/extract.json").read_text()) for p in (root, extracted))
    assert {k: v for k, v in ours.items() if k != "this_run"} == {k: v for k, v in theirs.items() if k != "this_run"}


def _files(root):
    base = root / "data/hidden"
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def test_truncation_is_counted_and_refusals_are_one_line(extracted, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(extracted, root, copy_function=os.link)
    shutil.rmtree(root / "data/hidden")
    url = "http://127.0.0.1:9/v1"

    write_params(root, _extract_params(url, reserve_free_gb=1e9))
    result = eagle3(root, "extract", check=False)
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith("GB are free; free space, lower extract.reserve_free_gb, or set extract.ignore_disk_check: true")
    )
    assert not _shards(root)

    write_params(root, _extract_params(url, aux_layer_ids=[2, 15, 40]))
    result = eagle3(root, "extract", check=False)
    assert result.stderr.strip().splitlines()[-1] == (
        "eagle3 extract: error: extract.aux_layer_ids: [2, 15, 40] must be < 30 (the verifier's layer count)"
    )

    # Another copy of the verifier than the one recorded (a hand-edited tokenizer file here): refused before any
    # state is computed, naming the file.
    tokenizer_config = root / "models/verifier/tokenizer_config.json"
    original = tokenizer_config.read_bytes()
    tokenizer_config.unlink()  # a hard link into the shared project: replaced, not edited
    tokenizer_config.write_bytes(original + b"\n")
    write_params(root, _extract_params(url))
    result = eagle3(root, "extract", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"eagle3 extract: error: {root}/models/verifier: a tokenizer file (tokenizer.json, tokenizer_config.json) "
            f"is not what the verifier stage recorded in {root}/models/verifier/provenance.json (tokenizer_sha256 "
        )
    )
    assert not _shards(root)
    tokenizer_config.write_bytes(original)

    write_params(root, _extract_params(url, max_seq_len=40))
    eagle3(root, "extract")
    metrics = json.loads((root / "metrics/extract.json").read_text())
    assert metrics["truncated"] > 0
    dataset = HiddenStateDataset(_shards(root) + _shards(root, "heldout"))
    assert max(len(dataset[i]["input_ids"]) for i in range(len(dataset))) == 40
    assert metrics["samples"] + metrics["skipped"]["no_loss_tokens_after_truncation"] == 41  # 40 prompts + the long one


# extract.backend vllm: vLLM's extract_hidden_states method (eagle3/engines/hidden_states/vllm_capture.py), on CPU.
VLLM_CPU = {"gpu_memory_utilization": 0.3, "cpu_kvcache_space_gib": 1, "enforce_eager": True}


@pytest.fixture(scope="module")
def vllm_extracted(extracted, tmp_path_factory):
    """The `extracted` project (same synthetic data) re-extracted with the vllm backend."""
    root = tmp_path_factory.mktemp("vllm-extracted") / "project"
    shutil.copytree(extracted, root, copy_function=os.link)
    shutil.rmtree(root / "data/hidden")
    (root / "metrics/extract.json").unlink()
    write_params(root, _extract_params("http://127.0.0.1:9/v1", backend="vllm", vllm=VLLM_CPU))
    eagle3(root, "extract")
    return root


def _relative_error(actual, expected):
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


def test_vllm_backend_matches_hf_within_storage_rounding(extracted, vllm_extracted):
    from transformers import AutoModelForCausalLM

    lm_head = AutoModelForCausalLM.from_pretrained(extracted / "models/verifier", dtype=COMPUTE_DTYPE).lm_head
    for split in ("train", "heldout"):
        hf_shards, vllm_shards = _shards(extracted, split), _shards(vllm_extracted, split)
        assert [p.name for p in vllm_shards] == [p.name for p in hf_shards]  # same plan, so resume works alike
        hf, vllm = HiddenStateDataset(hf_shards), HiddenStateDataset(vllm_shards)
        assert len(vllm) == len(hf) > 0
        for position in range(len(hf)):
            a, b = hf[position], vllm[position]
            assert b["id"] == a["id"]
            assert torch.equal(b["input_ids"], a["input_ids"]) and torch.equal(b["loss_mask"], a["loss_mask"])
            assert b["hidden"].shape == a["hidden"].shape and b["hidden"].dtype == torch.bfloat16
            errors = [_relative_error(b["hidden"][k], a["hidden"][k]) for k in range(4)]
            # Both engines compute in float32: storage rounding only. Swapped layers or a missing final norm are
            # >= 15% off.
            assert max(errors) < STORAGE_ROUNDING, (a["id"], errors)
            assert _relative_error(b["hidden"][1], a["hidden"][2]) > 0.1
            with torch.no_grad():
                stored = (b["hidden"][-1].to(COMPUTE_DTYPE), a["hidden"][-1].to(COMPUTE_DTYPE))  # shards hold bf16
                agreement = (lm_head(stored[0]).argmax(-1) == lm_head(stored[1]).argmax(-1)).float().mean()
            assert agreement > 0.9, (a["id"], agreement)
    hf_metrics = json.loads((extracted / "metrics/extract.json").read_text())
    vllm_metrics = json.loads((vllm_extracted / "metrics/extract.json").read_text())
    for key in ("samples", "tokens", "loss_tokens", "truncated", "skipped"):
        assert vllm_metrics[key] == hf_metrics[key], key
    assert vllm_metrics["this_run"]["tokens"] == vllm_metrics["tokens"] > 0
    # vLLM pads nothing: its batches run across shard boundaries (smoke shards hold ~2 sequences), the hf
    # backend's stay within a shard.
    shards = len(_shards(extracted)) + len(_shards(extracted, "heldout"))
    assert vllm_metrics["this_run"]["forward_passes"] < shards <= hf_metrics["this_run"]["forward_passes"]
    assert not (vllm_extracted / "data/hidden/.vllm-spool").exists()


def test_vllm_backend_resumes_byte_identical_and_a_rerun_keeps_the_last_measurement(vllm_extracted, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(vllm_extracted, root, copy_function=shutil.copy2)
    redo = _shards(root)[1]
    redo.unlink()
    (root / "data/hidden/.vllm-spool/rank0").mkdir(parents=True)  # what a run killed mid-batch leaves behind
    (root / "data/hidden/.vllm-spool/rank0/0.safetensors").write_bytes(b"half a file")
    eagle3(root, "extract")
    assert _files(root) == _files(vllm_extracted)
    metrics = json.loads((root / "metrics/extract.json").read_text())
    assert metrics["this_run"]["tokens"] == sum(e["tokens"] for e in ShardReader(redo).entries) > 0

    (root / "metrics/extract.json").unlink()  # as `dvc repro` does before it runs the stage
    eagle3(root, "extract")  # nothing left to do: the measurement of the run that did work stays
    assert json.loads((root / "metrics/extract.json").read_text()) == metrics


THINKING_SWITCH = (
    "{% set empty = '' if (thinking | default(true)) else '<think></think>' %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}{{ empty }}{% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{{ empty }}{% endif %}"
)


def test_layout_renders_with_the_records_template_kwargs(verifier_project):
    """Generate passed chat_template_kwargs to the template; extract renders the same prompt (here: an empty
    thinking block that a thinking-off template adds), masked as prompt, not as generated text."""
    from transformers import AutoTokenizer

    from eagle3.chat.token_layout import layout

    tokenizer = AutoTokenizer.from_pretrained(verifier_project / "models/verifier")
    tokenizer.chat_template = THINKING_SWITCH
    messages = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]
    (default,) = layout(tokenizer, "s", messages, 512)
    (switched_off,) = layout(tokenizer, "s", messages, 512, {"thinking": False})
    assert "<think></think>" not in tokenizer.decode(default.input_ids)
    assert "<|im_start|>assistant\n<think></think>" in tokenizer.decode(switched_off.input_ids)
    assert len(switched_off.input_ids) > len(default.input_ids)
    for sequence in (default, switched_off):
        assert tokenizer.decode(sequence.input_ids[sequence.loss_mask]) == "Blue.<|im_end|>"


def _conversations_in_parts(folder, parts: int, per_part: int) -> list:
    from eagle3.formats.synthetic import part_path, write_part
    from eagle3.stages.extract import Part

    folder.mkdir(parents=True)
    made = []
    for index in range(parts):
        records = [
            {
                "id": f"s{index}-{row}",
                "source": "test",
                "origin": "test",
                "prompt_hash": f"{index:032x}{row:032x}",
                "status": "ok",
                "skip_reason": None,
                "truncated_reason": None,
                "messages": [
                    {"role": "user", "content": f"Question {index}.{row}: " + "why is the sky blue? " * 8},
                    {"role": "assistant", "content": f"Answer {index}.{row}: " + "Rayleigh scattering. " * 12},
                ],
                "turns": [
                    {"finish_reason": "stop", "prompt_tokens": 30, "completion_tokens": 37, "reasoning_format": None}
                ],
                "sampling": {},
                "chat_template_kwargs": {},
                "verifier": "test",
                "backend": "hf",
            }
            for row in range(per_part)
        ]
        write_part(part_path(folder, index), records)
        made.append(Part("train", index, part_path(folder, index)))
    return made


def test_planning_memory_does_not_grow_with_the_conversations(verifier_project, tmp_path):
    """Planning N and 4N conversations (in parts of 32) streams at the same peak; holding every plan, as planning
    all before the first forward pass did, grows with N (the control shows the meter sees it)."""
    import tracemalloc

    from transformers import AutoTokenizer

    from eagle3.formats.shards import ShardMeta
    from eagle3.params.extract import ExtractParams
    from eagle3.stages.extract import planned_parts

    tokenizer = AutoTokenizer.from_pretrained(verifier_project / "models/verifier")
    config = ExtractParams(shard_raw_mb=1)
    meta = ShardMeta("verifier", (2, 15, 27, 30), 576, "0" * 64)
    few = _conversations_in_parts(tmp_path / "few", 8, 32)
    many = _conversations_in_parts(tmp_path / "many", 32, 32)

    def peak(parts, keep: bool) -> tuple[int, int]:
        kept, sequences = [], 0
        tracemalloc.start()
        for plan in planned_parts(parts, tokenizer, config, meta):
            sequences += sum(len(shard.sequences) for shard in plan.shards)
            if keep:
                kept.append(plan)
        _, highest = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return highest, sequences

    peak(few, keep=False)  # the tokenizer's first-call caches are not what we measure
    streamed_few, count_few = peak(few, keep=False)
    streamed_many, count_many = peak(many, keep=False)
    held_many, _ = peak(many, keep=True)
    assert (count_few, count_many) == (256, 1024)
    assert streamed_many < 1.3 * streamed_few, (streamed_few, streamed_many)
    assert held_many > 2.5 * streamed_many, (streamed_many, held_many)


def test_a_default_that_repeats_a_layer_is_refused():
    """(2, N//2, N-3) repeats layer 3 at N = 6 (the Kimi-shaped miniature's depth): one line naming the fix."""
    from types import SimpleNamespace

    from eagle3.engines.hidden_states.base import layer_ids
    from eagle3.errors import Eagle3Error
    from eagle3.params.extract import ExtractParams

    six = SimpleNamespace(num_hidden_layers=6, default_aux_layer_ids=(2, 3, 3))
    with pytest.raises(Eagle3Error) as caught:
        layer_ids(ExtractParams(), six)
    assert str(caught.value) == (
        "extract.aux_layer_ids: the verifier's default [2, 3, 3] ((2, N//2, N-3) at N = 6) repeats a layer; set "
        "extract.aux_layer_ids to distinct layers"
    )
    assert layer_ids(ExtractParams(aux_layer_ids=[1, 3, 4]), six) == (1, 3, 4, 6)
