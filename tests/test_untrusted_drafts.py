"""Hostile drafts (issue 33): an exported draft and its verifier's config as validate-draft and the draft's loader
(evaluate's) meet them; the verifier directory's other readers are tests/test_untrusted_model_dirs.py. Each
unreadable or ill-typed file is one Eagle3Error line naming the file and the field, never another exception;
through `eagle3 validate-draft` it is exit code 2, one stderr line, no traceback and no file changed. Every file
is built (or broken) here."""

import hashlib
import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_draft import VERIFIER, export_beside_verifier, tiny_draft

from eagle3.errors import Eagle3Error
from eagle3.formats import hf_config
from eagle3.formats.exported_draft import check_draft, load_exported_draft

from conftest import eagle3

REEXPORT = "re-export the draft (`eagle3 export`) or fetch it again"
VERIFIER_HINT = "--verifier must be the verifier's Hugging Face model directory"


@pytest.fixture
def pair(tmp_path):
    """A valid draft (vLLM format in draft/, speculators format in speculators/) beside its verifier."""
    export_beside_verifier(tmp_path, tiny_draft(), "bfloat16")
    return tmp_path


def _edit(file, change):
    config = json.loads(file.read_text())
    change(config)
    file.write_text(json.dumps(config))


def _set(relative, **values):
    return lambda root: _edit(root / relative, lambda config: config.update(values))


def _bytes(relative, data):
    return lambda root: (root / relative).write_bytes(data)


def _truncate(relative, keep):
    return lambda root: (root / relative).write_bytes((root / relative).read_bytes()[:keep])


def _safetensors(header: dict, data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file as its spec lays it out: u64 header length, the JSON header, the data."""
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded) if length is None else length) + encoded + data


def _directory(relative):
    def change(root):
        (root / relative).unlink()
        (root / relative).mkdir()

    return change


# id: (how the pair is broken, the file named, what the line says of it)
HOSTILE = {
    # the draft's config.json
    "config a list": (_bytes("draft/config.json", b"[1, 2]"), "draft/config.json", "a JSON list, not an object"),
    "config not UTF-8": (
        _bytes("draft/config.json", b'{"hidden_size": "\xff"}'),
        "draft/config.json",
        "not UTF-8 text ('utf-8' codec can't decode byte 0xff in position 17: invalid start byte)",
    ),
    "config not JSON": (
        _bytes("draft/config.json", b"{not json"),
        "draft/config.json",
        "not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
    ),
    "config empty": (
        _bytes("draft/config.json", b""),
        "draft/config.json",
        "not JSON (Expecting value: line 1 column 1 (char 0))",
    ),
    "config nested too deep": (
        _bytes("draft/config.json", b"[" * 100_000),
        "draft/config.json",
        "not JSON (maximum recursion depth exceeded",
    ),
    "config a directory": (_directory("draft/config.json"), "draft/config.json", "cannot read it (Is a directory)"),
    "config missing": (
        lambda root: (root / "draft/config.json").unlink(),
        "draft/config.json",
        "not found; a draft directory holds config.json and model.safetensors",
    ),
    "aux layer ids 5": (
        _set("draft/config.json", eagle_config={"eagle_aux_hidden_state_layer_ids": 5}),
        "draft/config.json",
        "eagle_config.eagle_aux_hidden_state_layer_ids: Input should be a valid list (got 5)",
    ),
    "aux layer ids as strings": (
        _set("draft/config.json", eagle_config={"eagle_aux_hidden_state_layer_ids": ["2", "6", "9"]}),
        "draft/config.json",
        "eagle_config.eagle_aux_hidden_state_layer_ids[0]: Input should be a valid integer (got '2')",
    ),
    "eagle_config a list": (
        _set("draft/config.json", eagle_config=[2, 6, 9]),
        "draft/config.json",
        "eagle_config: Input should be a valid dictionary (got [2, 6, 9])",
    ),
    "max_position_embeddings a string": (
        _set("draft/config.json", max_position_embeddings="8192"),
        "draft/config.json",
        "max_position_embeddings: Input should be a valid integer (got '8192')",
    ),
    "hidden_size true": (
        _set("draft/config.json", hidden_size=True),
        "draft/config.json",
        "hidden_size: Input should be a valid integer (got True)",
    ),
    "no attention heads": (
        _set("draft/config.json", num_attention_heads=0),
        "draft/config.json",
        "num_attention_heads: Input should be greater than or equal to 1 (got 0)",
    ),
    "an absurd vocab": (
        _set("draft/config.json", vocab_size=2**40),
        "draft/config.json",
        "vocab_size: Input should be less than 2147483648 (got 1099511627776)",
    ),
    "rms_norm_eps NaN": (
        _set("draft/config.json", rms_norm_eps=float("nan")),
        "draft/config.json",
        "rms_norm_eps: Input should be a finite number (got nan)",
    ),
    "tie_word_embeddings a string": (
        _set("draft/config.json", tie_word_embeddings="false"),
        "draft/config.json",
        "tie_word_embeddings: Input should be a valid boolean (got 'false')",
    ),
    "rope_parameters a string": (
        _set("draft/config.json", rope_parameters="yarn"),
        "draft/config.json",
        "rope_parameters: Input should be a valid dictionary (got 'yarn')",
    ),
    "architectures a string": (
        _set("draft/config.json", architectures="LlamaForCausalLMEagle3"),
        "draft/config.json",
        "architectures: Input should be a valid list (got 'LlamaForCausalLMEagle3')",
    ),
    # the speculators format's config.json
    "speculators aux layer ids 5": (
        _set("speculators/config.json", eagle_aux_hidden_state_layer_ids=5),
        "speculators/config.json",
        "eagle_aux_hidden_state_layer_ids: Input should be a valid list (got 5)",
    ),
    "speculators_model_type a number": (
        _set("speculators/config.json", speculators_model_type=3),
        "speculators/config.json",
        "speculators_model_type: Input should be a valid string (got 3)",
    ),
    "transformer_layer_config a list": (
        _set("speculators/config.json", transformer_layer_config=[]),
        "speculators/config.json",
        "transformer_layer_config: Input should be a valid dictionary (got [])",
    ),
    "the layer's max_position_embeddings a string": (
        lambda root: _edit(
            root / "speculators/config.json",
            lambda config: config["transformer_layer_config"].update(max_position_embeddings="8192"),
        ),
        "speculators/config.json",
        "transformer_layer_config.max_position_embeddings: Input should be a valid integer (got '8192')",
    ),
    "speculative_tokens a string": (
        lambda root: _edit(
            root / "speculators/config.json",
            lambda config: config["speculators_config"]["proposal_methods"][0].update(speculative_tokens="3"),
        ),
        "speculators/config.json",
        "speculators_config.proposal_methods[0].speculative_tokens: Input should be a valid integer (got '3')",
    ),
    # the draft's model.safetensors
    "weights truncated": (
        _truncate("draft/model.safetensors", -100),
        "draft/model.safetensors",
        "not a readable safetensors file (Error while deserializing header: incomplete metadata, file not fully "
        f"covered); {REEXPORT}",
    ),
    "weights random bytes": (
        _bytes("draft/model.safetensors", bytes(range(256)) * 16),
        "draft/model.safetensors",
        f"not a readable safetensors file (Error while deserializing header: header too large); {REEXPORT}",
    ),
    "weights empty": (
        _bytes("draft/model.safetensors", b""),
        "draft/model.safetensors",
        f"not a readable safetensors file (Error while deserializing header: header too small); {REEXPORT}",
    ),
    "weights header length 2^62": (
        _bytes("draft/model.safetensors", _safetensors({}, length=2**62)),
        "draft/model.safetensors",
        f"not a readable safetensors file (Error while deserializing header: header too large); {REEXPORT}",
    ),
    "weights header claiming a 2^80-value tensor": (
        _bytes(
            "draft/model.safetensors",
            _safetensors({"t2d": {"dtype": "BOOL", "shape": [2**40, 2**40], "data_offsets": [0, 8]}}, b"\0" * 8),
        ),
        "draft/model.safetensors",
        "not a readable safetensors file (Error while deserializing header: overflow computing buffer size from "
        f"shape and/or element type); {REEXPORT}",
    ),
    "weights header claiming more data than the file has": (
        _bytes(
            "draft/model.safetensors",
            _safetensors({"t2d": {"dtype": "BOOL", "shape": [100], "data_offsets": [0, 100]}}, b"\1" * 10),
        ),
        "draft/model.safetensors",
        "not a readable safetensors file (Error while deserializing header: ",
    ),
    # the verifier's config.json
    "verifier config {}": (
        _bytes("verifier/config.json", b"{}"),
        "verifier/config.json",
        f"missing `hidden_size`; {VERIFIER_HINT}",
    ),
    "verifier config a list": (
        _bytes("verifier/config.json", b"[]"),
        "verifier/config.json",
        "a JSON list, not an object",
    ),
    "verifier config not UTF-8": (
        _bytes("verifier/config.json", json.dumps(VERIFIER).encode("utf-16")),
        "verifier/config.json",
        "not UTF-8 text ('utf-8' codec can't decode byte 0xff in position 0: invalid start byte)",
    ),
    "verifier config missing": (
        lambda root: (root / "verifier/config.json").unlink(),
        "verifier/config.json",
        f"not found; {VERIFIER_HINT}",
    ),
    "verifier max_position_embeddings a string": (
        _set("verifier/config.json", max_position_embeddings="8192"),
        "verifier/config.json",
        "max_position_embeddings: Input should be a valid integer (got '8192')",
    ),
    "verifier rope_theta infinite": (
        _set("verifier/config.json", rope_theta=float("inf")),
        "verifier/config.json",
        "rope_theta: Input should be a finite number (got inf)",
    ),
    "verifier text_config a list": (
        _bytes("verifier/config.json", json.dumps({"architectures": ["X"], "text_config": [1]}).encode()),
        "verifier/config.json",
        "text_config: Input should be a valid dictionary (got [1])",
    ),
    "verifier text_config.hidden_size a string": (
        _bytes("verifier/config.json", json.dumps({"text_config": {**VERIFIER, "hidden_size": "32"}}).encode()),
        "verifier/config.json",
        "text_config.hidden_size: Input should be a valid integer (got '32')",
    ),
    "verifier text_config without layers": (
        _bytes(
            "verifier/config.json",
            json.dumps({"text_config": {k: v for k, v in VERIFIER.items() if k != "num_hidden_layers"}}).encode(),
        ),
        "verifier/config.json",
        f"missing `text_config.num_hidden_layers`; {VERIFIER_HINT}",
    ),
}


def _draft_of(relative: str) -> str:
    """The draft directory a case checks: the speculators one for its files, else draft/."""
    return "speculators" if relative.startswith("speculators/") else "draft"


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_draft_or_verifier_file_is_one_line_naming_it(pair, case):
    change, relative, message = HOSTILE[case]
    change(pair)
    with pytest.raises(Eagle3Error) as caught:
        check_draft(pair / _draft_of(relative), pair / "verifier")
    assert type(caught.value) is Eagle3Error and "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"{pair / relative}: {message}"), str(caught.value)


def _files(root) -> dict[str, str]:
    return {
        path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


CLI_CASES = [
    "config a list",
    "config not UTF-8",
    "aux layer ids 5",
    "max_position_embeddings a string",
    "speculators aux layer ids 5",
    "weights truncated",
    "weights random bytes",
    "weights empty",
    "weights header length 2^62",
    "verifier config {}",
    "verifier text_config a list",
]


@pytest.mark.parametrize("case", CLI_CASES)
def test_validate_draft_refuses_a_hostile_file_in_one_line_and_changes_nothing(pair, case):
    change, relative, message = HOSTILE[case]
    change(pair)
    before = _files(pair)
    result = eagle3(pair, "validate-draft", _draft_of(relative), "--verifier", "verifier", check=False)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"eagle3 validate-draft: error: {relative}: {message}"), result.stderr
    assert _files(pair) == before


def test_a_json_file_too_large_for_a_config_is_refused_unread(pair, monkeypatch):
    monkeypatch.setattr(hf_config, "MAX_JSON_BYTES", 100)
    with pytest.raises(Eagle3Error) as caught:
        check_draft(pair / "draft", pair / "verifier")
    assert str(caught.value) == f"{pair / 'draft/config.json'}: over 100 bytes, too large for a model's JSON file"


def _tensors(relative, **changes):
    def change(root):
        tensors = load_file(root / relative)
        tensors.update(changes)
        save_file(tensors, root / relative)

    return change


def _not_a_bool(root):
    t2d = load_file(root / "draft/model.safetensors")["t2d"].view(torch.uint8).clone()
    t2d[t2d == 1] = 2
    _tensors("draft/model.safetensors", t2d=t2d.view(torch.bool))(root)


@pytest.mark.parametrize(
    "change, problem",
    [
        (_not_a_bool, "t2d holds bytes other than 0 (false) and 1 (true)"),
        (
            _tensors("draft/model.safetensors", d2t=torch.full((40,), 2**63 - 1, dtype=torch.int64)),
            "d2t maps draft ids outside the verifier vocab [0, 100)",
        ),
    ],
    ids=["t2d of bytes that are no bool", "d2t offsets that overflow"],
)
def test_a_vocab_map_of_valid_shape_but_hostile_values_is_a_named_problem(pair, change, problem):
    change(pair)
    assert check_draft(pair / "draft", pair / "verifier") == [problem]


def test_a_multimodal_verifier_is_read_through_its_text_config(pair):
    (pair / "verifier/config.json").write_text(json.dumps({"architectures": ["X"], "text_config": VERIFIER}))
    assert check_draft(pair / "draft", pair / "verifier") == []
    assert check_draft(pair / "speculators", pair / "verifier") == []


# --- the exported draft as evaluate loads it -------------------------------------------------------------------


EXPORT_FIX = "rerun `eagle3 export` to rewrite it"


def _without(relative, key):
    return lambda root: _edit(root / relative, lambda config: config.pop(key))


HOSTILE_EXPORTS = {
    "config a list": (_bytes("draft/config.json", b"[]"), "draft/config.json", "a JSON list, not an object"),
    "no rms_norm_eps": (_without("draft/config.json", "rms_norm_eps"), "draft/config.json", "rms_norm_eps: Field"),
    "no aux layer ids": (
        _set("draft/config.json", eagle_config={}),
        "draft/config.json",
        "eagle_config.eagle_aux_hidden_state_layer_ids: Field required",
    ),
    "aux layer ids 5": (
        _set("draft/config.json", eagle_config={"eagle_aux_hidden_state_layer_ids": 5}),
        "draft/config.json",
        "eagle_config.eagle_aux_hidden_state_layer_ids: Input should be a valid list (got 5)",
    ),
    "an integer torch_dtype": (
        _set("draft/config.json", torch_dtype="int8"),
        "draft/config.json",
        "torch_dtype: Input should be 'bfloat16', 'float16' or 'float32' (got 'int8')",
    ),
    "an unknown activation": (
        _set("draft/config.json", hidden_act="nope"),
        "draft/config.json",
        "does not describe a draft (",
    ),
    "KV heads that do not divide the heads": (
        _set("draft/config.json", num_key_value_heads=3),
        "draft/config.json",
        "num_key_value_heads 3 does not divide num_attention_heads 4",
    ),
    # 2^20 x 3 * 2^20 bf16 values: 6 TiB for fc alone, refused from the file's header before anything is built.
    "a config claiming a huge draft": (
        _set("draft/config.json", hidden_size=2**20),
        "draft/model.safetensors",
        "fc.weight has shape [32, 96], expected [1048576, 3145728]",
    ),
    "tensors of another dtype than the config's": (
        _set("draft/config.json", torch_dtype="float32"),
        "draft/model.safetensors",
        "fc.weight is torch.bfloat16, expected torch.float32",
    ),
    "weights truncated": (
        _truncate("draft/model.safetensors", -100),
        "draft/model.safetensors",
        "not a readable safetensors file (Error while deserializing header: incomplete metadata",
    ),
    "an extra tensor": (
        _tensors("draft/model.safetensors", extra=torch.zeros(1)),
        "draft/model.safetensors",
        "not the tensors expected (extra unexpected)",
    ),
    "d2t outside the vocab": (
        _tensors("draft/model.safetensors", d2t=torch.full((40,), 100, dtype=torch.int64)),
        "draft/model.safetensors",
        "d2t maps draft ids outside the verifier vocab [0, 100)",
    ),
}


def test_an_exported_draft_loads_back_as_exported(pair):
    draft, d2t = load_exported_draft(pair / "draft")
    assert (torch.arange(40) + d2t).tolist() == list(range(0, 80, 2))
    assert draft.fc.weight.shape == (32, 96) and draft.fc.weight.dtype == torch.float32


@pytest.mark.parametrize("case", list(HOSTILE_EXPORTS))
def test_a_hostile_exported_draft_is_one_line_before_it_is_built(pair, case):
    change, relative, message = HOSTILE_EXPORTS[case]
    change(pair)
    with pytest.raises(Eagle3Error) as caught:
        load_exported_draft(pair / "draft")
    assert type(caught.value) is Eagle3Error and "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"{pair / relative}: {message}"), str(caught.value)
    assert str(caught.value).endswith(EXPORT_FIX)
