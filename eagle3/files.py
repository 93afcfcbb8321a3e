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
import stat
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


def read_report_json(path: Path, what: str, fix: str, limit: int = 16_000_000) -> Any:
    """The JSON in a file another tool or machine made (a preflight report, metrics): a regular file of at most
    `limit` bytes, with no NaN or Infinity (which no figure may be); anything else is one error naming the file.
    FileNotFoundError is left to the caller, which knows how the file is made."""
    try:
        status = os.stat(path)
        if not stat.S_ISREG(status.st_mode):
            raise Eagle3Error(f"{path}: not a regular file, so not {what}; {fix}")
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise Eagle3Error(f"{path}: cannot read it ({exc.strerror or exc}); {fix}") from None
    if len(data) > limit:
        raise Eagle3Error(f"{path}: more than {limit:,} bytes, far more than {what} holds; {fix}")

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a number a figure may be")

    try:
        return json.loads(data.decode("utf-8"), parse_constant=no_constant)
    except RecursionError:
        raise Eagle3Error(f"{path}: nested too deeply to be {what}; {fix}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise Eagle3Error(f"{path}: not {what} ({str(exc).splitlines()[0]}); {fix}") from None


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def is_disk_full(exc: BaseException) -> bool:
    """An OS error for a full disk or quota, or a library's wrapping of one (safetensors raises its own type)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    # pyarrow and safetensors carry the OS error in their message only.
    return "No space left on device" in str(exc) or "os error 28" in str(exc)


def disk_full_message(path: Path, needed: int | None = None) -> str:
    """One line for a full disk while writing `path`: how much it needed (where known) and how much is free."""
    place = path
    while not place.exists() and place != place.parent:
        place = place.parent
    free = shutil.disk_usage(place).free
    need = f"it needs {needed:,} bytes, " if needed is not None else ""
    return (
        f"{path}: no space left on the device ({need}{free:,} bytes free there); free space or move the output to a "
        "larger volume (a symlink to it works), then rerun: finished work is kept"
    )


@contextmanager
def space_for(path: Path, needed: int | None = None) -> Iterator[None]:
    """A full disk while writing `path` becomes one Eagle3Error line (`disk_full_message`)."""
    try:
        yield
    except Exception as exc:
        if is_disk_full(exc):
            raise Eagle3Error(disk_full_message(path, needed)) from None
        raise


def partial_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.partial")


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield where to write `path` (a file or a directory); on success it is renamed to `path`, on error removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(path)
    _remove(partial)
    try:
        with space_for(path):
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
    with space_for(path, len(data)), held_partial(path) as handle:
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


def output_dir(out: Path) -> Path:
    """Where an output directory's files really are: `out` itself, or the directory a symlink at `out` points to
    (an output put on another volume), which must exist; a mount point at `out` is `out`."""
    if out.is_symlink():
        target = out.resolve()
        if not target.is_dir():
            raise Eagle3Error(
                f"{out} links to {target}, which is not a directory; create it (or remove the link to keep the output "
                "in the project)"
            )
        return target
    return out


def empty_dir(out: Path) -> None:
    """Remove everything inside `out` but `out` itself, which may be a symlink to, or a mount of, another volume."""
    out = output_dir(out)
    if not out.exists():
        return
    for entry in out.iterdir():
        _remove(entry)


@contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """Yield an empty scratch directory beside `out`; on success it replaces `out`, on any error it is deleted.

    A run killed at any point leaves either the previous `out` or the new one, never a mix. Where `out` links to
    another volume, the link stays and its target is replaced, staged beside the target. Where `out` is a mount
    point, which cannot be renamed, the scratch is inside it and its entries are swapped in one by one after the old
    ones are moved aside: a kill in between leaves them under hidden names that the next run removes.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    out = output_dir(out)
    if out.is_mount():
        with _staged_in_mount(out) as staging:
            yield staging
        return
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


_MOUNT_STAGING, _MOUNT_OLD = ".eagle3-staging", ".eagle3-old"


@contextmanager
def _staged_in_mount(out: Path) -> Iterator[Path]:
    for leftover in (_MOUNT_STAGING, _MOUNT_OLD):
        _remove(out / leftover)
    staging = out / _MOUNT_STAGING
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        _remove(staging)
        raise
    old = out / _MOUNT_OLD
    old.mkdir()
    for entry in out.iterdir():
        if entry.name not in (_MOUNT_STAGING, _MOUNT_OLD):
            os.replace(entry, old / entry.name)
    for entry in staging.iterdir():
        os.replace(entry, out / entry.name)
    _remove(staging)
    _remove(old)
