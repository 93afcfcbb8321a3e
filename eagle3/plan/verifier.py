"""The verifier `eagle3 plan` plans for: a preset, or a Hugging Face model's config.json and weight files, with the
flags that supply what those lack."""

import argparse
import json
from dataclasses import replace
from pathlib import Path

from eagle3.errors import Eagle3Error
from eagle3.formats.hf_config import text_config
from eagle3.plan.facts import GB, PRESETS, VerifierShape


def weight_file_bytes(model_dir: Path) -> float:
    """The size of the *.safetensors files in `model_dir` (what a copy moves; 0 where there are none)."""
    return float(sum(path.stat().st_size for path in model_dir.glob("*.safetensors")))


def weights_bytes(model_dir: Path) -> float | None:
    """What is on disk (tensors and their headers: what a copy moves), else model.safetensors.index.json's tensor
    bytes (a directory of the model's small files only), else None."""
    on_disk = weight_file_bytes(model_dir)
    if on_disk:
        return on_disk
    try:
        index = json.loads((model_dir / "model.safetensors.index.json").read_text(encoding="utf-8"))
        return float(index["metadata"]["total_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def verifier_shape(spec: str) -> VerifierShape:
    """A preset name, or a Hugging Face config.json (a multimodal one's `text_config` is used). The weights' size is
    that of the *.safetensors files beside it (what a copy moves), else model.safetensors.index.json's total; the
    parameters are counted from those files' headers."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise Eagle3Error(f"unknown verifier {spec!r}: not a preset ({', '.join(PRESETS)}) and no such config.json")
    try:
        config = json.loads(path.read_text())
        text = text_config(config)
        hidden, layers, vocab = int(text["hidden_size"]), int(text["num_hidden_layers"]), int(text["vocab_size"])
        intermediate = int(text.get("intermediate_size") or 4 * hidden)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Eagle3Error(
            f"{path}: not a usable verifier config.json ({type(exc).__name__}: {exc}); it needs hidden_size, "
            "num_hidden_layers and vocab_size"
        ) from None
    weights = weights_bytes(path.parent)
    name = config.get("_name_or_path") or str(path.parent)
    total, active = parameter_counts(path.parent, text)
    return VerifierShape(name, hidden, layers, vocab, intermediate, total, active, weights, text)


# Routed experts' tensors, as DeepSeek, Qwen-MoE, gpt-oss and Mixtral checkpoints name them.
_EXPERT = (".experts.", ".block_sparse_moe.experts.")


def parameter_counts(model_dir: Path, text: dict) -> tuple[float | None, float | None]:
    """Total parameters, from the safetensors headers beside the config (no weights read), and those active per
    token: of the routed experts' tensors only num_experts_per_tok of every n experts. (None, None) where there
    are no readable weight files."""
    from eagle3.formats.tensor_files import tensor_shapes

    total = experts = 0
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None, None
    try:
        for file in files:
            for name, shape in tensor_shapes(file, "the plan counts the verifier's parameters from it").items():
                count = 1
                for size in shape:
                    count *= size
                total += count
                experts += count if any(marker in name for marker in _EXPERT) else 0
    except Eagle3Error:
        return None, None
    routed = text.get("n_routed_experts") or text.get("num_experts") or text.get("num_local_experts")
    chosen = text.get("num_experts_per_tok")
    active = total - experts * (1 - chosen / routed) if experts and routed and chosen else total
    return float(total), float(active)


def verifier_from_args(args: argparse.Namespace) -> VerifierShape:
    """--verifier's shape with --active-params and --weights-gb applied, with every figure the plan needs."""
    verifier = verifier_shape(args.verifier)
    if args.active_params is not None:
        verifier = replace(verifier, active_params=args.active_params)
    if args.weights_gb is not None:
        verifier = replace(verifier, weights_bytes=args.weights_gb * GB)
    if verifier.weights_bytes is None:
        raise Eagle3Error(
            f"verifier {args.verifier!r}: weights size unknown (no safetensors beside its config.json): pass "
            "--weights-gb"
        )
    return verifier


def require_parameter_count(args: argparse.Namespace, verifier: VerifierShape, there: bool, here: bool) -> None:
    """Extraction speeds not measured (`there`/`here`: given or measured) are derived from FLOP/s per parameter."""
    if (not there or not here) and verifier.active_params is None:
        raise Eagle3Error(
            f"verifier {args.verifier!r} has no parameter count: pass --active-params to derive extraction speeds "
            "from GPU FLOP/s, or --extract-tokens-per-s and --here-tokens-per-s (or preflight reports)"
        )
