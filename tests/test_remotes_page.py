"""docs/remotes.md as a user types it: every `dvc` command of its shell blocks, run from the page in a fresh DVC
project (nothing contacts the remotes it names), leaves each remote where the page says: URLs and options in the
committed .dvc/config, credentials only in the git-ignored config.local, DVC still reading both."""

import re
import shlex
import subprocess
from pathlib import Path

from test_remotes_probe import _env

from conftest import REPO, run_in

PAGE = REPO / "docs" / "remotes.md"


def _dvc_commands() -> list[list[str]]:
    """Every `dvc ...` line of the page's bash blocks, in order, comments dropped; `eagle3 repair` and `dvc repro`
    (the repair flow, which tests/test_remotes_probe.py runs against damaged remotes) left out."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", PAGE.read_text(), flags=re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["dvc"] and words[1:2] != ["repro"]:
                commands.append(words)
    return commands


def _config(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_the_remotes_page_runs_as_written(tmp_path):
    env = _env(tmp_path / "home")
    root = tmp_path / "project"
    root.mkdir()
    run_in(root, "git", "init", "-q", env=env)
    run_in(root, "dvc", "init", "-q", env=env)
    commands = _dvc_commands()
    assert [" ".join(c[:3]) for c in commands if c[1] == "remote" and c[2] == "add"] == ["dvc remote add"] * 3
    for words in commands:
        run_in(root, *words, env=env)
    # The page's advice in prose, on every remote it added.
    names = [c[-2] for c in commands if c[1:3] == ["remote", "add"]]
    for name in names:
        run_in(root, "dvc", "remote", "modify", name, "verify", "true", env=env)
    listed = run_in(root, "dvc", "remote", "list", env=env).stdout.split()
    assert listed[::2][:3] == names == ["nas", "store", "gpu"] and listed[-1] == "(default)"
    committed, local = _config(root / ".dvc" / "config"), _config(root / ".dvc" / "config.local")
    assert "AKIA" not in committed and "keyfile" not in committed and "secret_access_key" not in committed
    assert "access_key_id = AKIA..." in local and "keyfile = ~/.ssh/id_ed25519" in local
    assert "endpointurl = https://minio.example.com:9000" in committed
    listing = set(run_in(root, "dvc", "config", "--list", env=env).stdout.split())
    assert {f"remote.{name}.verify=true" for name in names} | {"cache.type=hardlink,symlink"} <= listing
    ignored = subprocess.run(["git", "check-ignore", ".dvc/config.local"], cwd=root, env=env)
    assert ignored.returncode == 0
