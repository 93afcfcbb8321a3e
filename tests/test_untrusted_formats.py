"""The other files the stages read from a remote (issue 33), made hostile here: synthetic parts, training
checkpoints, the vocab file, extract's per-part records and data/hidden/index.json. Each is one Eagle3Error
line naming the file and the field, never another exception; the bombs are refused before they are inflated.
(Longer than most modules: one hostile case per field of five formats.)"""

import dataclasses
import json
import shutil
import tracemalloc
from pathlib import Path

import pytest
import torch
import zstandard
from safetensors.torch import save_file
from test_untrusted_shards import GIB, _zeros_frame

from eagle3.errors import Eagle3Error
from eagle3.formats.checkpoints import (
    MODEL,
    OPTIMIZER,
    STATE,
    CheckpointState,
    load_checkpoint,
    load_draft,
    save_checkpoint,
)
from eagle3.formats.extracted_parts import PartDone, read_done, write_done
from eagle3.formats.shards import read_index
from eagle3.formats.synthetic import read_part, write_part
from eagle3.formats.vocab import load_vocab, save_vocab
from eagle3.modeling.draft import DraftConfig, Eagle3Draft
from eagle3.params.train import TrainParams
from eagle3.training.optimizers import make_optimizer


def _one_line(caught) -> str:
    message = str(caught.value)
    assert "\n" not in message and type(caught.value) is Eagle3Error
    return message


# --- synthetic parts -----------------------------------------------------------------------------------------


def _record(number: int = 0, **changes):
    record = {
        "id": f"{number:016x}",
        "source": "eagle3-prompts",
        "origin": "eagle3-prompts",
        "prompt_hash": "ab" * 32,
        "status": "ok",
        "skip_reason": None,
        "truncated_reason": None,
        "messages": [
            {"role": "user", "content": "Why is the sky blue?"},
            # U+2028 and U+0085: JSON leaves them unescaped, and str.splitlines would split the record at them.
            {"role": "assistant", "content": "Rayleigh\u2028scattering.\x85", "reasoning": None},
        ],
        "turns": [{"finish_reason": "stop", "prompt_tokens": 12, "completion_tokens": 5, "reasoning_format": None}],
        "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 32, "seed": 0},
        "chat_template_kwargs": {},
        "verifier": "org/model",
        "backend": "vllm",
    }
    return {**record, **changes}


def test_a_part_reads_back_as_written(tmp_path):
    records = [_record(0), _record(1, status="skipped", skip_reason="prompt_too_long", turns=[])]
    write_part(tmp_path / "part-00000.jsonl.zst", records)
    assert read_part(tmp_path / "part-00000.jsonl.zst") == records


HOSTILE_RECORDS = {
    "messages not a list": (_record(messages="hi"), "record 0: messages: Input should be a valid list"),
    "a count as a string": (
        _record(turns=[{**_record()["turns"][0], "completion_tokens": "5"}]),
        "record 0: turns[0].completion_tokens: Input should be a valid integer (got '5')",
    ),
    "a negative count": (
        _record(turns=[{**_record()["turns"][0], "prompt_tokens": -1}]),
        "record 0: turns[0].prompt_tokens: Input should be greater than or equal to 0",
    ),
    "an unknown status": (_record(status="done"), "record 0: status: Input should be 'ok' or 'skipped'"),
    "no id": ({k: v for k, v in _record().items() if k != "id"}, "record 0: id: Field required"),
    "an extra field": (_record(extra=1), "record 0: extra: Extra inputs are not permitted"),
    "an id with a newline": (_record(id="a\nTraceback"), "record 0: id: String should match pattern"),
    "a message without content": (
        _record(messages=[{"role": "user"}]),
        "record 0: messages[0].content: Field required",
    ),
    "skipped without a reason": (_record(status="skipped"), "record 0: status and skip_reason disagree"),
    "a reason that is not a count name": (
        _record(status="skipped", skip_reason="too long\n"),
        "record 0: skip_reason: String should match pattern",
    ),
    "a list, not an object": ([1, 2], "record 0: Input should be a valid dictionary"),
}


@pytest.mark.parametrize("case", list(HOSTILE_RECORDS))
def test_a_record_of_the_wrong_shape_is_one_line_naming_the_part_and_the_record(tmp_path, case):
    record, message = HOSTILE_RECORDS[case]
    path = tmp_path / "part-00003.jsonl.zst"
    payload = json.dumps(_record(7)) + "\n" + json.dumps(record) + "\n"
    path.write_bytes(zstandard.ZstdCompressor().compress(payload.encode()))
    with pytest.raises(Eagle3Error) as caught:
        read_part(path)
    assert _one_line(caught).startswith(f"{path}: {message.replace('record 0', 'record 1')}"), str(caught.value)
    assert str(caught.value).endswith("delete it and rerun `eagle3 generate` to regenerate it")


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "record 1: not JSON (Expecting property name"),
        ("[" * 100000, "record 1: not JSON (maximum recursion"),
    ],
    ids=["not JSON", "deeply nested"],
)
def test_a_line_that_is_not_json_is_one_line_naming_the_record(tmp_path, line, message):
    path = tmp_path / "part-00000.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(f"{json.dumps(_record())}\n{line}\n".encode()))
    with pytest.raises(Eagle3Error) as caught:
        read_part(path)
    assert _one_line(caught).startswith(f"{path}: {message}"), str(caught.value)


def test_a_decompression_bomb_part_is_refused_before_it_is_inflated(tmp_path):
    path = tmp_path / "part-00000.jsonl.zst"
    path.write_bytes(_zeros_frame(GIB))
    tracemalloc.start()
    with pytest.raises(Eagle3Error) as caught:
        read_part(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert _one_line(caught) == (
        f"{path}: the part declares {GIB} bytes decompressed, over 1000x its {path.stat().st_size} compressed "
        "bytes: not a part generate wrote (a decompression bomb?); delete it and rerun `eagle3 generate` to "
        "regenerate it"
    )
    assert peak < 4 * path.stat().st_size  # the file read, nothing inflated


@pytest.mark.parametrize(
    "data, message",
    [
        (_zeros_frame(2**20, declare_size=False), "the part's zstd frame declares no size (generate's always does)"),
        (zstandard.ZstdCompressor().compress(json.dumps(_record()).encode() * 9)[:-9], "damaged part ("),
        (b"", "damaged part ("),
        (zstandard.ZstdCompressor().compress(b'{"a": 1}\n') * 2, "damaged part ("),
        (zstandard.ZstdCompressor().compress(b"\xff\xfe\n"), "damaged part ("),
    ],
    ids=["no declared size", "a damaged frame", "empty", "two frames", "not UTF-8"],
)
def test_a_part_that_is_not_one_zstd_frame_of_text_is_one_line(tmp_path, data, message):
    path = tmp_path / "part-00000.jsonl.zst"
    path.write_bytes(data)
    with pytest.raises(Eagle3Error) as caught:
        read_part(path)
    assert _one_line(caught).startswith(f"{path}: {message}"), str(caught.value)


# --- checkpoints ---------------------------------------------------------------------------------------------


CONFIG = DraftConfig(
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    intermediate_size=64,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    vocab_size=100,
    draft_vocab_size=40,
    max_position_embeddings=256,
    aux_layer_ids=(2, 6, 9),
    rope={"rope_theta": 10000.0},
)


def _checkpoint(out, config=CONFIG):
    """A checkpoint of a draft and AdamW after one step (every parameter with its state)."""
    torch.manual_seed(0)
    draft = Eagle3Draft(config)
    optimizer = make_optimizer(draft, TrainParams())
    sum(p.sum() for p in draft.parameters()).backward()
    optimizer.step()
    state = CheckpointState(step=3, total_steps=3, run_key="k" * 64, draft_config=config)
    return save_checkpoint(out, draft, optimizer, state, keep=1), draft


def test_a_checkpoint_loads_back_as_saved(tmp_path):
    path, saved = _checkpoint(tmp_path)
    draft, state = load_draft(path)
    assert state.step == 3 and state.draft_config == CONFIG
    for name, tensor in saved.state_dict().items():
        assert torch.equal(draft.state_dict()[name], tensor), name
    fresh = Eagle3Draft(CONFIG)
    optimizer = make_optimizer(fresh, TrainParams())
    assert load_checkpoint(path, fresh, optimizer).step == 3
    assert len(optimizer.state) == len(list(fresh.parameters()))


def test_a_checkpoint_of_another_layout_refuses_to_resume(tmp_path):
    """norm_output adds no tensor: without the check its checkpoint would resume into a draft that feeds the
    pre-norm state back, silently."""
    path, _ = _checkpoint(tmp_path)
    other = Eagle3Draft(dataclasses.replace(CONFIG, norm_output=True))
    optimizer = make_optimizer(other, TrainParams())
    with pytest.raises(Eagle3Error, match=r"trained with draft layout no extra norms, not train.draft_layout's "):
        load_checkpoint(path, other, optimizer)


def test_a_checkpoint_of_the_other_draft_layer_refuses_in_one_line(tmp_path):
    """A Llama-style checkpoint resumed into an MLA draft, and exported as one: each refuses naming both layers."""
    from eagle3.stages import export

    path, _ = _checkpoint(tmp_path / "checkpoints")
    mla = Eagle3Draft(
        dataclasses.replace(
            CONFIG,
            draft_layer="mla",
            q_lora_rank=16,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=4,
            v_head_dim=8,
            num_key_value_heads=4,
            head_dim=4,
        )
    )
    with pytest.raises(Eagle3Error, match=r"a llama draft layer, not train.draft_layer's mla; a run cannot change"):
        load_checkpoint(path, mla, make_optimizer(mla, TrainParams()))
    with pytest.raises(Eagle3Error, match=r"a llama draft layer, not train.draft_layer's mla; rerun `dvc repro train"):
        export.run(export.Params(train=TrainParams(draft_layer="mla")), tmp_path)


def test_a_checkpoint_of_another_layout_is_not_exported_as_the_configured_one(tmp_path):
    from eagle3.params.train import DraftLayout, TrainParams
    from eagle3.stages import export

    _checkpoint(tmp_path / "checkpoints")
    params = export.Params(train=TrainParams(draft_layout=DraftLayout(fc_norm=True, norm_output=True)))
    with pytest.raises(
        Eagle3Error,
        match=r"trained with draft layout no extra norms, not train.draft_layout's fc_norm, norm_output; rerun `dvc",
    ):
        export.run(params, tmp_path)


def test_a_resumed_run_maps_no_checkpoint_that_keep_checkpoints_deletes(tmp_path):
    """The state loaded from a checkpoint is a copy: once the checkpoint is deleted, its disk space comes back (a
    mapping of it would hold the deleted file's blocks for the rest of the run: ~9.5 GB at Kimi-K2.5's draft)."""
    path, _ = _checkpoint(tmp_path / "checkpoints")
    fresh = Eagle3Draft(CONFIG)
    optimizer = make_optimizer(fresh, TrainParams())
    load_checkpoint(path, fresh, optimizer)
    shutil.rmtree(path)
    held = [line for line in Path("/proc/self/maps").read_text().splitlines() if str(tmp_path) in line]
    assert held == []
    assert sum(state["exp_avg"].abs().sum() for state in optimizer.state.values()) > 0  # the state is all there


def _replace_tensor(file, name, value):
    from safetensors.torch import load_file

    tensors = load_file(str(file))
    if value is None:
        del tensors[name]
    else:
        tensors[name] = value
    save_file(tensors, str(file))


HOSTILE_MODELS = {
    "truncated": (
        lambda f: f.write_bytes(f.read_bytes()[:-100]),
        "not a readable safetensors file (Error while deserializing header: incomplete metadata",
    ),
    "random bytes": (lambda f: f.write_bytes(bytes(range(256)) * 4), "not a readable safetensors file ("),
    "empty": (lambda f: f.write_bytes(b""), "not a readable safetensors file ("),
    "a tensor of another shape": (
        lambda f: _replace_tensor(f, "fc.weight", torch.zeros(32, 64)),
        "fc.weight has shape [32, 64], expected [32, 96]",
    ),
    "a tensor of another dtype": (
        lambda f: _replace_tensor(f, "norm.weight", torch.ones(32, dtype=torch.bfloat16)),
        "norm.weight is torch.bfloat16, expected torch.float32",
    ),
    "a tensor missing": (
        lambda f: _replace_tensor(f, "lm_head.weight", None),
        "not the tensors expected (lm_head.weight missing)",
    ),
    "an extra tensor": (
        lambda f: _replace_tensor(f, "extra", torch.zeros(1)),
        "not the tensors expected (extra unexpected)",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE_MODELS))
@pytest.mark.parametrize("reader", ["load_draft", "load_checkpoint"])
def test_a_hostile_model_file_is_one_line(tmp_path, case, reader):
    path, _ = _checkpoint(tmp_path)
    change, message = HOSTILE_MODELS[case]
    change(path / MODEL)
    with pytest.raises(Eagle3Error) as caught:
        if reader == "load_draft":
            load_draft(path)
        else:
            load_checkpoint(path, Eagle3Draft(CONFIG), None)
    assert _one_line(caught).startswith(f"{path / MODEL}: {message}"), str(caught.value)
    assert str(caught.value).endswith(
        f"delete {path} and rerun `eagle3 train` (it resumes from the checkpoint before, if any)"
    )


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("fc.weight::exp_avg", torch.zeros(3), "fc.weight::exp_avg has shape [3], expected [32, 96]"),
        ("fc.weight::step", torch.zeros(1, dtype=torch.float64), "fc.weight::step is torch.float64, expected"),
        ("nothing::exp_avg", torch.zeros(1), "not the tensors expected (nothing::exp_avg unexpected)"),
        ("fc.weight", torch.zeros(1), "not the tensors expected (fc.weight unexpected)"),
    ],
)
def test_a_hostile_optimizer_file_is_one_line(tmp_path, name, value, message):
    path, _ = _checkpoint(tmp_path)
    _replace_tensor(path / OPTIMIZER, name, value)
    draft = Eagle3Draft(CONFIG)
    with pytest.raises(Eagle3Error) as caught:
        load_checkpoint(path, draft, make_optimizer(draft, TrainParams()))
    assert _one_line(caught).startswith(f"{path / OPTIMIZER}: {message}"), str(caught.value)


def _state_with(**changes):
    def change(state):
        return {**state, **changes}

    return change


def _config_with(**changes):
    def change(state):
        return {**state, "draft_config": {**state["draft_config"], **changes}}

    return change


HOSTILE_STATES = {
    "step a string": (_state_with(step="3"), "step: Input should be a valid integer (got '3')"),
    "step zero": (_state_with(step=0), "step: Input should be greater than or equal to 1"),
    "step past the total": (_state_with(step=4), "step 4 is past total_steps 3"),
    "no run key": (lambda s: {k: v for k, v in s.items() if k != "run_key"}, "run_key: Field required"),
    "an extra field": (_state_with(extra=1), "extra: Extra inputs are not permitted"),
    "draft_config a list": (_state_with(draft_config=[1]), "draft_config: Input should be an object"),
    "hidden_size a string": (_config_with(hidden_size="32"), "draft_config.hidden_size: Input should be a valid"),
    "hidden_size negative": (_config_with(hidden_size=-32), "draft_config.hidden_size is -32, expected at least 1"),
    "aux_layer_ids 5": (_config_with(aux_layer_ids=5), "draft_config.aux_layer_ids: Input should be a valid array"),
    "rms_norm_eps NaN": (_config_with(rms_norm_eps=float("nan")), "draft_config.rms_norm_eps is nan"),
    "an unknown activation": (_config_with(hidden_act="nope"), "draft_config does not describe a draft ("),
}


@pytest.mark.parametrize("case", list(HOSTILE_STATES))
def test_a_hostile_state_json_is_one_line(tmp_path, case):
    path, _ = _checkpoint(tmp_path)
    change, message = HOSTILE_STATES[case]
    (path / STATE).write_text(json.dumps(change(json.loads((path / STATE).read_text()))))
    with pytest.raises(Eagle3Error) as caught:
        load_draft(path)
    assert _one_line(caught).startswith(f"{path / STATE}: {message}"), str(caught.value)


def test_a_state_json_that_is_not_utf8_json_is_one_line(tmp_path):
    path, _ = _checkpoint(tmp_path)
    (path / STATE).write_bytes(b"\xff\xfe{")
    with pytest.raises(Eagle3Error) as caught:
        load_draft(path)
    assert _one_line(caught).startswith(f"{path / STATE}: Invalid JSON"), str(caught.value)


def test_a_draft_config_claiming_a_huge_draft_is_refused_before_it_is_built(tmp_path):
    """hidden_size 2^20 would be a 12 TiB fc layer (building it fails with a RuntimeError): the draft is sized on
    the meta device and the file's tensors disagree with it."""
    path, _ = _checkpoint(tmp_path)
    state = json.loads((path / STATE).read_text())
    state["draft_config"]["hidden_size"] = 2**20
    (path / STATE).write_text(json.dumps(state))
    with pytest.raises(Eagle3Error) as caught:
        load_draft(path)
    assert _one_line(caught).startswith(f"{path / MODEL}: aux_scale has shape [96], expected [{3 * 2**20}]")


# --- the vocab file ------------------------------------------------------------------------------------------


VOCAB = 1000


def _vocab(root, d2t=None, t2d=None, extra=None):
    chosen = torch.tensor([0, 3, 4, 10, 999])
    t2d_valid = torch.zeros(VOCAB, dtype=torch.bool)
    t2d_valid[chosen] = True
    tensors = {"d2t": chosen - torch.arange(5) if d2t is None else d2t, "t2d": t2d_valid if t2d is None else t2d}
    path = root / "data/vocab/vocab.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({**tensors, **(extra or {})}, str(path))
    return path


def test_a_vocab_file_loads_back_as_saved(tmp_path):
    chosen = torch.tensor([1, 2, 50])
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[chosen] = True
    save_vocab(tmp_path, chosen - torch.arange(3), t2d)
    d2t, loaded = load_vocab(tmp_path, VOCAB)
    assert (torch.arange(3) + d2t).tolist() == [1, 2, 50] and torch.equal(loaded, t2d)


def _marks(*ids):
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[list(ids)] = True
    return t2d


HOSTILE_VOCABS = {
    "d2t in float": ({"d2t": torch.tensor([0.0, 2, 2, 7, 995])}, "d2t is torch.float32, expected torch.int64"),
    "d2t two-dimensional": ({"d2t": torch.zeros(5, 1, dtype=torch.int64)}, "d2t has shape [5, 1], expected"),
    "d2t longer than the vocab": ({"d2t": torch.zeros(VOCAB + 1, dtype=torch.int64)}, "d2t has shape [1001]"),
    "t2d another vocab's": ({"t2d": torch.zeros(50, dtype=torch.bool)}, "t2d has shape [50], expected [1000]"),
    "t2d as int64": ({"t2d": torch.zeros(VOCAB, dtype=torch.int64)}, "t2d is torch.int64, expected torch.bool"),
    "a target id past the vocab": (
        {"d2t": torch.tensor([0, 2, 2, 7, 1000])},
        "d2t maps a draft id to target id 1004, outside the verifier's vocab [0, 1000)",
    ),
    "a negative target id": ({"d2t": torch.tensor([-1, 2, 2, 7, 995])}, "d2t maps a draft id to target id -1"),
    "target ids out of order": (
        {"d2t": torch.tensor([3, -1, 2, 7, 995])},
        "d2t's target ids are not strictly ascending",
    ),
    "t2d missing a target": ({"t2d": _marks(0, 3, 4, 999)}, "t2d does not mark target id 10, which d2t maps to"),
    "t2d marking another id": ({"t2d": _marks(0, 3, 4, 10, 999, 500)}, "t2d marks 6 target ids, d2t maps 5"),
    "an extra tensor": ({"extra": {"x": torch.zeros(1)}}, "not the tensors expected (x unexpected)"),
}


@pytest.mark.parametrize("case", list(HOSTILE_VOCABS))
def test_a_hostile_vocab_file_is_one_line(tmp_path, case):
    changes, message = HOSTILE_VOCABS[case]
    path = _vocab(tmp_path, **changes)
    with pytest.raises(Eagle3Error) as caught:
        load_vocab(tmp_path, VOCAB)
    assert _one_line(caught).startswith(f"{path}: {message}"), str(caught.value)
    assert str(caught.value).endswith("rerun `eagle3 vocab` to rewrite it")


def test_a_truncated_vocab_file_is_one_line(tmp_path):
    path = _vocab(tmp_path)
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(Eagle3Error) as caught:
        load_vocab(tmp_path, VOCAB)
    assert _one_line(caught).startswith(f"{path}: not a readable safetensors file (Error while deserializing header")


# --- extract's per-part records and data/hidden/index.json -------------------------------------------------


def test_a_part_done_record_reads_back_as_written(tmp_path):
    record = PartDone(["shard-00004-000.e3sh", "shard-00004-001.e3sh"], {"skipped_prompt_too_long": 2, "truncated": 1})
    write_done(tmp_path, 4, record)
    assert read_done(tmp_path, 4) == record


@pytest.mark.parametrize(
    "data, message",
    [
        ({"shards": ["../../../etc/passwd"], "counts": {}}, "shards: '../../../etc/passwd' is not this part's next"),
        ({"shards": ["shard-00004-001.e3sh"], "counts": {}}, "shards: 'shard-00004-001.e3sh' is not this part's next"),
        ({"shards": ["shard-00005-000.e3sh"], "counts": {}}, "shards: 'shard-00005-000.e3sh' is not this part's"),
        ({"shards": "shard-00004-000.e3sh", "counts": {}}, "shards: Input should be a valid list"),
        ({"shards": [], "counts": {"truncated": "3"}}, "counts.truncated: Input should be a valid integer (got '3')"),
        ({"shards": [], "counts": {"truncated": -1}}, "counts.truncated: Input should be greater than or equal to 0"),
        ({"shards": [], "counts": {"truncated": True}}, "counts.truncated: Input should be a valid integer"),
        ({"shards": [], "counts": {"rm -rf": 1}}, "counts: 'rm -rf' is not truncated or skipped_<reason>"),
        ({"shards": []}, "counts: Field required"),
        ([], "Input should be a valid dictionary"),
    ],
)
def test_a_hostile_part_done_record_is_one_line(tmp_path, data, message):
    path = tmp_path / "part-00004.done.json"
    path.write_text(json.dumps(data))
    with pytest.raises(Eagle3Error) as caught:
        read_done(tmp_path, 4)
    assert _one_line(caught).startswith(f"{path}: {message}"), str(caught.value)
    assert str(caught.value).endswith("delete it and rerun `eagle3 extract` to redo part 4")


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda i: i["splits"]["train"][0].update(shard="../../secret.e3sh"), "splits.train[0].shard: String should"),
        (lambda i: i["splits"]["train"][0].update(shard="/etc/x.e3sh"), "splits.train[0].shard: String should match"),
        (lambda i: i["splits"]["train"][0].update(samples="2"), "splits.train[0].samples: Input should be a valid"),
        (lambda i: i.update(layer_ids=5), "layer_ids: Input should be a valid list"),
        (lambda i: i.pop("hidden_size"), "hidden_size: Field required"),
        (lambda i: i.update(splits=[]), "splits: Input should be a valid dictionary"),
    ],
)
def test_a_hostile_hidden_index_is_one_line(tmp_path, change, message):
    index = {
        "layer_ids": [2, 15, 27, 30],
        "hidden_size": 64,
        "splits": {
            "train": [{"shard": "shard-00000-000.e3sh", "samples": 2, "tokens": 9, "loss_tokens": 4, "bytes": 900}]
        },
    }
    change(index)
    path = tmp_path / "data/hidden/index.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(index))
    with pytest.raises(Eagle3Error) as caught:
        read_index(tmp_path)
    assert _one_line(caught).startswith(f"{path}: {message}"), str(caught.value)


def test_a_checkpoint_of_another_optimizer_is_one_line(tmp_path):
    """An AdamW checkpoint read into a Muon run (their state differs per matrix) is refused before anything loads."""
    path, _ = _checkpoint(tmp_path)
    draft = Eagle3Draft(CONFIG)
    with pytest.raises(Eagle3Error) as caught:
        load_checkpoint(path, draft, make_optimizer(draft, TrainParams(optimizer="muon")))
    assert "not the tensors expected (" in _one_line(caught) and "::exp_avg unexpected" in _one_line(caught)
