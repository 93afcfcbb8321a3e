"""`eagle3 init --verifier`: a complete params file sized from a model's own files, on tiny random models of two
families built from the configs in tests/verifiers/ (a dense Qwen3, a Qwen3-MoE), checked by `eagle3 check`."""

import json
import os
import re
import shlex
from pathlib import Path

import pytest
import yaml
from single_machine import VERIFIERS, build

from eagle3.errors import Eagle3Error
from eagle3.init.from_verifier import params_for
from eagle3.init.verifier_files import read_verifier
from eagle3.params.params_file import load_params

from conftest import REPO, eagle3


def tiny_model(root: Path, family: str, license_id: str | None = "apache-2.0") -> Path:
    return build(family, root / family, license_id=license_id)


@pytest.mark.parametrize("family", ["qwen3-tiny", "qwen3-moe-tiny"])
def test_init_writes_a_file_check_accepts_sized_from_the_model(tmp_path, family):
    model = tiny_model(tmp_path, family)
    project = tmp_path / "project"
    project.mkdir()
    written = eagle3(
        project, "init", "--verifier", str(model), "--layout", "single", "--gpu", "h100", "--name", f"org/{family}",
        "--thinking", "off",
    )  # fmt: skip
    assert written.stdout.strip().startswith(f"params.yaml: sized for org/{family}, layout single, on NVIDIA H100")
    text = (project / "params.yaml").read_text()
    params = yaml.safe_load(text)
    layers = json.loads((VERIFIERS / f"{family}.json").read_text())["num_hidden_layers"]
    context = json.loads((VERIFIERS / f"{family}.json").read_text())["max_position_embeddings"]
    assert params["verifier"]["source"] == {
        "kind": "local", "path": str(model.resolve()), "name": f"org/{family}", "license": "apache-2.0",
    }  # fmt: skip
    assert params["generate"]["chat_template_kwargs"] == {"enable_thinking": False}
    # generation_config.json's sampling; answers of 4,096 tokens with thinking off, within the context.
    assert params["generate"]["sampling"] == {"temperature": 0.6, "top_p": 0.95, "max_tokens": 4096, "seed": 0}
    assert params["extract"]["max_seq_len"] == 4096 + 4096
    assert f"vLLM's default for {layers} layers: 2, {layers // 2}, {layers - 3}" in text
    assert params["vocab"]["draft_vocab_size"] == 32000  # of its 49,152
    assert params["train"]["launch"] == {"processes_per_node": 1, "gpu": "h100"}
    assert load_params(project / "params.yaml").train.activation_checkpointing == "off"  # a tiny draft fits
    assert params["evaluate"]["vllm"]["dtype"] == "auto" and params["evaluate"]["backend"] == "engines"
    assert (params["evaluate"]["long_context"] is not None) == (context >= 32768 + 4096)
    assert "# thinking off (eagle3 init --thinking); evaluate asks with the same" in text
    checked = eagle3(project, "check")
    weights = sum(path.stat().st_size for path in model.glob("*.safetensors")) / 1e9
    assert f"evaluate's engines: the verifier's {weights:.1f} GB per GPU within 72 GB" in checked.stderr
    assert "license gate: " in checked.stderr


def test_what_the_files_do_not_say_is_refused_with_the_flag_that_says_it(tmp_path):
    model = tiny_model(tmp_path, "qwen3-tiny", license_id=None)
    with pytest.raises(Eagle3Error, match=r"^--name: the verifier's Hub id"):
        read_verifier(model, None, None)
    with pytest.raises(Eagle3Error, match=r"^--license: .*README.md states no license"):
        read_verifier(model, "org/m", None)
    verifier = read_verifier(model, "org/m", "llama3.1")
    with pytest.raises(Eagle3Error, match=r"^--thinking on\|off: org/m's chat template switches thinking"):
        params_for(verifier, "h100", 1, None, False, "agreed")
    with pytest.raises(Eagle3Error, match=r"^--license-override REASON: org/m is llama3.1 \(conditional"):
        params_for(verifier, "h100", 1, True, False, None)
    thinking = yaml.safe_load(params_for(verifier, "h100", 1, True, False, "Meta's terms are met"))
    # Thinking on: long reasoning answers, bounded by the context less the prompt's room.
    assert thinking["generate"]["sampling"]["max_tokens"] == 16384
    assert thinking["report"]["license_overrides"] == [{"license": "llama3.1", "reason": "Meta's terms are met"}]
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "m.M"}}))
    with pytest.raises(Eagle3Error, match=r"^--trust-remote-code: org/m's config.json runs code of its own"):
        params_for(read_verifier(model, "org/m", "mit"), "h100", 1, True, False, None)
    (model / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}))
    with pytest.raises(Eagle3Error, match=r"^--verifier: BertModel .* not among vLLM's verifiers"):
        read_verifier(model, "org/m", "mit")


def test_tensor_parallel_takes_the_fewest_gpus_whose_share_holds_the_weights(tmp_path):
    """100 GB of weights (a sparse file: its size, not its bytes): 4 of 8 H100s hold them with room for the KV
    cache (0.6 of 0.9 x 80 GB each), 2 of 2 do not."""
    model = tiny_model(tmp_path, "qwen3-tiny")
    with (model / "model-big.safetensors").open("wb") as handle:
        os.truncate(handle.fileno(), 100 * 10**9)
    verifier = read_verifier(model, "org/m", None)
    params = yaml.safe_load(params_for(verifier, "h100", 8, False, False, None))
    assert params["generate"]["vllm"]["tensor_parallel_size"] == 4
    assert params["train"]["launch"]["processes_per_node"] == 8
    assert params["train"]["max_tokens_per_batch"] == 8 * (4096 + 4096)
    with pytest.raises(Eagle3Error, match=r"^--gpus: org/m's 100 GB of weights need more than 2 NVIDIA H100"):
        params_for(verifier, "h100", 2, False, False, None)


def test_the_readmes_commands_for_another_verifier_run_as_written(tmp_path):
    """README.md's block, each line run as written but for the model's path (a tiny Qwen3 here)."""
    readme = (REPO / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```bash\n(.*?)```", readme, flags=re.S) if "eagle3 init --verifier" in b]
    model = tiny_model(tmp_path, "qwen3-tiny")
    project = tmp_path / "project"
    project.mkdir()
    lines = [line for line in block.splitlines() if line.strip()]
    assert [line.split()[:2] for line in lines] == [["eagle3", "init"], ["eagle3", "check"]]
    for line in lines:
        words = shlex.split(line.replace("/models/MyModel", str(model)), comments=True)
        eagle3(project, *words[1:])
    params = yaml.safe_load((project / "params.yaml").read_text())
    assert params["verifier"]["source"]["name"] == "org/MyModel" and params["train"]["launch"]["gpu"] == "h100"
    assert params["train"]["launch"]["processes_per_node"] == 8
