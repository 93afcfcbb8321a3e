"""Measure the link to a DVC remote with DVC's own transport, for `eagle3 plan --link-from-remote`.

The probe uploads random bytes (incompressible, like the mantissa plane of hidden states) to
`<remote>/.eagle3-probe/` through the same filesystem object `dvc push` uses, times it, and deletes it: once as one
stream, then split into `jobs` files sent at once, as `dvc push --jobs` does (a long-distance link often carries
several times more in parallel than in one TCP stream).
"""

import os
import socket
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from eagle3.errors import Eagle3Error

DEFAULT_PORTS = {"s3": 443, "ssh": 22, "http": 80, "https": 443}


def _endpoint(url: str, config: dict[str, Any]) -> tuple[str | None, int] | None:
    """Host (None where the URL names none) and port a remote's traffic goes to; None for a local directory."""
    parts = urlsplit(url)
    if parts.scheme in ("", "file", "local"):
        return None
    if parts.scheme == "s3":
        endpoint = urlsplit(config.get("endpointurl") or "https://s3.amazonaws.com")
        return endpoint.hostname, endpoint.port or DEFAULT_PORTS.get(endpoint.scheme, 443)
    return parts.hostname, int(config.get("port") or parts.port or DEFAULT_PORTS.get(parts.scheme, 22))


def measure_upload(
    root: Path, name: str, probe_bytes: int, jobs: int | None = None, connect_timeout: float = 5.0
) -> dict[str, Any]:
    """{single_gbit, parallel_gbit, jobs}: Gbit/s of `probe_bytes` uploaded to DVC remote `name` of the project at
    `root` in one stream, and split over `jobs` streams (default: the remote's, as `dvc push` would use)."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    try:
        repo = Repo(str(root))
    except DvcException as exc:
        raise Eagle3Error(
            f"--link-from-remote {name}: {root} is not a DVC project ({exc}); run it from the project"
        ) from None
    try:
        return _probe(repo, name, probe_bytes, jobs, connect_timeout)
    finally:
        repo.close()


def _probe(repo, name: str, probe_bytes: int, jobs: int | None, connect_timeout: float) -> dict[str, Any]:
    remotes = repo.config.get("remote", {})
    if name not in remotes:
        known = ", ".join(sorted(remotes)) or "none configured"
        raise Eagle3Error(f"--link-from-remote {name}: no such DVC remote ({known}); add one with `dvc remote add`")
    url = remotes[name].get("url", "")
    endpoint = _endpoint(url, remotes[name])
    if endpoint is not None:
        # botocore and asyncssh retry a dead endpoint for up to a minute; a plain connect answers in seconds.
        try:
            socket.create_connection(endpoint, timeout=connect_timeout).close()
        except OSError as exc:
            raise Eagle3Error(
                f"remote {name!r} ({url}) unreachable: {endpoint[0]}:{endpoint[1]}: {exc.strerror or exc}; check the "
                "address and that the server is up"
            ) from None
    try:
        remote = repo.cloud.get_remote(name)
        fs = remote.fs
        jobs = jobs or fs.jobs
        folder = fs.join(remote.path, ".eagle3-probe", uuid.uuid4().hex)
        with tempfile.TemporaryDirectory() as scratch:
            whole = Path(scratch) / "whole"
            whole.write_bytes(os.urandom(probe_bytes))
            pieces = [Path(scratch) / f"piece-{i}" for i in range(jobs)]
            for piece in pieces:
                piece.write_bytes(os.urandom(max(1, probe_bytes // jobs)))
            single = _timed(lambda: fs.put_file(str(whole), fs.join(folder, "whole")))
            targets = [fs.join(folder, piece.name) for piece in pieces]
            parallel = _timed(lambda: fs.put([str(p) for p in pieces], targets, batch_size=jobs))
        fs.rm(folder, recursive=True)
    except Exception as exc:  # any transport's failure (auth, refused, timeout) is the same answer for the user
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise Eagle3Error(
            f"remote {name!r} ({url}) unreachable: {message}; check credentials in .dvc/config.local and the address"
        ) from None
    return {
        "single_gbit": probe_bytes * 8 / 1e9 / single,
        "parallel_gbit": max(1, probe_bytes // jobs) * jobs * 8 / 1e9 / parallel,
        "jobs": jobs,
    }


def _timed(action) -> float:
    start = time.perf_counter()
    action()
    return max(time.perf_counter() - start, 1e-9)
