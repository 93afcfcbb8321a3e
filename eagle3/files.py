"""The pipeline's small files: JSON read with one clear error, and crash-safe writes (deterministic JSON, files
and directories that appear whole or not at all).

Identical content gives identical bytes (no timestamps, sorted keys), so DVC hashes stay stable and
downstream stages are not invalidated by a rerun. Every write goes to a hidden `.<name>.partial` beside its
final name and is renamed into place only once complete, so a run killed at any moment (kill -9 included)
leaves the previous file or the new one, never a torn one; resumable stages delete leftover partials
(eagle3/resume.py).

Ranks on several machines may share one output directory (extract's `--rank R --world-size W`) and start at
different times, so a rank's cleanup must not delete a partial another rank is still writing: the files written
there (`write_bytes`, the shard writer: `open_held`) hold an exclusive flock on their partial until it is
renamed, and the cleanup deletes only the partials nobody holds (`remove_unheld`). The kernel drops a killed
writer's lock; on NFS, Linux maps flock to the server's byte-range locks.
"""

import errno
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from eagle3.errors import Eagle3Error


def read_json(path: Path, missing_hint: str) -> Any:
    """The JSON in `path`; a missing or damaged file is one error naming it (`missing_hint`: how to make it)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Eagle3Error(f"{path.as_posix()}: missing; {missing_hint}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Eagle3Error(f"{path.as_posix()}: not valid JSON ({exc})") from None


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def partial_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.partial")


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield where to write `path` (a file or a directory); on success it is renamed to `path`, on error removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(path)
    _remove(partial)
    try:
        yield partial
    except BaseException:
        _remove(partial)
        raise
    if path.is_dir() and partial.is_dir():
        shutil.rmtree(path)  # os.replace cannot replace a non-empty directory
    os.replace(partial, path)


def open_held(partial: Path) -> BinaryIO:
    """`partial` opened for writing, exclusively flocked until closed: `remove_unheld` leaves it alone. Close it only
    after renaming it into place, so no cleanup can come between.

    A cleanup may delete the file between this open and the lock (it deletes only while holding the lock): a file
    found unlinked once locked is opened again."""
    while True:
        handle = open(partial, "wb")
        fcntl.flock(handle, fcntl.LOCK_EX)
        if os.fstat(handle.fileno()).st_nlink > 0:
            return handle
        handle.close()


@contextmanager
def held_partial(path: Path) -> Iterator[BinaryIO]:
    """`open_held` at `path`'s partial; on success it is renamed to `path`, on error removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(path)
    handle = open_held(partial)
    try:
        yield handle
        handle.flush()
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        handle.close()


def remove_unheld(partial: Path) -> bool:
    """Delete a leftover partial unless a live writer holds it (`held_partial`); whether it was deleted."""
    if partial.is_dir() and not partial.is_symlink():
        shutil.rmtree(partial)  # directories are written by a stage's main process only (checkpoints)
        return True
    try:
        handle = open(partial, "rb")
    except FileNotFoundError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        partial.unlink(missing_ok=True)
        return True


def write_bytes(path: Path, data: bytes) -> None:
    with held_partial(path) as handle:
        handle.write(data)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, data: Any) -> None:
    write_text(path, dumps(data))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """Yield an empty scratch directory beside `out`; on success it replaces `out`, on any error it is deleted.

    A run killed at any point leaves either the previous `out` or the new one, never a mix.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as scratch:
        staging = Path(scratch) / out.name
        staging.mkdir()
        yield staging
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if out.exists():
            os.replace(out, old)
        os.replace(staging, out)
        shutil.rmtree(old, ignore_errors=True)
