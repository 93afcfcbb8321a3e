"""Content hashes recorded in provenance and dataset cards."""

import hashlib
from pathlib import Path

_CHUNK = 8 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def safetensors_header_sha256(path: Path) -> str:
    """Hash of a safetensors file's JSON header (tensor names, dtypes, shapes, offsets): cheap at any file size."""
    with open(path, "rb") as handle:
        length_bytes = handle.read(8)
        header = handle.read(int.from_bytes(length_bytes, "little")) if len(length_bytes) == 8 else b""
    return sha256_bytes(length_bytes + header)
