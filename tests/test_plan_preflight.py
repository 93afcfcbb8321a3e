"""`eagle3 plan --preflight`: a rented machine's measured figures in the plan, against hand computation, and every
figure measured for something else refused with its line. The report is written as `eagle3 preflight` writes it
on an 8-GPU machine (tests/test_preflight.py checks the tool's own output on this one)."""

import json
from pathlib import Path

import pytest
from test_plan import SEED, TEXT, TOKENS, _plan

from conftest import eagle3

# The training-memory estimate measured by the module's first plan, read by the later ones.
pytestmark = pytest.mark.usefixtures("train_memory_cache")

RAW = TOKENS * 4 * 7168 * 2
LINK = 5e9 * 0.8 / 8
USD_PER_S = 8 * 5.0 / 3600
MACHINE = "8 x NVIDIA B200, 224 cores, 2016 GiB RAM"


def _report(
    path: Path,
    verifier: str = "moonshotai/Kimi-K2.5",
    storage: str = "bf16-lossless",
    draft_vocab: int = 32000,
    ttt_steps: int = 7,
    accelerators: int = 8,
    training_status: str = "ready",
    optimizer: str = "muon",
) -> Path:
    def item(figures: dict, status: str = "ready") -> dict:
        return {"status": status, "verdict": "ready", "figures": figures, "how": {}, "seconds": 1.0}

    report = {
        "format_version": 1,
        "made": "2026-12-02T07:00:00+00:00",
        "machine": MACHINE,
        "identity": {
            "verifier": {"name": verifier, "config_sha256": "0" * 64},
            "draft": {"hidden_size": 7168, "vocab_size": 163840, "draft_vocab_size": draft_vocab},
            "storage": storage,
            "ttt_steps": ttt_steps,
            "sample_tokens": 16384,
        },
        "seconds": 612.0,
        "items": {
            "machine": item({"accelerator_count": accelerators}),
            "training": item(
                {
                    "device": "cuda:0",
                    "tokens_per_s": 9000.0,
                    "measured_tokens": 16384,
                    "precision": "bfloat16",
                    "optimizer": optimizer,
                    "optimizer_step_seconds": 0.25,
                },
                training_status,
            ),
            "extraction": item(
                {
                    "backend": "vllm",
                    "tensor_parallel_size": 8,
                    "tokens_per_s": 80000.0,
                    "compression_ratio": 1.5,
                    "storage": storage,
                }
            ),
            "data_path": item({"free_bytes": 5e12}),
        },
    }
    path.write_text(json.dumps(report))
    return path


def test_an_optimizer_step_measured_with_another_optimizer_is_derived_instead(tmp_path):
    there = _report(tmp_path / "there.json", optimizer="adamw")
    plan = _plan(tmp_path, *SEED, "--preflight", str(there))
    # muon's Newton-Schulz FLOPs for Kimi-K2.5's draft at half a B200's 2,250 TFLOP/s, not adamw's 0.25 s.
    assert plan["rates"]["optimizer_step_s"] == pytest.approx(1.8e14 / (2250e12 * 0.5), rel=0.01)
    assert plan["inputs"]["sources"]["optimizer_step"] == ""
    adamw = _plan(tmp_path, *SEED, "--preflight", str(there), "--optimizer", "adamw")
    assert adamw["rates"]["optimizer_step_s"] == 0.25


def test_measured_figures_replace_the_derived_ones(tmp_path):
    there = _report(tmp_path / "there.json")
    plan = _plan(tmp_path, *SEED, "--preflight", str(there))
    rates, inputs = plan["rates"], plan["inputs"]
    assert rates["train_tokens_per_s"] == 8 * 9000  # per GPU as measured on one, x 8 GPUs
    assert rates["extract_there_tokens_per_s"] == 80000
    assert inputs["compression_ratio"] == 1.5 and plan["hidden_states"]["stored_bytes"] == pytest.approx(RAW / 1.5)
    assert inputs["there"]["disk_tb"] == 5.0
    sources = inputs["sources"]
    measured = f"measured by preflight on {MACHINE}, 2026-12-02T07:00:00+00:00"
    assert sources["train"].startswith(measured) and "16,384-token samples" in sources["train"]
    assert sources["extract_there"] == f"{measured}: extract.backend vllm, tensor parallel 8"
    assert sources["compression_ratio"].startswith(measured) and "bf16-lossless" in sources["compression_ratio"]
    assert "disk 5 TB (free space at data/hidden, measured by preflight" in sources["there"]
    b = plan["scenarios"]["B"]
    # Training without its optimizer step, which preflight measured apart: 4 epochs x 3000 samples, 10 per step (the
    # shipped configuration's 163,840-token budget over 16,384-token samples).
    train_s = 4 * TOKENS / (8 * 9000) + 4 * 3000 / 10 * 0.25
    assert rates["optimizer_step_s"] == 0.25 and sources["optimizer_step"] == f"{measured}: one muon step on one cuda:0"
    steps = {name: b["rented_steps_s"][name] for name in ("fetch_weights", "ship_text", "extract", "train")}
    start = 600e9 / 2e9 + 60  # the engine extraction starts on vLLM
    assert steps == pytest.approx(
        {"fetch_weights": 1200, "ship_text": TEXT / LINK, "extract": TOKENS / 80000 + start, "train": train_s}
    )
    assert b["cost_usd"] == pytest.approx(b["rented_s"] * USD_PER_S)
    # 5 TB free there: (5e12 / 1.2 - 600 GB of weights - checkpoints) / bytes per sample bounds scenario B.
    assert b["disk"]["there"]["budget_tb"] == 5.0 and b["disk"]["there"]["fits"]
    assert not plan["warnings"] or all("preflight" not in w for w in plan["warnings"])

    # An explicit flag still wins over the measured figure.
    explicit = _plan(tmp_path, *SEED, "--preflight", str(there), "--train-tokens-per-s", "5000", "--disk-tb", "2")
    assert explicit["rates"]["train_tokens_per_s"] == 8 * 5000 and explicit["inputs"]["there"]["disk_tb"] == 2.0

    # This machine's report gives the extraction rate here and its disk.
    here = _report(tmp_path / "here.json")
    both = _plan(tmp_path, *SEED, "--preflight", str(there), "--here-preflight", str(here))
    assert both["rates"]["extract_here_tokens_per_s"] == 80000 and both["inputs"]["here"]["disk_tb"] == 5.0
    assert both["scenarios"]["A"]["here_steps_s"]["extract_here"] == pytest.approx(TOKENS / 80000 + 600e9 / 2e9 + 60)


@pytest.mark.parametrize(
    "report, refused, kept",
    [
        (
            {"verifier": "org/other"},
            "rates and compression ratio not used: measured with verifier 'org/other', the plan is for "
            "'moonshotai/Kimi-K2.5'",
            {"disk"},
        ),
        (
            {"storage": "fp8-compact"},
            "compression ratio not used: measured with storage fp8-compact, the plan assumes bf16-lossless (--storage)",
            {"disk", "train", "extract"},
        ),
        (
            {"draft_vocab": 16000},
            "training rate not used: its draft has draft_vocab_size 16000, the plan's 32000",
            {"disk", "extract", "ratio"},
        ),
        (
            {"ttt_steps": 3},
            "training rate not used: it trained 3 TTT steps, the plan 7 (--ttt-steps)",
            {"disk", "extract", "ratio"},
        ),
    ],
)
def test_a_preflight_of_something_else_is_refused_for_those_figures(tmp_path, report, refused, kept):
    path = _report(tmp_path / "there.json", **report)
    plan = _plan(tmp_path, *SEED, "--preflight", str(path), "--storage", "bf16-lossless", "--compression-ratio", "1.4")
    lines = [w for w in plan["warnings"] if "--preflight" in w]
    assert lines == [f"--preflight {path}: {refused}"]
    rates, inputs = plan["rates"], plan["inputs"]
    assert (inputs["there"]["disk_tb"] == 5.0) == ("disk" in kept)
    assert (rates["train_tokens_per_s"] == 72000) == ("train" in kept)
    assert (rates["extract_there_tokens_per_s"] == 80000) == ("extract" in kept)
    # --compression-ratio given: the plan uses it whatever the report says.
    assert inputs["compression_ratio"] == 1.4
    if "ratio" in kept:
        without_flag = _plan(tmp_path, *SEED, "--preflight", str(path))
        assert without_flag["inputs"]["compression_ratio"] == 1.5


def test_a_report_made_before_the_verifier_stage_is_refused_in_one_line(tmp_path):
    """Preflight run before the verifier stage measures no verifier: its rates describe nothing the plan is for,
    and a plan that silently fell back to derived figures would be priced on assumptions the user thinks measured."""
    path = _report(tmp_path / "there.json")
    report = json.loads(path.read_text())
    report["identity"]["verifier"] = None
    path.write_text(json.dumps(report))
    result = eagle3(tmp_path, "plan", *SEED, "--preflight", str(path), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        f"eagle3 plan: error: --preflight {path}: made before the verifier stage ran on {MACHINE}, so it measured no "
        "verifier: run `dvc repro verifier` there (or `dvc pull` its record, with the weights in place), then "
        "`eagle3 preflight` again"
    )


def test_a_report_from_a_machine_without_gpus_is_used_with_a_warning(tmp_path):
    path = _report(tmp_path / "cpu.json", accelerators=0)
    plan = _plan(tmp_path, *SEED, "--preflight", str(path))
    assert plan["rates"]["train_tokens_per_s"] == 72000
    assert any("(no GPUs), while the plan's machine is 8 x NVIDIA B200 SXM" in w for w in plan["warnings"])


def test_a_training_item_that_did_not_pass_gives_no_rate(tmp_path):
    path = _report(tmp_path / "there.json", training_status="fix")
    plan = _plan(tmp_path, *SEED, "--preflight", str(path))
    assert plan["rates"]["train_tokens_per_s"] == pytest.approx(8 * 7134 * 2250 / 989)  # the derived figure


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "not found; run `eagle3 preflight` on that machine"),
        ("{not json", "not an eagle3 preflight report"),
        (json.dumps({"format_version": 99, "items": {}}), "format_version 99, this eagle3 reads 1"),
        ('{"format_version": 1, "items": {"extraction": {"status": "ready", "figures": {"tokens_per_s": NaN}}}}',
         "not an eagle3 preflight report (NaN is not a number a figure may be)"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply to be an eagle3 preflight report"),
        (json.dumps({"format_version": 1, "items": []}), "items: Input should be a valid dictionary"),
    ],
)  # fmt: skip
def test_a_file_that_is_not_a_report_is_one_line(tmp_path, content, expected):
    path = tmp_path / "report.json"
    if content is not None:
        path.write_text(content)
    result = eagle3(tmp_path, "plan", *SEED, "--preflight", str(path), check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"eagle3 plan: error: --preflight {path}: ") and expected in lines[0], lines[0]


# A figure no machine measures, in the report eagle3 preflight writes: one line naming the field, never a figure.
HOSTILE_FIGURES = [
    ("training", "tokens_per_s", 1e308, "items.training.figures.tokens_per_s: Input should be less than"),
    ("training", "tokens_per_s", -9000.0, "items.training.figures.tokens_per_s: Input should be greater than 0"),
    ("training", "tokens_per_s", "fast", "items.training.figures.tokens_per_s: Input should be a valid number"),
    ("extraction", "compression_ratio", 0.5, "items.extraction.figures.compression_ratio: Input should be greater"),
    ("extraction", "storage", "zip", "items.extraction.figures.storage: Input should be"),
    ("data_path", "free_bytes", -5e12, "items.data_path.figures.free_bytes: Input should be greater than or equal"),
    ("machine", "accelerator_count", {"a": 1}, "items.machine.figures.accelerator_count: Input should be a valid"),
]


@pytest.mark.parametrize(
    "item, field, value, expected", HOSTILE_FIGURES, ids=[f"{i}.{f}" for i, f, _, _ in HOSTILE_FIGURES]
)
def test_a_figure_no_machine_measures_is_one_line_naming_it(tmp_path, item, field, value, expected):
    path = _report(tmp_path / "report.json")
    report = json.loads(path.read_text())
    report["items"][item]["figures"][field] = value
    path.write_text(json.dumps(report))
    result = eagle3(tmp_path, "plan", *SEED, "--preflight", str(path), check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"eagle3 plan: error: --preflight {path}: {expected}"), lines[0]


def test_a_report_that_is_no_regular_file_or_too_big_is_refused_unread(tmp_path):
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # reading it would wait forever
    for path, expected in (
        (fifo, "not a regular file, so not an eagle3 preflight report"),
        (Path("/dev/zero"), "not a regular file"),
    ):
        line = eagle3(tmp_path, "plan", *SEED, "--preflight", str(path), check=False).stderr.strip()
        assert line.startswith(f"eagle3 plan: error: --preflight {path}: {expected}"), line
    big = tmp_path / "big.json"
    big.write_text(" " * 5_000_000 + "{}")
    line = eagle3(tmp_path, "plan", *SEED, "--preflight", str(big), check=False).stderr.strip()
    assert line.startswith(f"eagle3 plan: error: --preflight {big}: more than 4,000,000 bytes"), line
