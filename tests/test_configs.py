"""The shipped configurations (eagle3/configs/) and `eagle3 init`: each validates in every layout, with the
checks that need the verifier's shape run against the verifier it names; init writes it with its comments, and
never over a params file git does not have."""

import subprocess
import sys

import pytest
import yaml

from eagle3.config import Params, check_against_verifier, load_params
from eagle3.params.loading import validate
from eagle3.tools.configs import CONFIGS_DIR, LAYOUT_KEYS, LAYOUTS, render, shipped

from conftest import REPO
from fake_provenance import write_fake_provenance

# The shape the verifier stage records for Kimi-K2.5 (its config.json's text_config), which the checks read.
KIMI_K25 = {"vocab_size": 163840, "max_position_embeddings": 262144, "hidden_size": 7168, "num_hidden_layers": 61}


def _init(root, *args):
    return subprocess.run([sys.executable, "-m", "eagle3.cli", "init", *args], cwd=root, capture_output=True, text=True)


def test_the_hero_configuration_is_shipped():
    assert "kimi-k2.5" in shipped()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", shipped())
def test_every_shipped_configuration_validates_in_every_layout(name, layout, tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(render(name, layout))
    params = load_params(path)
    assert params.warnings() == []
    for (section, key), value in LAYOUT_KEYS[layout].items():
        assert getattr(getattr(params, section), key) == value
    # What the hero run is for: a Kimi-K2.5 draft as the published ones, evaluated on running servers.
    if name == "kimi-k2.5":
        assert params.verifier.source.name == "moonshotai/Kimi-K2.5" and params.verifier.trust_remote_code
        assert params.vocab.draft_vocab_size == 32000 and params.train.ttt_steps == 7
        assert params.generate.sampling.max_tokens < params.extract.max_seq_len
        assert params.evaluate.backend == "servers" and {s.name for s in params.benchmarks.sets} == {
            "mt-bench",
            "humaneval",
            "gsm8k",
        }
        assert all(s.max_prompts is None for s in params.benchmarks.sets)
        assert params.train.hidden_states == ("streamed" if layout == "C" else "stored")


def test_the_hero_configuration_fits_the_verifier_it_names(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(render("kimi-k2.5", "B"))
    write_fake_provenance(tmp_path, **KIMI_K25)
    check_against_verifier(load_params(path), path)


def test_init_writes_the_file_with_its_comments_and_only_the_layout_keys_differ(tmp_path):
    result = _init(tmp_path, "kimi-k2.5", "--layout", "C")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("params.yaml: the kimi-k2.5 configuration, layout C")
    written = (tmp_path / "params.yaml").read_text()
    shipped_text = (CONFIGS_DIR / "kimi-k2.5.yaml").read_text()
    changed = [(a, b) for a, b in zip(shipped_text.splitlines(), written.splitlines(), strict=True) if a != b]
    assert [b.split("#")[0].strip() for _, b in changed] == ["splits: [heldout]", "hidden_states: streamed"]
    assert _init(tmp_path, "kimi-k2.5", "--layout", "B", "--force").returncode == 0
    assert (tmp_path / "params.yaml").read_text() == shipped_text
    assert validate(yaml.safe_load(shipped_text), Params, tmp_path).train.hidden_states == "stored"


def test_init_never_overwrites_what_git_does_not_have(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    refused = _init(tmp_path, "kimi-k2.5", "--layout", "B")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "eagle3 init: error: params.yaml has changes git does not have; commit or stash them, or pass --force to "
        "overwrite it"
    )
    assert (tmp_path / "params.yaml").read_text() == (REPO / "params.yaml").read_text()
    subprocess.run(["git", "add", "params.yaml"], cwd=tmp_path, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "default"], cwd=tmp_path, check=True
    )
    assert _init(tmp_path, "kimi-k2.5", "--layout", "A").returncode == 0
    assert load_params(tmp_path / "params.yaml").verifier.source.name == "moonshotai/Kimi-K2.5"


@pytest.mark.parametrize(
    "args, message",
    [
        (["kimi-k2.6", "--layout", "B"], "eagle3 init: error: no shipped configuration 'kimi-k2.6'; one of kimi-k2.5"),
    ],
)
def test_init_s_bad_input_is_one_line(tmp_path, args, message):
    result = _init(tmp_path, *args)
    assert result.returncode == 2 and result.stderr.strip() == message
    assert not (tmp_path / "params.yaml").exists()
