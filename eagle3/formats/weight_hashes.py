"""The verifier's weights identified by content: the sha256 of every weight file's bytes.

Hashed in parallel (hashlib releases the GIL over large buffers, so threads scale to the disk's read rate), largest
file first, with a progress bar; at Kimi-K2.5's 600 GB a cold pass is the disk's read time (the plan prices it:
eagle3/plan/model.py's `hash_weights`).

Each file's digest is kept in a per-machine cache ($XDG_CACHE_HOME/eagle3/weight-hashes.json, else
~/.cache/eagle3/) under its real path with the stat stamp it was hashed at (device, inode, size, modification and
change times, as DVC's state database keys its hashes): a later stage on the same machine re-checks the weights
from their stamps, and any write, copy or new download changes a stamp and so hashes the file again. A digest is
kept only where the stamp did not change while it was computed.

Where a file is a Hugging Face cache entry (snapshots/<commit>/NAME -> ../../blobs/<sha256>: every LFS file, which
safetensors weights are, is named by its content's sha256), that name is checked against the bytes, not trusted:
a damaged download is refused naming the blob. Only the link's own target is read: newer huggingface_hub may link
the blob on to a Xet store whose names are not sha256 of the bytes.
"""

import hashlib
import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eagle3.errors import Eagle3Error
from eagle3.files import write_json
from eagle3.hashing import sha256_bytes
from eagle3.progress import Quiet, progress

_BUFFER = 16 << 20
# Hashing less than this takes seconds: no progress bar.
_SHOWN_FROM = 4 << 30
_MOST_THREADS = 16
_SHA256_NAME = re.compile(r"[0-9a-f]{64}")


def cache_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eagle3" / "weight-hashes.json"


def _stamp(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


def hub_blob_sha256(path: Path) -> str | None:
    """The sha256 a Hugging Face cache entry's blob is named by, or None where `path` is no such entry."""
    if not path.is_symlink():
        return None
    target = Path(os.readlink(path))
    if target.parent.name == "blobs" and _SHA256_NAME.fullmatch(target.name):
        return target.name
    return None


def _digest(path: Path, advance) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(_BUFFER)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(buffer):
            digest.update(view[:count])
            advance(count)
    return digest.hexdigest()


def _read_cache(path: Path) -> dict[str, dict]:
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return cached if isinstance(cached, dict) else {}


def file_hashes(files: list[Path], cache: Path | None = None) -> dict[Path, str]:
    """The sha256 of each file's bytes, from the cache where its stamp is unchanged, else hashed (in parallel).
    Eagle3Error, naming the file, where one cannot be read or a Hugging Face blob's bytes are not its name."""
    cache = cache_path() if cache is None else cache
    known = _read_cache(cache)
    digests: dict[Path, str] = {}
    todo: list[tuple[Path, str, list[int]]] = []
    for path in files:
        try:
            real, stamp = os.path.realpath(path), _stamp(path)
        except OSError as exc:
            raise Eagle3Error(f"{path}: cannot read it ({exc.strerror or exc})") from None
        entry = known.get(real)
        if isinstance(entry, dict) and entry.get("stamp") == stamp and isinstance(entry.get("sha256"), str):
            digests[path] = entry["sha256"]
        else:
            todo.append((path, real, stamp))
    if todo:
        _hash_into(todo, digests, known)
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            write_json(cache, known)
        except OSError:
            pass  # an unwritable cache costs the next check a full pass, nothing else
    for path, digest in digests.items():
        named = hub_blob_sha256(path)
        if named is not None and named != digest:
            raise Eagle3Error(
                f"{path}: its Hugging Face cache blob {os.readlink(path)} holds other bytes than its name (sha256 "
                f"{digest}): a damaged download; delete the blob and download the model again"
            )
    return digests


def _hash_into(todo: list[tuple[Path, str, list[int]]], digests: dict[Path, str], known: dict[str, dict]) -> None:
    todo.sort(key=lambda item: -item[2][2])  # largest first: the last thread to finish has the least left
    total = sum(item[2][2] for item in todo)
    lock = threading.Lock()
    with progress() if total > _SHOWN_FROM else Quiet() as bar:
        task = bar.add_task(f"verifier: hashing {len(todo)} weight files (bytes)", total=total)

        def advance(count: int) -> None:
            with lock:
                bar.advance(task, count)

        def one(item: tuple[Path, str, list[int]]) -> tuple[Path, str, list[int], str]:
            path, real, stamp = item
            try:
                return path, real, stamp, _digest(path, advance)
            except OSError as exc:
                raise Eagle3Error(f"{path}: cannot read it ({exc.strerror or exc})") from None

        with ThreadPoolExecutor(min(len(todo), os.cpu_count() or 1, _MOST_THREADS)) as pool:
            for path, real, stamp, digest in pool.map(one, todo):
                digests[path] = digest
                try:
                    unchanged = _stamp(path) == stamp
                except OSError:
                    unchanged = False
                if unchanged:
                    known[real] = {"stamp": stamp, "sha256": digest}


def weights_sha256(files: dict[str, dict[str, int | str]]) -> str:
    """One hash over every weight file's name, size and sha256 (as provenance records them)."""
    lines = (f"{name}:{entry['bytes']}:{entry['sha256']}" for name, entry in sorted(files.items()))
    return sha256_bytes("\n".join(lines).encode())
