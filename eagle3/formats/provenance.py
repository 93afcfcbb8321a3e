"""models/verifier/provenance.json: which verifier every later stage runs, identified by content hashes.

Written by the verifier stage, read (through `read_provenance`) by every stage that touches the verifier.
Deterministic (sorted keys, no timestamps): rerunning the verifier stage on the same model writes the same
bytes, so nothing downstream is invalidated.

Fields: name and license; source (`pypi-gguf`: package, version, wheel and GGUF sha256, the converter's
versions; `local`: nothing more, as where its directory is differs from machine to machine, see
`verifier_location`); dtype; the text model's
architecture facts (architectures, model_type, hidden_size, num_hidden_layers, vocab_size,
intermediate_size, num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings,
rms_norm_eps, rope_theta, tie_word_embeddings) and vLLM's default EAGLE-3 aux layer ids (2, N//2, N-3); the
sha256 of config.json, of the tokenizer files and of the chat template; trust_remote_code; and the weights,
identified by content: every *.safetensors file's size and the sha256 of all its bytes (`weight_files`), one hash
over those (`weights_sha256`), the file count and total bytes, and the sha256 of model.safetensors.index.json
where there is one (`weight_index_sha256`). Hashing reads every byte once per machine (eagle3/formats/
weight_hashes.py keeps each file's digest under its stat stamp), so a fine-tune or another revision with the same
shapes is another verifier.
"""

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError

from eagle3.errors import Eagle3Error
from eagle3.files import write_json
from eagle3.formats.hf_config import (
    CONFIG,
    WEIGHT_INDEX,
    read_config,
    read_json,
    require,
    weight_index,
)
from eagle3.formats.weight_hashes import file_hashes, weights_sha256
from eagle3.hashing import sha256_bytes, sha256_file
from eagle3.params.loading import project_params_file, read_yaml
from eagle3.paths import PROVENANCE, VERIFIER_DIR

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "tiktoken.model",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
)
# What identifies a verifier whatever its weights layout: a stage that must redo its work when the verifier
# changes pins these (plus the weights fingerprint where it reads weights).
TEXT_IDENTITY = ("name", "config_sha256", "tokenizer_sha256", "chat_template_sha256")
# A machine's own location of a local verifier, over params.yaml's verifier.source.path (`verifier_location`).
VERIFIER_PATH_ENV = "EAGLE3_VERIFIER_PATH"
# safetensors' own bound on a header's length.
_MAX_SAFETENSORS_HEADER = 100_000_000


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PypiGgufOrigin(_Record):
    kind: Literal["pypi-gguf"]
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    gguf_file: str
    gguf_sha256: str
    quantization: str
    upstream_model: str
    converter: dict[str, str]


class LocalOrigin(_Record):
    kind: Literal["local"]


Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class WeightFile(_Record):
    bytes: PositiveInt
    sha256: Sha256Hex


class Provenance(_Record):
    name: str
    license: str
    source: Annotated[PypiGgufOrigin | LocalOrigin, Field(discriminator="kind")]
    dtype: Literal["bfloat16", "float16", "float32"]
    architectures: list[str]
    model_type: str | None
    # Sizes a model can have: a corrupted record is refused on reading, not a shape that fails later.
    hidden_size: PositiveInt
    num_hidden_layers: PositiveInt
    vocab_size: PositiveInt
    intermediate_size: PositiveInt | None
    num_attention_heads: PositiveInt
    num_key_value_heads: PositiveInt
    head_dim: PositiveInt
    max_position_embeddings: PositiveInt
    rms_norm_eps: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)] | None
    # As config.json spells it (an int stays an int), so the file's bytes follow the verifier's config.
    rope_theta: PositiveInt | Annotated[float, Field(gt=0, allow_inf_nan=False)] | None
    tie_word_embeddings: bool
    default_aux_layer_ids: list[NonNegativeInt]
    chat_template_sha256: str
    tokenizer_sha256: str
    config_sha256: str
    trust_remote_code: bool
    num_weight_files: PositiveInt
    weight_bytes: PositiveInt
    weight_files: dict[str, WeightFile]
    weights_sha256: Sha256Hex
    weight_index_sha256: str | None = None

    def identity(self, *fields: str) -> dict[str, Any]:
        """{field: value} for the named fields: the part of the verifier a run key pins."""
        return {name: getattr(self, name) for name in fields}

    def weights_identity(self) -> dict[str, str]:
        """The weights' identity: one hash over every weight file's content hash."""
        return {"weights_sha256": self.weights_sha256}

    def to_json(self) -> dict[str, Any]:
        # An index that does not exist is left out rather than written as null.
        return self.model_dump(
            mode="json", exclude={"weight_index_sha256"} if self.weight_index_sha256 is None else None
        )


def read_provenance(root: Path) -> Provenance:
    path = root / PROVENANCE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise Eagle3Error(f"{path}: missing; run `dvc repro verifier` (or `eagle3 verifier`) first") from None
    try:
        return Provenance.model_validate_json(text)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        raise Eagle3Error(f"{path}: {where}: {problem['msg']}; rerun `eagle3 verifier` to rewrite it") from None


def write_provenance(out_dir: Path, provenance: Provenance) -> None:
    write_json(out_dir / PROVENANCE.name, provenance.to_json())


def verifier_location(root: Path) -> tuple[Path, str]:
    """Where a `local` verifier's directory is on this machine, and the setting that says so: EAGLE3_VERIFIER_PATH
    where set (relative to the project, or absolute), else verifier.source.path of the params file. Not part of
    the verifier's identity: the verifier stage records none, so the same weights at another path, on another
    machine, are the same verifier and nothing downstream re-runs."""
    override = os.environ.get(VERIFIER_PATH_ENV)
    if override:
        return (root / override).resolve(), VERIFIER_PATH_ENV
    params_file = project_params_file(root)
    source = (read_yaml(params_file) or {}).get("verifier", {}) or {}
    path = source.get("source", {}).get("path") if isinstance(source, dict) else None
    if not isinstance(path, str) or not path:
        raise Eagle3Error(
            f"{params_file}: verifier.source.path: missing; the verifier is a local directory: give its path there, "
            f"or set {VERIFIER_PATH_ENV} on this machine"
        )
    return (params_file.parent / path).resolve(), "verifier.source.path"


def verifier_dir(root: Path) -> Path:
    """Where the verifier's HF files are: the converted copy, or the local directory on this machine."""
    source = read_provenance(root).source
    if isinstance(source, LocalOrigin):
        model_dir, setting = verifier_location(root)
        if not model_dir.is_dir():
            raise Eagle3Error(
                f"{setting}: {model_dir} is not a directory; mount or copy the verifier there, or point {setting} at "
                f"where it is on this machine ({VERIFIER_PATH_ENV} overrides verifier.source.path)"
            )
        return model_dir
    return root / VERIFIER_DIR


def checked_verifier_dir(root: Path) -> Path:
    """`verifier_dir`, after re-checking a verifier's identity (config, tokenizer, chat template, and every weight
    file's bytes: eagle3/formats/weight_hashes.py, from its per-machine cache where a file is unchanged) against the
    verifier stage's record: a copy fetched onto another machine, another revision, a fine-tune of the same shapes
    or a hand-edited file is refused in one line naming the file that differs, before a stage computes anything from
    it that the lineage would attribute to the recorded verifier."""
    model_dir = verifier_dir(root)
    provenance = read_provenance(root)
    check_identity(model_dir, provenance, root / PROVENANCE)
    return model_dir


def check_identity(model_dir: Path, provenance: Provenance, record: Path) -> None:
    """Eagle3Error, naming the first file of `model_dir` that is not what `provenance` (read from `record`) says."""
    refit = (
        "another copy or revision; fetch the recorded one, or run `dvc repro --force --single-item verifier` to record "
        "this one (a plain `dvc repro` keeps the recorded one: the directory is not a DVC dependency), then `dvc "
        "repro` reruns every later stage"
    )
    current = describe_model_dir(model_dir, provenance.trust_remote_code)
    tokenizer_files = ", ".join(name for name in TOKENIZER_FILES if (model_dir / name).is_file())
    template = "chat_template.jinja" if (model_dir / "chat_template.jinja").is_file() else "tokenizer_config.json"
    files = {
        "config_sha256": CONFIG,
        "tokenizer_sha256": f"a tokenizer file ({tokenizer_files})",
        "chat_template_sha256": f"the chat template ({template})",
    }
    recorded = provenance.model_dump()
    for key, what in files.items():
        if current.get(key) != recorded[key]:
            raise Eagle3Error(
                f"{model_dir}: {what} is not what the verifier stage recorded in {record} ({key} {current.get(key)}, "
                f"recorded {recorded[key]}): {refit}"
            )
    weights = weights_fingerprint(model_dir)["weight_files"]
    for name in sorted(set(weights) | set(provenance.weight_files)):
        now, then = weights.get(name), provenance.weight_files.get(name)
        if now is None or then is None:
            state = "is missing" if now is None else "is there but was not recorded"
            raise Eagle3Error(f"{model_dir / name}: {state} in {record}'s weight_files: {refit}")
        if now != then.model_dump():
            raise Eagle3Error(
                f"{model_dir / name}: {now['bytes']:,} bytes of sha256 {now['sha256']}, the verifier stage recorded "
                f"{then.bytes:,} bytes of sha256 {then.sha256} in {record}: {refit}"
            )


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """vLLM's EAGLE-3 default: residual stream entering layers 2, N//2 and N-3 (id k = HF hidden_states[k])."""
    return [2, num_layers // 2, num_layers - 3]


def describe_model_dir(model_dir: Path, trust_remote_code: bool) -> dict[str, Any]:
    """Architecture facts and hashes every later stage needs, read without executing model code (and as untrusted:
    eagle3/formats/hf_config.py)."""
    config = read_config(model_dir)
    config_path = model_dir / CONFIG
    if config.get("auto_map") and not trust_remote_code:
        raise Eagle3Error(
            f"{config_path}: the model needs its own Python code (auto_map); if you trust it, "
            "set verifier.trust_remote_code: true in params.yaml"
        )
    needed = ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size", "max_position_embeddings")
    text = require(config_path, config, needed, "cannot size the draft model without it")
    num_layers, heads, hidden = text["num_hidden_layers"], text["num_attention_heads"], text["hidden_size"]
    # A null is the key's default, as transformers reads it.
    tied = config.get("tie_word_embeddings")
    return {
        "architectures": config.get("architectures") or [],
        "model_type": text.get("model_type", config.get("model_type")),
        "hidden_size": hidden,
        "num_hidden_layers": num_layers,
        "vocab_size": text["vocab_size"],
        "intermediate_size": text.get("intermediate_size"),
        "num_attention_heads": heads,
        "num_key_value_heads": text.get("num_key_value_heads") or heads,
        "head_dim": text.get("head_dim") or hidden // heads,
        "max_position_embeddings": text["max_position_embeddings"],
        "rms_norm_eps": text.get("rms_norm_eps"),
        "rope_theta": text.get("rope_theta", (text.get("rope_parameters") or {}).get("rope_theta")),
        "tie_word_embeddings": bool(text.get("tie_word_embeddings")) if tied is None else tied,
        "default_aux_layer_ids": default_aux_layer_ids(num_layers),
        "chat_template_sha256": sha256_bytes(chat_template(model_dir).encode("utf-8")),
        "tokenizer_sha256": tokenizer_sha256(model_dir),
        "config_sha256": _sha256(config_path),
        "trust_remote_code": trust_remote_code,
    }


def _sha256(path: Path) -> str:
    try:
        return sha256_file(path)
    except OSError as exc:
        raise Eagle3Error(f"{path}: cannot read it ({exc.strerror or exc})") from None


def chat_template(model_dir: Path) -> str:
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise Eagle3Error(f"{jinja}: not UTF-8 text ({exc})") from None
        except OSError as exc:
            raise Eagle3Error(f"{jinja}: cannot read it ({exc.strerror or exc})") from None
    path = model_dir / "tokenizer_config.json"
    if path.is_file():
        template = read_json(path, "the verifier needs its tokenizer files").get("chat_template")
        if isinstance(template, str) and template:
            return template
        # transformers' list of named templates has no single one to hash: chat_template.jinja stands in for it.
        if template is not None and not isinstance(template, list):
            raise Eagle3Error(f"{path}: chat_template is a JSON {type(template).__name__}, not a string")
    raise Eagle3Error(
        f"{model_dir}: no chat template (chat_template.jinja or tokenizer_config.json:chat_template); "
        "the verifier must be a chat/instruct model"
    )


def tokenizer_sha256(model_dir: Path) -> str:
    """One hash over every tokenizer file present, so extracted hidden states can be matched to their tokenizer."""
    parts = [f"{name}:{_sha256(model_dir / name)}" for name in TOKENIZER_FILES if (model_dir / name).is_file()]
    if not parts:
        raise Eagle3Error(f"{model_dir}: no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    return sha256_bytes("\n".join(parts).encode())


def _check_safetensors(path: Path, size: int) -> None:
    """One line unless the file's first 8 bytes give a header length safetensors allows (at most 100 MB, inside the
    file): a damaged or truncated file is named before its bytes are hashed."""
    try:
        with open(path, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
    except OSError as exc:
        raise Eagle3Error(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if not 2 <= length <= min(_MAX_SAFETENSORS_HEADER, size - 8):
        raise Eagle3Error(
            f"{path}: not a safetensors file (its {size} bytes begin with a header length of {length}); "
            "restore the verifier's weights from its source"
        )


def weights_fingerprint(model_dir: Path) -> dict[str, Any]:
    """Identify the weights by content: every *.safetensors file's size and sha256 (each checked to be a
    safetensors file first), one hash over them, their count and total bytes, and the shard index's sha256."""
    index = model_dir / WEIGHT_INDEX
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in model_dir.glob("*.bin"))
        hint = f" (found pickle weights {', '.join(pickled[:3])}: convert them to safetensors first)" if pickled else ""
        raise Eagle3Error(f"{model_dir}: no *.safetensors weights{hint}")
    try:
        sizes = {path: path.stat().st_size for path in files}
    except OSError as exc:  # glob lists a dangling link that stat cannot follow
        raise Eagle3Error(f"{exc.filename}: cannot read it ({exc.strerror})") from None
    for path, size in sizes.items():
        _check_safetensors(path, size)
    digests = file_hashes(files)
    weight_files: dict[str, dict[str, int | str]] = {
        path.name: {"bytes": size, "sha256": digests[path]} for path, size in sizes.items()
    }
    fingerprint: dict[str, Any] = {
        "num_weight_files": len(files),
        "weight_bytes": sum(sizes.values()),
        "weight_files": weight_files,
        "weights_sha256": weights_sha256(weight_files),
    }
    if index.is_file():
        weight_index(model_dir, "restore the verifier's weight index from its source")
        fingerprint["weight_index_sha256"] = _sha256(index)
    return fingerprint
