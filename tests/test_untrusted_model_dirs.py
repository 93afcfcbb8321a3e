"""A verifier's directory made hostile (issue 33), as the stages read it: its config (the verifier stage's
`describe_model_dir`, the weights' shapes), its weights and their index (`load_verifier_tensors`, `final_norm`,
`weights_fingerprint`) and its tokenizer and chat template files. Each unreadable or ill-typed file is one
Eagle3Error line naming the file and the field, never another exception. Every file is built (or broken) here."""

import hashlib
import json
import os

import pytest
import torch
from safetensors.torch import save_file
from test_draft import VERIFIER
from test_untrusted_drafts import _edit, _safetensors, _set, _without

from eagle3.errors import Eagle3Error
from eagle3.formats.hf_weights import final_norm, load_verifier_tensors
from eagle3.formats.provenance import describe_model_dir, weights_fingerprint

VERIFIER_TENSORS = {
    "model.embed_tokens.weight": torch.randn(100, 32),
    "lm_head.weight": torch.randn(100, 32),
    "model.norm.weight": torch.ones(32),
    "model.layers.0.mlp.up_proj.weight": torch.zeros(64, 32),
}
INDEX = "model.safetensors.index.json"


def _verifier(directory, sharded=False):
    """A verifier directory: VERIFIER's config, a tokenizer, a chat template and weights, in one file or two
    behind an index."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(VERIFIER))
    (directory / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (directory / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    if not sharded:
        save_file(VERIFIER_TENSORS, str(directory / "model.safetensors"))
        return directory
    names = sorted(VERIFIER_TENSORS)
    files = {name: f"model-0000{1 + position % 2}-of-00002.safetensors" for position, name in enumerate(names)}
    for file in set(files.values()):
        save_file({n: VERIFIER_TENSORS[n] for n in names if files[n] == file}, str(directory / file))
    (directory / INDEX).write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": files}))
    return directory


@pytest.mark.parametrize("sharded", [False, True], ids=["one file", "sharded"])
def test_a_verifier_directory_reads_as_written(tmp_path, sharded):
    directory = _verifier(tmp_path / "verifier", sharded)
    tensors = load_verifier_tensors(directory)
    assert torch.equal(tensors["embed"], VERIFIER_TENSORS["model.embed_tokens.weight"])
    assert torch.equal(tensors["lm_head"], VERIFIER_TENSORS["lm_head.weight"])
    norm, eps = final_norm(directory)
    assert torch.equal(norm, torch.ones(32)) and eps == 1e-5
    described = describe_model_dir(directory, False)
    assert (described["hidden_size"], described["num_key_value_heads"], described["head_dim"]) == (32, 2, 8)
    fingerprint = weights_fingerprint(directory)
    assert ("weight_index_sha256" in fingerprint) == sharded
    # Every weight file by the sha256 of its bytes.
    files = sorted(directory.glob("*.safetensors"))
    assert fingerprint["weight_files"] == {
        f.name: {"bytes": f.stat().st_size, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()} for f in files
    }


def test_nulls_in_a_verifier_config_read_as_the_defaults(tmp_path):
    directory = _verifier(tmp_path / "verifier")
    _edit(directory / "config.json", lambda c: c.update(num_key_value_heads=None, tie_word_embeddings=None))
    described = describe_model_dir(directory, False)
    assert described["num_key_value_heads"] == 4 and described["tie_word_embeddings"] is False


def _index(change):
    def apply(directory):
        index = json.loads((directory / INDEX).read_text())
        change(index)
        (directory / INDEX).write_text(json.dumps(index))

    return apply


def _save(**tensors):
    return lambda directory: save_file({**VERIFIER_TENSORS, **tensors}, str(directory / "model.safetensors"))


def _link_to_nowhere(directory):
    os.symlink(directory / "nowhere", directory / "broken.safetensors")


READERS = {
    "tensors": load_verifier_tensors,
    "norm": final_norm,
    "describe": lambda directory: describe_model_dir(directory, False),
    "fingerprint": weights_fingerprint,
}
FIX = "restore the verifier's weights from its source"

# id: (sharded, how the directory is broken, the readers, the file named, what the line says of it)
HOSTILE_VERIFIERS = {
    "an index naming a file outside": (
        True,
        _index(lambda i: i["weight_map"].update({"model.embed_tokens.weight": "../outside.safetensors"})),
        ("tensors", "fingerprint"),
        INDEX,
        "weight_map.model.embed_tokens.weight: String should match pattern",
    ),
    "an index whose weight_map is a list": (
        True,
        _index(lambda i: i.update(weight_map=["model-00001-of-00002.safetensors"])),
        ("tensors", "norm", "fingerprint"),
        INDEX,
        "weight_map: Input should be a valid dictionary",
    ),
    "an index without a weight_map": (True, _index(lambda i: i.pop("weight_map")), ("tensors",), INDEX, "weight_map"),
    "an index that is not JSON": (
        True,
        lambda d: (d / INDEX).write_bytes(b"{"),
        ("tensors", "fingerprint"),
        INDEX,
        "not JSON (",
    ),
    "an index naming a missing file": (
        True,
        _index(lambda i: i["weight_map"].update({"model.embed_tokens.weight": "model-00009.safetensors"})),
        ("tensors",),
        "model-00009.safetensors",
        "not a readable safetensors file (No such file or directory",
    ),
    "an index naming a file without the tensor": (
        True,
        _index(lambda i: i["weight_map"].update({"model.embed_tokens.weight": i["weight_map"]["lm_head.weight"]})),
        ("tensors",),
        "model-00001-of-00002.safetensors",
        f"no tensor model.embed_tokens.weight, which {INDEX} places in it; {FIX}",
    ),
    "embeddings of another width": (
        False,
        _save(**{"model.embed_tokens.weight": torch.zeros(100, 16)}),
        ("tensors",),
        "model.safetensors",
        f"model.embed_tokens.weight has shape [100, 16], the config makes it [100, 32]; {FIX}",
    ),
    "embeddings of integers": (
        False,
        _save(**{"model.embed_tokens.weight": torch.zeros(100, 32, dtype=torch.int64)}),
        ("tensors",),
        "model.safetensors",
        f"model.embed_tokens.weight has dtype I64, expected a float (BF16, F16, F32, F64); {FIX}",
    ),
    "a final norm of another size": (
        False,
        _save(**{"model.norm.weight": torch.ones(16)}),
        ("norm",),
        "model.safetensors",
        "model.norm.weight has shape [16], the config makes it [32]",
    ),
    "weights truncated": (
        False,
        lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-10]),
        ("tensors", "norm"),
        "model.safetensors",
        "not a readable safetensors file (Error while deserializing header: incomplete metadata",
    ),
    "weights with a header length of 2^62": (
        False,
        lambda d: (d / "model.safetensors").write_bytes(_safetensors({}, length=2**62)),
        ("fingerprint",),
        "model.safetensors",
        f"not a safetensors file (its 10 bytes begin with a header length of {2**62}); {FIX}",
    ),
    "weights empty": (
        False,
        lambda d: (d / "model.safetensors").write_bytes(b""),
        ("fingerprint", "tensors"),
        "model.safetensors",
        "not a",
    ),
    "a dangling weights link": (
        False,
        _link_to_nowhere,
        ("fingerprint",),
        "broken.safetensors",
        "cannot read it (No such file or directory)",
    ),
    "rms_norm_eps a string": (
        False,
        _set("config.json", rms_norm_eps="1e-5"),
        ("norm", "describe"),
        "config.json",
        "rms_norm_eps: Input should be a valid number (got '1e-5')",
    ),
    "no vocab_size": (
        False,
        _without("config.json", "vocab_size"),
        ("tensors",),
        "config.json",
        "missing `vocab_size`; the verifier's embeddings are sized by it",
    ),
    "a config without layers": (
        False,
        lambda d: (d / "config.json").write_text('{"hidden_size": 32}'),
        ("describe",),
        "config.json",
        "missing `num_hidden_layers`; cannot size the draft model without it",
    ),
    "no attention heads": (
        False,
        _set("config.json", num_attention_heads=0),
        ("describe",),
        "config.json",
        "num_attention_heads: Input should be greater than or equal to 1 (got 0)",
    ),
    "a text_config that is a string": (
        False,
        _set("config.json", text_config="llama"),
        ("describe", "tensors", "norm"),
        "config.json",
        "text_config: Input should be a valid dictionary (got 'llama')",
    ),
    "a config that is not UTF-8": (
        False,
        lambda d: (d / "config.json").write_bytes(b"\xfe{}"),
        ("describe", "tensors", "norm"),
        "config.json",
        "not UTF-8 text (",
    ),
    "a chat template that is not UTF-8": (
        False,
        lambda d: (d / "chat_template.jinja").write_bytes(b"{{ \xff }}"),
        ("describe",),
        "chat_template.jinja",
        "not UTF-8 text (",
    ),
    "a tokenizer config that is not JSON": (
        False,
        lambda d: ((d / "chat_template.jinja").unlink(), (d / "tokenizer_config.json").write_text("{")),
        ("describe",),
        "tokenizer_config.json",
        "not JSON (",
    ),
    "a chat template that is a number": (
        False,
        lambda d: (
            (d / "chat_template.jinja").unlink(),
            (d / "tokenizer_config.json").write_text('{"chat_template": 5}'),
        ),
        ("describe",),
        "tokenizer_config.json",
        "chat_template is a JSON int, not a string",
    ),
}


@pytest.mark.parametrize(
    "case, reader", [(case, reader) for case, (_, _, readers, _, _) in HOSTILE_VERIFIERS.items() for reader in readers]
)
def test_a_hostile_verifier_directory_is_one_line_naming_the_file(tmp_path, case, reader):
    sharded, change, _, relative, message = HOSTILE_VERIFIERS[case]
    directory = _verifier(tmp_path / "verifier", sharded)
    change(directory)
    with pytest.raises(Eagle3Error) as caught:
        READERS[reader](directory)
    assert type(caught.value) is Eagle3Error and "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"{directory / relative}: {message}"), str(caught.value)
