"""Hostile inputs from a remote through the real CLI (issue 33): one error line, exit code 2, no traceback, and
no file changed. The projects are built by hand (a provenance, a verifier config and tokenizer, synthetic parts,
shards written with ShardWriter, a vocab file): no model runs."""

import hashlib
import json

import pytest
import torch
import yaml
from test_untrusted_formats import _record as _synthetic_record
from test_untrusted_shards import GIB, _craft, _parts, _write, _zeros_frame

from eagle3.formats.shards import write_index
from eagle3.formats.synthetic import write_manifest, write_part
from eagle3.formats.vocab import save_vocab

from conftest import eagle3, make_project, smoke_params, write_params
from fake_provenance import write_fake_provenance

VOCAB = 49152
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 30,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": VOCAB,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
}


def _project(root):
    """A project as extract leaves it for vocab (and vocab for train): the verifier's provenance and config, one
    training shard of tests/test_untrusted_shards.py's samples (layers 2, 15, 27 and the final 30) and its index,
    and a vocab file."""
    params = smoke_params()
    params["verifier"]["source"] = {"kind": "local", "path": "models/verifier", "name": "org/model", "license": "mit"}
    make_project(root, params)
    verifier = root / "models/verifier"
    verifier.mkdir(parents=True)
    (verifier / "config.json").write_text(json.dumps(CONFIG))
    write_fake_provenance(
        root,
        name="org/model",
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        tokenizer_sha256="ab" * 32,
    )
    (root / "data/hidden/train").mkdir(parents=True)
    shard = _write(root / "data/hidden/train/shard-00000-000.e3sh")
    write_index(root / "data/hidden", _read_meta(shard), {"train": [shard]})
    chosen = torch.arange(2048) * 3
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[chosen] = True
    save_vocab(root, chosen - torch.arange(2048), t2d)
    return root, shard


def _read_meta(path):
    from eagle3.formats.shards import ShardReader

    reader = ShardReader(path)
    reader.close()
    return reader.meta


def _files(root) -> dict[str, str]:
    """Every file of the project but Python's bytecode caches, by content."""
    return {
        path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def _refused(root, stage: str, message: str) -> None:
    """The stage exits 2 with `message` in its one error line, the last of stderr (a progress bar drawn before
    it may end above), and leaves every file as it was."""
    before = _files(root)
    result = eagle3(root, stage, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert [line for line in lines if "error" in line.lower()] == [lines[-1]], result.stderr
    assert lines[-1].startswith(f"eagle3 {stage}: error: ") and message in lines[-1], lines[-1]
    assert _files(root) == before


def _header(**fields):
    def make(shard):
        _craft(shard, header={**json.loads(_parts(shard)[0]), **fields})
        return "shard header: layer_ids: Input should be a valid list (got 5)"

    return make


def _offset_outside(shard):
    _craft(shard, entry_changes={1: {"offset": 10**12}})
    return f"shard index: sample 1 (s1): offset {10**12}, expected"


SHARD_CASES = {
    "layer_ids is 5": _header(layer_ids=5),
    "an index entry pointing outside the file": _offset_outside,
}


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _with_synthetic(root):
    """What vocab reads: generate's answers (one part of two records and its manifest) and the verifier's
    tokenizer, a small byte-level BPE with a ChatML template made here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(["Why is the sky blue?", "Rayleigh scattering of sunlight."], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(root / "models/verifier")
    records = [_synthetic_record(0), _synthetic_record(1)]
    write_part(root / "data/synthetic/train/part-00000.jsonl.zst", records)
    write_manifest(root / "data/synthetic", ["train"])
    return root / "data/synthetic/train/part-00000.jsonl.zst"


def _manifest_outside(part):
    manifest = part.parents[1] / "manifest.json"
    entries = json.loads(manifest.read_text())
    entries["train"][0]["part"] = "../../../params.yaml"
    manifest.write_text(json.dumps(entries))
    return f"{manifest}: train[0].part: String should match pattern"


def _damaged(part):
    part.write_bytes(part.read_bytes()[:-9])
    return f"{part}: damaged part ("


def _bomb(part):
    part.write_bytes(_zeros_frame(GIB))
    return f"{part}: the part declares {GIB} bytes decompressed"


def _wrong_record(part):
    write_part(part, [_synthetic_record(0), _synthetic_record(1, status="done")])
    return f"{part}: record 1: status: Input should be 'ok' or 'skipped'"


def _tokenizer_of_another_model(part):
    root = part.parents[3]
    provenance = root / "models/verifier/provenance.json"
    provenance.write_text(provenance.read_text().replace(f'"vocab_size": {VOCAB}', '"vocab_size": 100'))
    params = yaml.safe_load((root / "params.yaml").read_text())
    write_params(root, {**params, "vocab": {"draft_vocab_size": 64}})
    return "has a token id >= the verifier's vocab size 100; the tokenizer does not match the verifier"


SYNTHETIC_CASES = {
    "a manifest naming a file outside the data": _manifest_outside,
    "a damaged part": _damaged,
    "a decompression bomb": _bomb,
    "a record of the wrong shape": _wrong_record,
    "a tokenizer of another model": _tokenizer_of_another_model,
}


@pytest.mark.parametrize("case", list(SYNTHETIC_CASES))
def test_vocab_on_hostile_synthetic_data_is_one_line_and_changes_nothing(tmp_path, case):
    root, _ = _project(tmp_path / "project")
    message = SYNTHETIC_CASES[case](_with_synthetic(root))
    _refused(root, "vocab", message)


def test_vocab_on_a_valid_hand_made_project_runs(tmp_path):
    """The control: the same project with its data left valid builds the vocab."""
    root, _ = _project(tmp_path / "project")
    _with_synthetic(root)
    eagle3(root, "vocab")
    assert json.loads((root / "metrics/vocab.json").read_text())["loss_tokens"] > 0


@pytest.mark.parametrize("case", list(SHARD_CASES))
def test_train_on_a_hostile_shard_is_one_line_and_changes_nothing(tmp_path, case):
    """What training checks as it opens the shards (a damaged record's own line reaches training from a
    DataLoader worker: tests/test_untrusted_shards.py)."""
    root, shard = _project(tmp_path / "project")
    message = SHARD_CASES[case](shard)
    _refused(root, "train", f"{shard}: {message}")


def test_train_on_a_hostile_vocab_file_is_one_line_and_changes_nothing(tmp_path):
    root, _ = _project(tmp_path / "project")
    vocab = root / "data/vocab/vocab.safetensors"
    vocab.write_bytes(vocab.read_bytes()[:100])
    _refused(root, "train", f"{vocab}: not a readable safetensors file (")
