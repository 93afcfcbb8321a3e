"""The shipped configurations (eagle3/configs/) and `eagle3 init`: each validates in every layout, with the
checks that need the verifier's shape run against the verifier it names; init writes it with its comments, and
never over a params file git does not have."""

import subprocess
import sys

import pytest
import yaml

from eagle3.errors import Eagle3Error
from eagle3.init.shipped import CONFIGS_DIR, LAYOUT_KEYS, LAYOUTS, render, shipped
from eagle3.params.loading import validate
from eagle3.params.params_file import Params, check_against_verifier, load_params

from conftest import REPO
from fake_provenance import write_fake_provenance

# The shape the verifier stage records for Kimi-K2.5 (its config.json's text_config), which the checks read.
KIMI_K25 = {
    "name": "moonshotai/Kimi-K2.5",
    "vocab_size": 163840,
    "max_position_embeddings": 262144,
    "hidden_size": 7168,
    "num_hidden_layers": 61,
}


def _check(root):
    return subprocess.run([sys.executable, "-m", "eagle3.cli", "check"], cwd=root, capture_output=True, text=True)


def _init(root, *args):
    return subprocess.run([sys.executable, "-m", "eagle3.cli", "init", *args], cwd=root, capture_output=True, text=True)


def test_the_hero_configuration_is_shipped():
    assert "kimi-k2.5" in shipped()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", shipped())
def test_every_shipped_configuration_validates_in_every_layout(name, layout, tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(render(name, layout, "b200"))
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
    """Checked against the record of the verifier it names, nothing is left unchecked and nothing is refused; the
    same record with a shorter context or a smaller vocabulary refuses the key that no longer fits."""
    path = tmp_path / "params.yaml"
    path.write_text(render("kimi-k2.5", "B"))
    params = load_params(path)
    write_fake_provenance(tmp_path, **KIMI_K25)
    assert check_against_verifier(params, path) == []
    write_fake_provenance(tmp_path, **{**KIMI_K25, "max_position_embeddings": params.extract.max_seq_len - 1})
    with pytest.raises(Eagle3Error, match=r"extract\.max_seq_len: 20480 exceeds the verifier's context"):
        check_against_verifier(params, path)
    write_fake_provenance(tmp_path, **{**KIMI_K25, "vocab_size": params.vocab.draft_vocab_size - 1})
    with pytest.raises(Eagle3Error, match=r"vocab\.draft_vocab_size: 32000 exceeds the verifier's vocabulary"):
        check_against_verifier(params, path)


def _changed(written: str) -> list[str]:
    """The lines of `written` that differ from the shipped kimi-k2.5 file (added lines included), without their
    comments."""
    import difflib

    shipped_text = (CONFIGS_DIR / "kimi-k2.5.yaml").read_text().splitlines()
    diff = difflib.ndiff(shipped_text, written.splitlines())
    return [line[2:].split("#")[0].strip() for line in diff if line.startswith("+ ")]


def test_init_writes_the_file_with_its_comments_and_only_the_layout_keys_differ(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    result = _init(tmp_path, "kimi-k2.5", "--layout", "C", "--gpu", "h200", "--draft-repo", "org/Kimi-K2.5-eagle3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("params.yaml: the kimi-k2.5 configuration, layout C, on NVIDIA H200 SXMs")
    written = (tmp_path / "params.yaml").read_text()
    # An H200 cannot hold the verifier's 75 GB of weights per GPU beside the trainer's 81 GB peak: the verifier
    # sleeps while the trainers train, in phases of the 6 steps of 9.4 GB that 64 GB of buffer holds.
    assert _changed(written) == [
        "gpu_memory_utilization: 0.64",
        "splits: [heldout]",
        "hidden_states: streamed",
        "stream_phase_steps: 6",
        "gpu: h200",
        "draft_repo: org/Kimi-K2.5-eagle3",
    ]
    assert "# layout C on h200, phases: 90 GB awake + trainer at rest 23, then trainer 81 GB: 113 of 141 GB" in written
    checked = _check(tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "GPU memory with streamed states: phases" in checked.stderr
    # A B300 holds both at once: no phases.
    assert _init(tmp_path, "kimi-k2.5", "--layout", "C", "--gpu", "b300", "--force").returncode == 0
    assert "stream_phase_steps" not in (tmp_path / "params.yaml").read_text()
    # The verifier's share of a rented GPU as shipped for stored states (0.9) does not leave the trainer room.
    (tmp_path / "params.yaml").write_text(written.replace("utilization: 0.64", "utilization: 0.9"))
    refused = _check(tmp_path)
    assert refused.returncode == 2
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "eagle3 check: error: params.yaml: extract.vllm.gpu_memory_utilization: streamed states in phases, the "
            "verifier's 0.9 of a NVIDIA H200 SXM (127 GB)"
        )
    )
    shipped_text = (CONFIGS_DIR / "kimi-k2.5.yaml").read_text()
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
        (
            ["kimi-k2.6", "--layout", "B"],
            "eagle3 init: error: no shipped configuration 'kimi-k2.6'; one of kimi-k2.5 (--layout A, B or C), "
            "gpt-oss-20b (--layout single)",
        ),
        (
            ["kimi-k2.5", "--layout", "C"],
            "eagle3 init: error: --layout C: give --gpu (one of b300, b200, h200, h100, h200-nvl, h100-pcie): the "
            "verifier's share of each GPU beside the trainers depends on it",
        ),
        *(
            (
                ["kimi-k2.5", "--layout", layout, "--gpu", "h100"],
                "eagle3 init: error: --gpu h100: moonshotai/Kimi-K2.5's 600 GB of weights do not fit 8 x NVIDIA H100 "
                "SXM (8 x 80 GB x 0.9 = 576 GB), and every layout serves it there to evaluate; rent b300, b200, h200, "
                "h200-nvl (--gpu KIND)",
            )
            for layout in "ABC"
        ),
    ],
)
def test_init_s_bad_input_is_one_line(tmp_path, args, message):
    result = _init(tmp_path, *args)
    assert result.returncode == 2 and result.stderr.strip() == message
    assert not (tmp_path / "params.yaml").exists()


def test_evaluate_engines_on_a_gpu_hold_the_verifier_in_the_dtype_they_compute_in(tmp_path):
    """An 8B verifier stored in bf16 (16 GB) with the CPU's evaluate settings (float32 at 0.3) on an H100: float32
    doubles it past 0.3 x 80 GB, refused before any stage runs, naming the keys; auto (bf16) fits."""
    import json

    from eagle3.plan.gpu_fit import check_evaluate_memory

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"]["launch"] = {**params["train"].get("launch", {}), "gpu": "h100"}
    local = {"kind": "local", "path": str(tmp_path / "models/verifier"), "name": "org/dense-8b", "license": "mit"}
    params["verifier"]["source"] = local
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    loaded = load_params(path)
    assert loaded.evaluate.vllm.dtype == "float32" and loaded.evaluate.vllm.gpu_memory_utilization == 0.3
    write_fake_provenance(tmp_path, name="org/dense-8b", weight_bytes=16 * 10**9)
    (tmp_path / "models/verifier/config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    with pytest.raises(
        Eagle3Error,
        match=r"evaluate.vllm.gpu_memory_utilization: 0.3 of a NVIDIA H100 .* float32 "
        r"\(32 GB per GPU at tensor_parallel_size 1\).*evaluate.vllm.dtype: auto",
    ):
        check_evaluate_memory(loaded, path)
    params["evaluate"]["vllm"]["dtype"] = "auto"
    path.write_text(yaml.safe_dump(params))
    (note,) = check_evaluate_memory(load_params(path), path)
    assert note.startswith("evaluate's engines: the verifier's 16.0 GB per GPU within 24 GB")


def test_check_refuses_a_gpu_kind_that_cannot_load_the_verifier(tmp_path):
    """A params file set to 8 x H100 (edited by hand or for another verifier): the 600 GB verifier cannot load there
    in any layout, which check says before it sizes training memory on that GPU."""
    assert _init(tmp_path, "kimi-k2.5", "--layout", "B", "--gpu", "h200").returncode == 0
    path = tmp_path / "params.yaml"
    path.write_text(path.read_text().replace("gpu: h200 ", "gpu: h100 "))
    refused = _check(tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        "eagle3 check: error: params.yaml: train.launch.gpu: h100: moonshotai/Kimi-K2.5's 600 GB of weights do not "
        "fit 8 x NVIDIA H100 SXM (8 x 80 GB x 0.9 = 576 GB), and every layout serves it there to evaluate; rent "
        "b300, b200, h200, h200-nvl (`eagle3 init NAME --gpu KIND`)"
    )
