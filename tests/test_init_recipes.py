"""The shipped one-machine recipes (eagle3/init/recipes.py): each is what `eagle3 init --verifier` writes from the
model's own files kept beside it at a pinned Hub revision, validates as params, and is what `eagle3 init NAME
--layout single` writes; another GPU kind or count sizes it again from the same files."""

import json
import re

import pytest
import yaml

from eagle3.init.files import CONFIGS_DIR, recipe, recipes, shipped
from eagle3.init.recipes import render_recipe, stale
from eagle3.init.verifier_files import _thinking_switch, template_switch
from eagle3.params.params_file import load_params

from conftest import eagle3


def test_every_recipe_is_what_init_verifier_writes_from_its_own_files():
    assert "gpt-oss-20b" in recipes() and "gpt-oss-20b" not in shipped()
    assert stale() == []


@pytest.mark.parametrize("name", recipes())
def test_each_recipe_validates_and_names_the_revision_its_files_are_from(name, tmp_path):
    chosen = recipe(name)
    assert re.fullmatch(r"[0-9a-f]{40}", chosen.revision)
    text = (CONFIGS_DIR / f"{name}.yaml").read_text()
    assert f"hf download {chosen.hub_id} --revision {chosen.revision} --local-dir {chosen.weights_path}" in text
    path = tmp_path / "params.yaml"
    path.write_text(text)
    params = load_params(path)
    assert params.warnings() == []
    assert (params.verifier.source.name, params.verifier.source.path) == (chosen.hub_id, chosen.weights_path)
    layers = json.loads((chosen.files / "config.json").read_text())["num_hidden_layers"]
    assert f"vLLM's default for {layers} layers: 2, {layers // 2}, {layers - 3}" in text
    assert params.train.launch.gpu == chosen.gpu and params.train.launch.processes_per_node == chosen.gpus


def test_gpt_oss_20b_is_sized_from_what_its_files_say():
    text = (CONFIGS_DIR / "gpt-oss-20b.yaml").read_text()
    params = yaml.safe_load(text)
    assert params["verifier"]["source"]["license"] == "apache-2.0"  # its model card's front matter
    # Its template names a message's `thinking` field and switches nothing: no --thinking, no template kwargs.
    assert _thinking_switch(recipe("gpt-oss-20b").files) is None
    assert params["generate"]["chat_template_kwargs"] == {}
    # No *.safetensors here: the index's 13.76 GB of tensors, which one H100 holds.
    assert params["generate"]["vllm"]["tensor_parallel_size"] == 1 and "# 14 GB of weights" in text
    # An MXFP4 checkpoint's config.json names no dtype.
    assert params["verifier"]["dtype"] == "bfloat16" and "its config.json names none" in text
    assert params["vocab"]["draft_vocab_size"] == 32000 and params["train"]["optimizer"] == "muon"


def test_the_thinking_switch_is_a_template_variable_not_a_word():
    cases = {
        "{%- if enable_thinking is defined and enable_thinking is false %}": "enable_thinking",  # Qwen3
        "{%- if thinking is defined and not thinking -%}<think></think>": "thinking",  # Kimi-K2.5
        "{% if not thinking %}": "thinking",
        "{{ message.thinking }} in the 'thinking' field": None,  # gpt-oss
    }
    for template, switch in cases.items():
        assert template_switch(template) == switch, template


def test_init_writes_a_recipe_check_sizes_it_and_other_gpus_size_it_again(tmp_path):
    written = eagle3(tmp_path, "init", "gpt-oss-20b", "--layout", "single")
    assert written.stdout.startswith("params.yaml: the gpt-oss-20b recipe, layout single")
    assert (tmp_path / "params.yaml").read_text() == (CONFIGS_DIR / "gpt-oss-20b.yaml").read_text()
    checked = eagle3(tmp_path, "check")
    # Before the weights are here, check sizes the GPUs from the recipe's own files.
    assert "training memory: " in checked.stderr and "(the gpt-oss-20b recipe)" in checked.stderr
    assert "evaluate's engines: the verifier's 13.8 GB per GPU within 72 GB" in checked.stderr
    eagle3(
        tmp_path, "init", "gpt-oss-20b", "--layout", "single", "--gpu", "h200", "--gpus", "2", "--force",
        "--draft-repo", "me/gpt-oss-20b-eagle3",
    )  # fmt: skip
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    assert params["train"]["launch"] == {"processes_per_node": 2, "gpu": "h200"}
    assert params["train"]["max_tokens_per_batch"] == 2 * params["extract"]["max_seq_len"]
    assert params["report"]["draft_repo"] == "me/gpt-oss-20b-eagle3"
    assert yaml.safe_load(render_recipe("gpt-oss-20b", "h200", 2)) == {
        **params,
        "report": {**params["report"], "draft_repo": None},
    }
    refused = eagle3(tmp_path, "init", "gpt-oss-20b", "--layout", "B", "--force", check=False)
    assert refused.returncode == 2
    assert (
        refused.stderr.strip() == "eagle3 init: error: --layout B: gpt-oss-20b is a one-machine recipe; --layout single"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["gpt-oss-20B", "--layout", "single"],
            "no shipped configuration 'gpt-oss-20B'; one of kimi-k2.5 (--layout A, B or C), gpt-oss-20b (--layout "
            "single)",
        ),
        (
            ["gpt-oss-20b", "--layout", "single", "--name", "me/model"],
            "--name: not for gpt-oss-20b, whose recipe names it",
        ),
        (
            ["kimi-k2.5", "--layout", "A", "--gpus", "4"],
            "--gpus: not for kimi-k2.5, a hero-run configuration; with --verifier DIR or a one-machine recipe",
        ),
        (
            ["kimi-k2.5", "--layout", "B", "--thinking", "off"],
            "--thinking: not for kimi-k2.5, a hero-run configuration; with --verifier DIR or a one-machine recipe",
        ),
    ],
)
def test_init_refuses_a_flag_the_name_does_not_take_in_one_line(tmp_path, args, message):
    refused = eagle3(tmp_path, "init", *args, check=False)
    assert refused.returncode == 2 and refused.stderr.strip() == f"eagle3 init: error: {message}"
    assert not (tmp_path / "params.yaml").exists()


def test_a_recipe_takes_thinking_and_a_license_override_over_its_own():
    text = render_recipe("gpt-oss-20b", thinking=True, license_override="the publisher's terms allow it")
    params = yaml.safe_load(text)
    assert params["generate"]["sampling"]["max_tokens"] == 16384  # long reasoning answers
    assert params["report"]["license_overrides"] == [
        {"license": "apache-2.0", "reason": "the publisher's terms allow it"}
    ]
