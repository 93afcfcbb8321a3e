"""`eagle3 repair OUTPUT...`: every copy of a pipeline output (the workspace, the DVC cache, a DVC remote) checked
against the hashes dvc.lock records, and each bad or missing copy restored from a good one.

Why DVC alone cannot: it names an object by the hash the file should have and, unless the remote has
`verify true`, never re-hashes what it pulls. Bytes damaged in the remote land in the cache under their good name;
`dvc push` finds the name in the remote and leaves the bad bytes there, and `dvc checkout` brings them back. With
`verify true` the pull stops, naming only the whole output directory, and checks none of it out.

Here each copy is hashed (the remote's by reading it back, so checking a whole output reads all of it: name one
file inside a directory output to check only that). A file with a good copy anywhere gets it everywhere else. A
file with none has its bad copies removed, so that DVC cannot bring them back and its stage remakes it (the
resumable stages remake only what is missing); this command, run again, then puts the remade file into the cache
and the remote, provided it has the bytes dvc.lock records.
"""

import argparse
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3.errors import Eagle3Error
from eagle3.files import disk_full_message, is_disk_full
from eagle3.progress import console, progress
from eagle3.publish.dvc_graph import covers, load_pipeline, norm_path

if TYPE_CHECKING:
    from dvc_data.hashfile.db import HashFileDB

_CHUNK = 8 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "outputs",
        nargs="+",
        type=Path,
        help="outputs as dvc.lock names them (data/hidden), or files inside one (data/hidden/train/shard-00003...)",
    )
    parser.add_argument("--remote", help="DVC remote to check and repair (default: the project's default remote)")
    parser.add_argument("--no-remote", action="store_true", help="check and repair only the workspace and cache")


@dataclass(frozen=True)
class TrackedFile:
    path: str  # relative to the project root, as the user names it
    md5: str
    stage: str


@dataclass
class Copies:
    """What each copy of one file holds: True good, False bad, None absent (or not checked)."""

    workspace: bool | None
    cache: bool | None
    remote: bool | None


def _md5(handle) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    while chunk := handle.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _local_md5(path: Path) -> str | None:
    if not path.is_file():
        return None
    with open(path, "rb") as handle:
        return _md5(handle)


class Store:
    """The project's DVC repository: its cache, and the remote being checked (None with --no-remote)."""

    def __init__(self, root: Path, remote: str | None, use_remote: bool):
        from dvc.exceptions import DvcException
        from dvc.repo import Repo

        try:
            self.repo = Repo(str(root))
        except DvcException as exc:
            raise Eagle3Error(f"{root} is not a DVC project ({exc}); run eagle3 repair in the project") from None
        self.cache: HashFileDB = self.repo.cache.local
        self.remote_name: str | None = None
        self.remote: HashFileDB | None = None
        if use_remote:
            remotes = self.repo.config.get("remote", {})
            name = remote or self.repo.config["core"].get("remote")
            if not name:
                raise Eagle3Error("no DVC remote named and no default remote: pass --remote NAME, or --no-remote")
            if name not in remotes:
                known = ", ".join(sorted(remotes)) or "none configured"
                raise Eagle3Error(f"--remote {name}: no such DVC remote ({known}); add one with `dvc remote add`")
            self.remote_name = name
            try:
                self.remote = self.repo.cloud.get_remote_odb(name, "repair")
            except DvcException as exc:
                raise Eagle3Error(f"remote {name!r}: {exc}") from None

    def close(self) -> None:
        self.repo.close()

    def cache_path(self, md5: str) -> Path:
        return Path(self.cache.oid_to_path(md5))

    def _checked_remote(self) -> "HashFileDB":
        """The remote being checked; only asked for where there is one (not under --no-remote)."""
        if self.remote is None:
            raise RuntimeError("no remote is being checked (--no-remote)")
        return self.remote

    def remote_md5(self, md5: str) -> str | None:
        remote = self._checked_remote()
        path = remote.oid_to_path(md5)
        try:
            with remote.fs.open(path, "rb") as handle:
                return _md5(handle)
        except FileNotFoundError:
            return None

    def manifest(self, md5: str, output: str) -> list[dict]:
        """A directory output's listing (DVC's .dir object), from whichever copy is intact."""
        cached = self.cache_path(md5)
        if _local_md5(cached) != md5.removesuffix(".dir") and self.remote is not None:
            try:
                self.fetch_into_cache(md5)
            except (FileNotFoundError, Eagle3Error):
                pass
        if _local_md5(cached) == md5.removesuffix(".dir"):
            return json.loads(cached.read_bytes())
        where = f"the cache or remote {self.remote_name!r}" if self.remote is not None else "the cache"
        raise Eagle3Error(
            f"{output}: the listing of its files ({md5}) is in neither {where} intact; `dvc push` it from the machine "
            "that made it, or remake it with `dvc repro`"
        )

    def _into_cache(self, md5: str, write) -> None:
        target = self.cache_path(md5)
        target.parent.mkdir(parents=True, exist_ok=True)
        # Beside its final name, renamed into place: no reader ever sees a partial object.
        partial = target.with_name(f".{target.name}.repair")
        try:
            write(partial)
            if _local_md5(partial) != md5.removesuffix(".dir"):
                raise Eagle3Error(f"{target}: the copy changed while it was read; run eagle3 repair again")
            os.chmod(partial, 0o444)  # DVC keeps cache objects read-only
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)

    def put_in_cache(self, source: Path, md5: str) -> None:
        self._into_cache(md5, lambda partial: shutil.copyfile(source, partial))

    def fetch_into_cache(self, md5: str) -> None:
        remote = self._checked_remote()
        self._into_cache(md5, lambda partial: remote.fs.get_file(remote.oid_to_path(md5), str(partial)))

    def put_in_remote(self, source: Path, md5: str) -> None:
        remote = self._checked_remote()
        remote.fs.put_file(str(source), remote.oid_to_path(md5))

    def check_out(self, md5: str, path: Path) -> None:
        """The cache object at `path`, linked as the project's cache.type says (in its order), else copied."""
        path.parent.mkdir(parents=True, exist_ok=True)
        types = self.repo.config["cache"].get("type") or ["reflink", "copy"]
        link: dict[str, Callable[[Path, Path], object]] = {"hardlink": os.link, "symlink": os.symlink}
        for kind in [types] if isinstance(types, str) else types:
            try:
                link.get(kind, shutil.copyfile)(self.cache_path(md5), path)
                return
            except OSError:
                continue
        shutil.copyfile(self.cache_path(md5), path)


def tracked_files(root: Path, names: list[Path], store: Store) -> list[TrackedFile]:
    """The files dvc.lock records under each name (an output, or a file inside a directory output)."""
    _, locked = load_pipeline(root)
    outputs = {
        norm_path(out["path"]): (stage, out)
        for stage, entry in locked.items()
        for out in entry.get("outs") or []
        if isinstance(out, dict) and "path" in out
    }
    files: list[TrackedFile] = []
    for name in names:
        wanted = norm_path(str(name.resolve().relative_to(root.resolve())) if name.is_absolute() else str(name))
        owner = next((path for path in outputs if covers(path, wanted)), None)
        if owner is None:
            known = ", ".join(sorted(outputs)) or "none: run `dvc repro` first"
            raise Eagle3Error(f"{wanted}: not an output dvc.lock records, nor inside one (outputs: {known})")
        stage, out = outputs[owner]
        if out.get("hash", "md5") != "md5" or "md5" not in out:
            raise Eagle3Error(f"dvc.lock: {owner} has no DVC 3 md5 hash; run `dvc repro` with this DVC to re-record it")
        if not out["md5"].endswith(".dir"):
            files.append(TrackedFile(owner, out["md5"], stage))
            continue
        for item in store.manifest(out["md5"], owner):
            path = f"{owner}/{item['relpath']}"
            if covers(wanted, path):
                files.append(TrackedFile(path, item["md5"], stage))
        if not any(covers(wanted, f.path) for f in files):
            raise Eagle3Error(f"{wanted}: dvc.lock records no file there in {owner}")
    return files


def _inspect(root: Path, file: TrackedFile, store: Store) -> Copies:
    workspace, cached = root / file.path, store.cache_path(file.md5)
    held = _local_md5(workspace)
    same_inode = workspace.is_file() and cached.is_file() and os.path.samefile(workspace, cached)
    cache_md5 = held if same_inode else _local_md5(cached)
    remote_md5 = store.remote_md5(file.md5) if store.remote is not None else None
    return Copies(
        workspace=None if held is None else held == file.md5,
        cache=None if cache_md5 is None else cache_md5 == file.md5,
        remote=None if store.remote is None or remote_md5 is None else remote_md5 == file.md5,
    )


def _repair(root: Path, file: TrackedFile, copies: Copies, store: Store) -> list[str]:
    """Restores every copy from a good one; returns what it did. Without a good copy, removes the bad ones."""
    workspace, cached = root / file.path, store.cache_path(file.md5)
    done: list[str] = []
    if copies.cache is not True:
        if copies.workspace:
            store.put_in_cache(workspace, file.md5)
        elif copies.remote:
            store.fetch_into_cache(file.md5)
        elif copies.cache is False:
            cached.unlink()
            done.append("cache: corrupt, removed")
        if copies.workspace or copies.remote:
            done.append("cache: " + ("corrupt, replaced" if copies.cache is False else "missing, restored"))
    good_here = copies.workspace or copies.cache or copies.remote
    if copies.workspace is not True:
        if workspace.is_file() or workspace.is_symlink():
            workspace.unlink()
        if good_here:
            store.check_out(file.md5, workspace)
            done.append("workspace: " + ("corrupt, replaced" if copies.workspace is False else "missing, restored"))
        elif copies.workspace is False:
            done.append("workspace: corrupt, removed")
    if store.remote is not None and copies.remote is not True and good_here:
        store.put_in_remote(cached, file.md5)
        done.append(f"remote {store.remote_name!r}: " + ("corrupt, replaced" if copies.remote is False else "uploaded"))
    return done


def _failure(file: TrackedFile, exc: Exception, remote: str | None) -> str:
    if is_disk_full(exc):
        return disk_full_message(Path(getattr(exc, "filename", None) or file.path))
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    where = f"; check remote {remote!r}'s address and credentials (.dvc/config.local)" if remote else ""
    return f"{file.path}: {message}{where}; what was repaired before it stays repaired: run eagle3 repair again"


def main(args: argparse.Namespace, root: Path) -> int:
    store = Store(root, args.remote, not args.no_remote)
    try:
        files = tracked_files(root, args.outputs, store)
        where = "workspace, cache" + (f" and remote {store.remote_name!r}" if store.remote is not None else "")
        unrecoverable: list[TrackedFile] = []
        repaired = 0
        with progress() as bar:
            task = bar.add_task(f"repair: checking {where}", total=len(files))
            for file in files:
                try:
                    copies = _inspect(root, file, store)
                    done = _repair(root, file, copies, store)
                except Eagle3Error:
                    raise
                except Exception as exc:  # any transport's or filesystem's failure: what, where, and rerun
                    raise Eagle3Error(_failure(file, exc, store.remote_name)) from None
                if done:
                    repaired += 1
                    bar.console.print(f"{file.path}: {'; '.join(done)}")
                if not (copies.workspace or copies.cache or copies.remote):
                    unrecoverable.append(file)
                bar.advance(task)
    finally:
        store.close()
    console.print(f"repair: {len(files)} files checked in the {where}: {repaired} repaired, {len(unrecoverable)} lost")
    if unrecoverable:
        stages = sorted({file.stage for file in unrecoverable})
        anywhere = where.replace(" and ", " or ")
        names = ", ".join(file.path for file in unrecoverable[:5]) + (" ..." if len(unrecoverable) > 5 else "")
        raise Eagle3Error(
            f"{names}: no intact copy in the {anywhere} (the bad ones here are removed); remake them with `dvc repro` "
            f"(stage {', '.join(stages)}; a resumable stage remakes only the missing files), then run "
            f"`eagle3 repair {' '.join(str(name) for name in args.outputs)}` again to put them in the cache and remote"
        )
    return 0
