"""train -> export with `train.draft_method: dflash` on the real verifier's regenerated answers, and the exported
block draft inside vLLM (`method: dflash`)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from eagle3.chat.mask_token import unused_special_token
from eagle3.formats.exported_dflash import write_dflash
from eagle3.modeling.dflash import DFlashConfig, DFlashDraft

from conftest import copy_project, draft_params, eagle3, losses, served_counters, write_params

pytestmark = pytest.mark.slow

BLOCK = 4
DFLASH = {"draft_method": "dflash", "dflash": {"layers": 1, "block_size": BLOCK, "anchors": 32}}


@pytest.fixture(scope="module")
def dflash_trained(extracted_real, tmp_path_factory):
    root = copy_project(extracted_real, tmp_path_factory.mktemp("dflash"), draft_params(**DFLASH))
    eagle3(root, "train")
    eagle3(root, "export")
    return root


def test_the_block_draft_learns_and_exports_as_vllm_loads_it(dflash_trained):
    from transformers import AutoTokenizer

    curve = losses(dflash_trained)
    assert curve[-1] < 0.6 * curve[0], curve
    config = json.loads((dflash_trained / "models/draft/config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == BLOCK
    tokenizer = AutoTokenizer.from_pretrained(dflash_trained / "models/verifier")
    mask = config["dflash_config"]["mask_token_id"]
    # The embedded verifier's highest special token that its template never writes and that no role names.
    assert (mask, tokenizer.convert_ids_to_tokens(mask)) == unused_special_token(tokenizer, config["vocab_size"])
    assert tokenizer.convert_ids_to_tokens(mask) not in tokenizer.chat_template
    assert mask not in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert set(load_file(dflash_trained / "models/draft/model.safetensors")) >= {
        "fc.weight",
        "layers.0.mlp.up_proj.weight",
    }
    result = eagle3(dflash_trained, "validate-draft", "models/draft", "--verifier", "models/verifier")
    assert "valid DFlash draft" in result.stdout
    readme = (dflash_trained / "models/draft-speculators/README.md").read_text()
    assert "DFlash block draft" in readme and not (dflash_trained / "models/draft-speculators/config.json").exists()


def test_export_refuses_a_block_draft_for_the_chain_method(dflash_trained, tmp_path):
    root = copy_project(dflash_trained, tmp_path / "chain", draft_params(**DFLASH))
    write_params(root, draft_params())
    result = eagle3(root, "export", check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "a dflash draft, not train.draft_method's eagle3" in result.stderr


def _untrained(root, directory):
    trained = DFlashConfig(**{**json.loads((root / "checkpoints/run.json").read_text())["settings"]["draft"]})
    draft = DFlashDraft(trained)
    draft.init_weights(torch.Generator().manual_seed(1))
    write_dflash(draft, load_file(root / "data/vocab/vocab.safetensors")["d2t"], directory, "bfloat16")
    return directory


def test_vllm_serves_the_block_draft_losslessly_and_training_makes_it_accepted(dflash_trained, tmp_path):
    drafts = {
        "trained": dflash_trained / "models/draft",
        "untrained": _untrained(dflash_trained, tmp_path / "untrained"),
    }
    rates = {}
    for name, counters in served_counters(dflash_trained, "dflash", BLOCK - 1, drafts).items():
        assert counters["num_drafts"] > 0 and len(counters["accepted_per_position"]) == BLOCK - 1, counters
        rates[name] = counters["accepted_per_position"][0] / counters["num_drafts"]
    # A few dozen steps on this small set teach a block draft its first slot only (the later slots need far more):
    # an export that served other layers, another mask token or other weights proposes nothing the verifier
    # accepts, as the untrained draft does.
    assert rates["trained"] > 0.04 and rates["untrained"] < 0.01, rates


def test_evaluate_refuses_an_export_of_the_other_method_in_one_line(dflash_trained, tmp_path):
    root = copy_project(dflash_trained, tmp_path / "chain", draft_params())
    result = eagle3(root, "evaluate", check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "models/draft: a DFlash draft, but evaluate measures eagle3; rerun `dvc repro export`" in result.stderr
