"""`eagle3 plan` through the real CLI: every figure against a hand computation, and one error line per bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import eagle3

DVC = str(Path(sys.executable).with_name("dvc"))
SEED = ("--samples", "3000", "--mean-tokens", "16384")


def _metrics(root: Path, ratio: float = 1.476, tokens_per_s: float | None = None) -> Path:
    path = root / "metrics" / "extract.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "compression_ratio": ratio,
                "raw_bytes_per_token": 4608,
                "stored_bytes_per_token": 3122.1,
                "this_run": {"tokens_per_s": tokens_per_s},
            }
        )
    )
    return path


def _plan(root: Path, *args: str) -> dict:
    return json.loads(eagle3(root, "plan", *args, "--json").stdout)


def _error(root: Path, *args: str) -> str:
    result = eagle3(root, "plan", *args, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("eagle3 plan: error: ")
    return lines[0]


def test_seed_case_kimi(tmp_path):
    _metrics(tmp_path)
    plan = _plan(tmp_path, *SEED)
    # 4 captured layers x hidden 7168 x 2 bytes; 3000 x 16384 tokens.
    assert plan["bytes_per_token"] == 57_344
    assert plan["tokens"] == 49_152_000
    assert plan["hidden_states"]["raw_bytes"] == 2_818_572_288_000  # 2.82 TB
    assert plan["hidden_states"]["stored_bytes"] == pytest.approx(2_818_572_288_000 / 1.476)
    assert plan["hidden_states"]["largest_sample_bytes"] == 16_384 * 57_344
    # 2 x 32e9 active + attention 2 x 61 layers x 16384 x 7168 = 78,327,742,464 FLOPs per token;
    # 8 GPUs x 989 TFLOP/s x 0.3 MFU / that = 30,303.4 tokens/s.
    assert plan["rates"]["flops_per_token"] == 78_327_742_464
    assert plan["rates"]["target_tokens_per_s"] == pytest.approx(8 * 989e12 * 0.3 / 78_327_742_464)
    # 5 Gbit/s x 0.8 = 5e8 B/s: the stored states take 1.9097e12 / 5e8 = 3819.4 s to ship.
    assert plan["scenarios"]["A"]["rented_s"] == pytest.approx(2_818_572_288_000 / 1.476 / 5e8)
    # B: 600 GB of weights + 4 B/token of text over the link, then extraction.
    extract_s = 49_152_000 / (8 * 989e12 * 0.3 / 78_327_742_464)
    assert plan["scenarios"]["B"]["rented_s"] == pytest.approx(600e9 / 5e8 + 49_152_000 * 4 / 5e8 + extract_s)
    assert plan["scenarios"]["C"]["rented_s"] == pytest.approx(600e9 / 5e8 + 49_152_000 * 4 / 5e8 + 4 * extract_s)
    assert plan["scenarios"]["B"]["cost_usd"] == pytest.approx(plan["scenarios"]["B"]["rented_s"] / 3600 * 8 * 2.5)
    # Break-even: 1200 s of weights / (38,850.9 B/token / 5e8 - (4 / 5e8 + 1 / 30,303.4)) = 26.85M tokens.
    a = 57_344 / 1.476 / 5e8
    b = 4 / 5e8 + 1 / (8 * 989e12 * 0.3 / 78_327_742_464)
    assert plan["break_even_a_vs_b"]["tokens"] == pytest.approx(1200 / (a - b))
    assert 26.8e6 < plan["break_even_a_vs_b"]["tokens"] < 26.9e6
    assert plan["recommendation"]["scenario"] == "B"
    assert plan["inputs"]["sources"]["compression_ratio"].startswith("metrics/extract.json")

    table = eagle3(tmp_path, "plan", *SEED).stdout
    assert "57,344 B" in table and "2.82 TB" in table and "recommendation: B" in table and "26,8" in table


def test_every_formula_against_hand_computation(tmp_path):
    model = tmp_path / "verifier"
    model.mkdir()
    # A multimodal config keeps the language model's shape under text_config.
    (model / "config.json").write_text(
        json.dumps(
            {
                "_name_or_path": "toy",
                "text_config": {
                    "hidden_size": 1000,
                    "num_hidden_layers": 10,
                    "vocab_size": 5000,
                    "intermediate_size": 4000,
                },
            }
        )
    )
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 10_000_000_000}, "weight_map": {}})
    )
    plan = _plan(
        tmp_path,
        "--verifier",
        str(model),
        "--samples",
        "100",
        "--mean-tokens",
        "1000",
        "--max-tokens",
        "2000",
        "--compression-ratio",
        "2",
        "--link-gbit",
        "8",
        "--link-efficiency",
        "0.5",
        "--extract-tokens-per-s",
        "100000",
        "--gpus",
        "4",
        "--gpu-usd-per-hour",
        "3",
        "--epochs",
        "2",
        "--draft-vocab",
        "1000",
        "--keep-checkpoints",
        "2",
        "--headroom",
        "0.25",
        "--here-tokens-per-s",
        "20000",
        "--here-usd-per-hour",
        "6",
    )
    assert plan["inputs"]["verifier"]["hidden_size"] == 1000 and plan["verifier_weights_bytes"] == 1e10
    assert plan["tokens"] == 100_000
    assert plan["bytes_per_token"] == 8_000  # 4 x 1000 x 2
    assert plan["hidden_states"] == {"raw_bytes": 8e8, "stored_bytes": 4e8, "largest_sample_bytes": 1.6e7}
    assert plan["text_bytes"] == 4e5
    assert plan["draft_params"] == 23_000_000  # 10 x 1000^2 + 3 x 1000 x 4000 + 1000 x 1000
    assert plan["checkpoints_bytes"] == 552_000_000  # x 12 B x 2 kept
    assert plan["rates"]["link_bytes_per_s"] == 5e8  # 8e9 x 0.5 / 8
    assert plan["rates"]["machine_usd_per_hour"] == 12.0

    a, b, c = (plan["scenarios"][k] for k in "ABC")
    assert a["steps_s"] == {"extract_here": 5.0, "transfer_hidden_states": 0.8}  # 1e5 / 2e4; 4e8 / 5e8
    assert a["rented_s"] == pytest.approx(0.8) and a["wall_s"] == pytest.approx(5.8)
    assert a["cost_usd"] == pytest.approx(0.8 * 12 / 3600 + 5 * 6 / 3600)  # rented + owned extraction here
    assert b["steps_s"]["fetch_weights_and_text"] == pytest.approx(20.0008)  # (1e10 + 4e5) / 5e8
    assert b["rented_s"] == pytest.approx(21.0008) and b["cost_usd"] == pytest.approx(21.0008 * 12 / 3600)
    assert c["rented_s"] == pytest.approx(22.0008)  # two epochs of the verifier forward
    assert a["disk_bytes"] == pytest.approx((4e8 + 5.52e8) * 1.25)
    assert b["disk_bytes"] == pytest.approx((1e10 + 4e5 + 4e8 + 5.52e8) * 1.25)
    assert c["disk_bytes"] == pytest.approx((1e10 + 4e5 + 5.52e8) * 1.25)
    # a = 8000 / 2 / 5e8 x 12/3600 + 6 / 3600 / 2e4; b = (4 / 5e8 + 1 / 1e5) x 12/3600; F = 1e10 / 5e8 x 12/3600.
    per_a, per_b, fixed = 4000 / 5e8 * 12 / 3600 + 6 / 3600 / 2e4, (4 / 5e8 + 1e-5) * 12 / 3600, 20 * 12 / 3600
    assert plan["break_even_a_vs_b"]["tokens"] == pytest.approx(fixed / (per_a - per_b))
    assert plan["break_even_a_vs_b"]["samples"] == pytest.approx(fixed / (per_a - per_b) / 1000)
    assert plan["recommendation"]["scenario"] == "A"


def test_disk_limit_and_fast_link_change_the_answer(tmp_path):
    _metrics(tmp_path)
    # Stored states need 2.34 TB (A) and 3.06 TB (B) with headroom; only online training fits 2 TB.
    small_disk = _plan(tmp_path, *SEED, "--disk-tb", "2")
    assert [k for k, s in small_disk["scenarios"].items() if s["fits_disk"]] == ["C"]
    assert (
        small_disk["recommendation"]["scenario"] == "C" and "do not fit 2 TB" in small_disk["recommendation"]["reason"]
    )
    # At 400 Gbit/s shipping a token's states is cheaper than extracting it there: no break-even, A wins.
    fast = _plan(tmp_path, *SEED, "--link-gbit", "400")
    assert fast["break_even_a_vs_b"]["tokens"] is None and fast["recommendation"]["scenario"] == "A"


def test_metrics_supply_ratio_and_speed_here(tmp_path):
    _metrics(tmp_path, ratio=1.5, tokens_per_s=2000)
    plan = _plan(tmp_path, *SEED)
    assert plan["hidden_states"]["stored_bytes"] == pytest.approx(2_818_572_288_000 / 1.5)
    assert plan["scenarios"]["A"]["steps_s"]["extract_here"] == pytest.approx(49_152_000 / 2000)
    assert "this_run.tokens_per_s" in plan["inputs"]["sources"]["here_tokens_per_s"]
    # An explicit ratio wins over the file.
    assert _plan(tmp_path, *SEED, "--compression-ratio", "2")["hidden_states"]["stored_bytes"] == 2_818_572_288_000 / 2


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--samples", "0", "--mean-tokens", "16384"), "--samples must be > 0, got 0"),
        (("--samples", "3000", "--mean-tokens", "-5"), "--mean-tokens must be > 0, got -5"),
        ((*SEED, "--layers", "0"), "--layers must be > 0, got 0"),
        ((*SEED, "--link-gbit", "-1"), "--link-gbit must be > 0, got -1"),
        ((*SEED, "--max-tokens", "100"), "--mean-tokens (16384) cannot exceed --max-tokens (100)"),
        ((*SEED, "--link-efficiency", "1.5"), "--link-efficiency is a fraction in (0, 1], got 1.5"),
        (
            (*SEED, "--verifier", "kimi-k9"),
            "unknown verifier 'kimi-k9': not a preset (kimi-k2.5) and no such config.json",
        ),
        (SEED, "metrics/extract.json not found"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, expected):
    assert expected in _error(tmp_path, *args)


def _dvc_project(root: Path, *remote: str) -> None:
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([DVC, "init", "-q"], cwd=root, check=True)
    subprocess.run([DVC, "remote", "add", *remote], cwd=root, check=True)


@pytest.mark.parametrize("url", ["s3://bucket/path", "ssh://root@127.0.0.1:{port}/srv/dvc"])
def test_unreachable_remote_is_one_line(tmp_path, url):
    from servers import free_port

    port = free_port()  # nothing listens there
    _dvc_project(tmp_path, "far", url.format(port=port))
    if url.startswith("s3"):
        subprocess.run(
            [DVC, "remote", "modify", "far", "endpointurl", f"http://127.0.0.1:{port}"], cwd=tmp_path, check=True
        )
    line = _error(tmp_path, *SEED, "--compression-ratio", "1.5", "--link-from-remote", "far")
    assert f"remote 'far' ({url.format(port=port)}) unreachable: 127.0.0.1:{port}: Connection refused" in line
    assert "no such DVC remote (far)" in _error(
        tmp_path, *SEED, "--compression-ratio", "1.5", "--link-from-remote", "near"
    )


@pytest.mark.slow
def test_link_measured_on_a_real_s3_server(tmp_path):
    from servers import S3_KEY_ID, S3_SECRET, MotoS3

    server = MotoS3(tmp_path / "moto").start()
    try:
        _dvc_project(tmp_path, "-d", "s3", f"s3://{MotoS3.bucket}/eagle3")
        for setting in (
            ["endpointurl", server.endpoint],
            ["--local", "access_key_id", S3_KEY_ID],
            ["--local", "secret_access_key", S3_SECRET],
        ):
            local = setting[:1] if setting[0] == "--local" else []
            subprocess.run([DVC, "remote", "modify", *local, "s3", *setting[len(local) :]], cwd=tmp_path, check=True)
        plan = _plan(tmp_path, *SEED, "--compression-ratio", "1.5", "--link-from-remote", "s3", "--probe-mb", "8")
        assert plan["inputs"]["link_efficiency"] == 1.0 and plan["inputs"]["link_gbit"] > 0
        assert plan["inputs"]["sources"]["link"] == "measured: one 8 MB upload to DVC remote 's3'"
        assert plan["rates"]["link_bytes_per_s"] == pytest.approx(plan["inputs"]["link_gbit"] * 1e9 / 8)
        assert server.object_count() == 0  # the probe is deleted
    finally:
        server.kill()


def test_verifier_dir_without_index_sums_its_safetensors(tmp_path):
    model = tmp_path / "dense"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152}))
    args = (
        "--verifier",
        str(model),
        "--samples",
        "10",
        "--mean-tokens",
        "100",
        "--compression-ratio",
        "1.5",
        "--extract-tokens-per-s",
        "1000",
    )
    assert "weights size unknown (no safetensors beside its config.json): pass --weights-gb" in _error(tmp_path, *args)
    (model / "model-00001.safetensors").write_bytes(b"\0" * 12_345)
    (model / "model-00002.safetensors").write_bytes(b"\0" * 655)
    plan = _plan(tmp_path, *args)
    assert plan["verifier_weights_bytes"] == 13_000 and plan["bytes_per_token"] == 4 * 576 * 2
    assert plan["draft_params"] == 10 * 576**2 + 3 * 576 * 4 * 576 + 32000 * 576  # intermediate defaults to 4 x hidden
