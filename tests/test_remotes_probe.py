"""DVC remotes against real servers on 127.0.0.1: a local directory, moto's S3 server, and Debian's sshd.

Each test builds a small real DVC project whose one stage writes a few MB of hidden-state shards with
eagle3.shards.ShardWriter, pushes them, kills the server in the middle of a push, restarts it, pushes again,
and checks that a fresh clone pulls shards that verify and that `dvc repro` there has nothing to rebuild."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_in
from servers import S3_KEY_ID, S3_SECRET, MotoS3, Sshd

pytestmark = pytest.mark.slow

SHARDS, SAMPLES_PER_SHARD = 24, 2
MAKE_SHARDS = f'''"""Stage `shards`: deterministic random hidden states in eagle3 shards, {SHARDS} files."""
from pathlib import Path

import torch

from eagle3.formats.shards import ShardMeta, ShardWriter

out = Path("shards")
out.mkdir(exist_ok=True)
generator = torch.Generator().manual_seed(0)
meta = ShardMeta(verifier="test", layer_ids=(2, 15, 27, 30), hidden_size=256, tokenizer_sha256="0" * 64)
for shard in range({SHARDS}):
    with ShardWriter(out / f"shard-{{shard:03d}}.e3sh", meta) as writer:
        for sample in range({SAMPLES_PER_SHARD}):
            tokens = 128
            hidden = (torch.randn(4, tokens, 256, generator=generator) * 3).to(torch.bfloat16)
            ids = torch.randint(0, 49152, (tokens,), generator=generator)
            writer.add(f"s{{shard}}-{{sample}}", ids, torch.rand(tokens, generator=generator) > 0.3, hidden)
'''
DVC_YAML = "stages:\n  shards:\n    cmd: python make_shards.py\n    deps: [make_shards.py]\n    outs: [shards]\n"


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {
        **env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        # A HOME of the test's own: no ~/.aws, ~/.ssh or global DVC/git config leaks in; credentials come only
        # from .dvc/config.local.
        "HOME": str(home),
        "AWS_CONFIG_FILE": str(home / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-aws-credentials"),
        "GIT_AUTHOR_NAME": "eagle3",
        "GIT_AUTHOR_EMAIL": "eagle3@localhost",
        "GIT_COMMITTER_NAME": "eagle3",
        "GIT_COMMITTER_EMAIL": "eagle3@localhost",
        "DVC_NO_ANALYTICS": "1",
    }


def _digests(shards: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(shards.glob("*.e3sh"))}


def _verify_shards(shards: Path, expected: dict[str, str]) -> None:
    """Byte-identical to what was pushed, and every record's checksum holds when read back."""
    from eagle3.formats.shards import ShardReader

    assert _digests(shards) == expected
    for path in sorted(shards.glob("*.e3sh")):
        reader = ShardReader(path)
        assert len(reader) == SAMPLES_PER_SHARD
        for position in range(len(reader)):
            assert reader.read(position).hidden.shape == (4, 128, 256)
        reader.close()


def _not_in_remote(root: Path, env: dict) -> list[str]:
    status = json.loads(
        run_in(root, "dvc", "data", "status", "--not-in-remote", "--granular", "--json", env=env).stdout
    )
    return status.get("not_in_remote", [])


def _project(root: Path, env: dict) -> dict[str, str]:
    """A git + DVC project whose stage has run; returns the sha256 of each shard."""
    root.mkdir(parents=True)
    (root / "make_shards.py").write_text(MAKE_SHARDS)
    (root / "dvc.yaml").write_text(DVC_YAML)
    run_in(root, "git", "init", "-q", env=env)
    run_in(root, "dvc", "init", "-q", env=env)
    # Hardlink first: DVC 3 links an output into the cache only when the first type is hardlink; with reflink
    # first on a filesystem without reflinks (ext4) it copies the output into the cache and keeps both.
    run_in(root, "dvc", "config", "--local", "cache.type", "hardlink,symlink", env=env)
    run_in(root, "dvc", "repro", env=env)
    run_in(root, "git", "add", "-A", env=env)
    run_in(root, "git", "commit", "-qm", "shards", env=env)
    return _digests(root / "shards")


def _push_killed_midway(root: Path, env: dict, server, objects_on_server) -> None:
    """Start a push, SIGKILL the server once some but not all objects have arrived; the push must fail."""
    total = SHARDS + 1  # the shards plus the directory's .dir listing
    push = subprocess.Popen(
        ["dvc", "push", "--jobs", "1"], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 60
    while objects_on_server() < 1 and push.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    arrived = objects_on_server()
    server.kill()
    output, _ = push.communicate(timeout=300)
    assert 1 <= arrived < total, (
        f"the kill did not land mid-transfer ({arrived} of {total} objects had arrived):\n{output}"
    )
    assert push.returncode != 0, f"a push whose server died reported success:\n{output}"


def _clone_pull_repro(
    root: Path, clone: Path, env: dict, digests: dict[str, str], local_config: list[list[str]]
) -> None:
    run_in(root.parent, "git", "clone", "-q", str(root), str(clone), env=env)
    assert not (clone / "shards").exists() and not (clone / ".dvc" / "config.local").exists()
    for setting in local_config:  # a fresh clone brings no credentials: each machine sets its own
        run_in(clone, "dvc", "remote", "modify", "--local", *setting, env=env)
    run_in(clone, "dvc", "pull", env=env)
    _verify_shards(clone / "shards", digests)
    repro = run_in(clone, "dvc", "repro", env=env).stdout
    assert "Running stage" not in repro and "Data and pipelines are up to date" in repro, repro
    assert _not_in_remote(clone, env) == []


def test_local_remote_roundtrip_and_link_type(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = _env(home)
    root = tmp_path / "project"
    digests = _project(root, env)

    # The output and its cache entry are one inode, so a TB-scale output is never stored twice; DVC makes it
    # read-only so that nothing edits the cache through it.
    cache = root / ".dvc" / "cache" / "files" / "md5"
    for shard in (root / "shards").iterdir():
        assert shard.stat().st_nlink == 2 and not shard.stat().st_mode & 0o222
        assert sum(1 for p in cache.rglob("*") if p.is_file() and p.stat().st_ino == shard.stat().st_ino) == 1

    storage = tmp_path / "storage"
    run_in(root, "dvc", "remote", "add", "-d", "local", str(storage), env=env)
    assert len(_not_in_remote(root, env)) == SHARDS + 1
    run_in(root, "dvc", "push", "--jobs", "4", env=env)
    assert _not_in_remote(root, env) == []
    run_in(root, "git", "commit", "-qam", "remote", env=env)
    _clone_pull_repro(root, tmp_path / "clone", env, digests, [])


def test_s3_remote_survives_a_killed_server(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = _env(home)
    root = tmp_path / "project"
    digests = _project(root, env)
    server = MotoS3(tmp_path / "moto").start()
    try:
        run_in(root, "dvc", "remote", "add", "-d", "s3", f"s3://{MotoS3.bucket}/eagle3", env=env)
        run_in(root, "dvc", "remote", "modify", "s3", "endpointurl", server.endpoint, env=env)
        run_in(root, "dvc", "remote", "modify", "--local", "s3", "access_key_id", S3_KEY_ID, env=env)
        run_in(root, "dvc", "remote", "modify", "--local", "s3", "secret_access_key", S3_SECRET, env=env)
        run_in(root, "git", "commit", "-qam", "s3 remote", env=env)
        # Secrets only in the git-ignored config.local, never in what git records.
        committed = run_in(root, "git", "show", "HEAD:.dvc/config", env=env).stdout
        assert server.endpoint in committed and S3_SECRET not in committed and S3_KEY_ID not in committed
        assert S3_SECRET in (root / ".dvc" / "config.local").read_text()
        run_in(root, "git", "check-ignore", "-q", ".dvc/config.local", env=env)
        assert len(_not_in_remote(root, env)) == SHARDS + 1

        # The server dies as it stores the 5th object. botocore retries a refused connection with backoff for ~50 s
        # before giving up; one attempt is enough here.
        server.kill()
        server.dies_after_objects(5).start()
        push = run_in(root, "dvc", "push", "--jobs", "1", check=False, env={**env, "AWS_MAX_ATTEMPTS": "1"})
        assert push.returncode != 0, f"a push whose server died reported success:\n{push.stdout}{push.stderr}"
        assert server.process.wait(timeout=60) == -signal.SIGKILL
        server.kill()
        server.dies_after_objects(None).start()  # same port; moto keeps objects in memory: the bucket is empty
        run_in(root, "dvc", "push", "--jobs", "4", env=env)
        assert server.object_count() == SHARDS + 1
        assert _not_in_remote(root, env) == []

        _clone_pull_repro(
            root,
            tmp_path / "clone",
            env,
            digests,
            [["s3", "access_key_id", S3_KEY_ID], ["s3", "secret_access_key", S3_SECRET]],
        )
    finally:
        server.kill()


def test_ssh_remote_survives_a_killed_server(tmp_path):
    server = Sshd(tmp_path / "sshd")
    env = _env(server.home())
    root = tmp_path / "project"
    digests = _project(root, env)
    storage = tmp_path / "ssh-storage"
    server.start()
    try:
        run_in(
            root, "dvc", "remote", "add", "-d", "ssh", f"ssh://{server.user}@127.0.0.1:{server.port}{storage}", env=env
        )
        run_in(root, "dvc", "remote", "modify", "--local", "ssh", "keyfile", str(server.client_key), env=env)
        run_in(root, "git", "commit", "-qam", "ssh remote", env=env)
        assert str(server.client_key) not in run_in(root, "git", "show", "HEAD:.dvc/config", env=env).stdout

        def objects_on_server() -> int:
            return sum(1 for p in storage.rglob("*") if p.is_file() and not p.name.startswith("."))

        _push_killed_midway(root, env, server, objects_on_server)
        server.start()  # the files sshd had received, a partial one included, are still on disk
        run_in(root, "dvc", "push", "--jobs", "4", env=env)
        assert _not_in_remote(root, env) == []
        # What the server holds under object names is exactly the cache: dvc-ssh uploads to `.<random>.tmp` and
        # renames, so a kill can leave a temporary file behind but never a damaged object.
        cache = root / ".dvc" / "cache" / "files" / "md5"
        remote = storage / "files" / "md5"
        held = {
            p.relative_to(remote): p.read_bytes()
            for p in remote.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        }
        assert held == {p.relative_to(cache): p.read_bytes() for p in cache.rglob("*") if p.is_file()}
        assert all(p.name.endswith(".tmp") for p in remote.rglob(".*") if p.is_file())

        _clone_pull_repro(root, tmp_path / "clone", env, digests, [["ssh", "keyfile", str(server.client_key)]])
    finally:
        server.kill()


def _repair(root: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return run_in(root, sys.executable, "-m", "eagle3.cli", "repair", *args, check=False, env=env)


class _Storage:
    """A remote's objects, read and written behind DVC's back: a local directory, or a bucket on moto's S3."""

    def __init__(self, kind: str, tmp_path: Path):
        self.kind, self.tmp_path, self.server = kind, tmp_path, None

    def configure(self, root: Path, env: dict) -> list[list[str]]:
        """Adds the remote `store` to the project; returns the --local settings a clone needs."""
        if self.kind == "local":
            run_in(root, "dvc", "remote", "add", "-d", "store", str(self.tmp_path / "storage"), env=env)
            return []
        self.server = MotoS3(self.tmp_path / "moto").start()
        run_in(root, "dvc", "remote", "add", "-d", "store", f"s3://{MotoS3.bucket}/eagle3", env=env)
        run_in(root, "dvc", "remote", "modify", "store", "endpointurl", self.server.endpoint, env=env)
        secrets = [["store", "access_key_id", S3_KEY_ID], ["store", "secret_access_key", S3_SECRET]]
        for setting in secrets:
            run_in(root, "dvc", "remote", "modify", "--local", *setting, env=env)
        return secrets

    def read(self, md5: str) -> bytes:
        if self.kind == "local":
            return (self.tmp_path / "storage/files/md5" / md5[:2] / md5[2:]).read_bytes()
        return (
            self.server.client()
            .get_object(Bucket=MotoS3.bucket, Key=f"eagle3/files/md5/{md5[:2]}/{md5[2:]}")["Body"]
            .read()
        )

    def write(self, md5: str, data: bytes) -> None:
        if self.kind == "local":
            path = self.tmp_path / "storage/files/md5" / md5[:2] / md5[2:]
            path.chmod(0o644)
            path.write_bytes(data)
        else:
            self.server.client().put_object(
                Bucket=MotoS3.bucket, Key=f"eagle3/files/md5/{md5[:2]}/{md5[2:]}", Body=data
            )


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_corruption_in_the_remote_is_named_and_repaired(tmp_path, kind):
    home = tmp_path / "home"
    home.mkdir()
    env = _env(home)
    root = tmp_path / "project"
    digests = _project(root, env)
    storage = _Storage(kind, tmp_path)
    try:
        _corrupted_then_repaired(tmp_path, env, root, digests, storage, storage.configure(root, env))
    finally:
        if storage.server is not None:
            storage.server.kill()


def _clone(tmp_path: Path, env: dict, root: Path, name: str, secrets: list[list[str]]) -> Path:
    clone = tmp_path / name
    run_in(tmp_path, "git", "clone", "-q", str(root), str(clone), env=env)
    for setting in secrets:
        run_in(clone, "dvc", "remote", "modify", "--local", *setting, env=env)
    return clone


def _corrupted_then_repaired(tmp_path, env, root, digests, storage, secrets):
    run_in(root, "git", "commit", "-qam", "remote", env=env)
    run_in(root, "dvc", "push", env=env)
    damaged = "shards/shard-005.e3sh"
    md5 = hashlib.md5((root / damaged).read_bytes()).hexdigest()
    flipped = bytearray(storage.read(md5))
    flipped[1000:1016] = bytes(b ^ 0xFF for b in flipped[1000:1016])
    storage.write(md5, bytes(flipped))
    lost = (
        f"eagle3 repair: error: {damaged}: no intact copy in the workspace, cache or remote 'store' (the bad ones "
        "here are removed); remake them with `dvc repro` (stage shards; a resumable stage remakes only the missing "
        "files), then run `eagle3 repair shards` again to put them in the cache and remote"
    )

    # With the remote's verify, DVC's pull stops naming only the directory and checks out none of it; repair names
    # the file and checks out the rest.
    verifying = _clone(tmp_path, env, root, "verifying", secrets)
    run_in(verifying, "dvc", "remote", "modify", "--local", "store", "verify", "true", env=env)
    assert run_in(verifying, "dvc", "pull", check=False, env=env).returncode != 0
    assert not (verifying / "shards").exists()
    named = _repair(verifying, env, "shards")
    assert named.returncode == 2 and named.stderr.strip().splitlines()[-1] == lost, named.stderr
    assert sorted(_digests(verifying / "shards").items()) == sorted(
        (name, digest) for name, digest in digests.items() if name != "shard-005.e3sh"
    )

    # Without it, the pull lands the bad bytes in the cache under their good name and DVC sees nothing wrong.
    plain = _clone(tmp_path, env, root, "plain", secrets)
    run_in(plain, "dvc", "pull", env=env)
    cached = plain / ".dvc/cache/files/md5" / md5[:2] / md5[2:]
    assert hashlib.md5(cached.read_bytes()).hexdigest() != md5
    assert "up to date" in run_in(plain, "dvc", "status", env=env).stdout
    named = _repair(plain, env, damaged)
    assert named.returncode == 2 and named.stderr.strip().splitlines()[-1] == lost.replace(
        "repair shards` again", f"repair {damaged}` again"
    )
    assert f"{damaged}: cache: corrupt, removed" in named.stderr
    assert not cached.exists() and not (plain / damaged).exists()

    # The stage remakes the file, byte for byte; `dvc push` alone keeps the remote's bad copy, repair replaces it.
    run_in(plain, "dvc", "repro", env=env)
    assert run_in(plain, "git", "status", "--porcelain", env=env).stdout == ""
    assert "Everything is up to date" in run_in(plain, "dvc", "push", env=env).stdout
    fixed = _repair(plain, env, "shards")
    assert fixed.returncode == 0, fixed.stderr
    assert f"{damaged}: remote 'store': corrupt, replaced" in fixed.stderr
    assert f"{SHARDS} files checked in the workspace, cache and remote 'store': 1 repaired, 0 lost" in fixed.stderr
    assert hashlib.md5(storage.read(md5)).hexdigest() == md5

    # The first clone, repaired: the file its pull refused arrives intact, every copy checks, nothing re-runs.
    again = _repair(verifying, env, "shards")
    assert (
        again.returncode == 0 and f"{damaged}: cache: missing, restored; workspace: missing, restored" in again.stderr
    )
    _verify_shards(verifying / "shards", digests)
    assert "Data and pipelines are up to date" in run_in(verifying, "dvc", "status", env=env).stdout
    assert "0 repaired, 0 lost" in _repair(verifying, env, "shards").stderr
    if storage.server is not None:  # a remote that does not answer: one line, not a transport's traceback
        storage.server.kill()
        unreachable = _repair(verifying, {**env, "AWS_MAX_ATTEMPTS": "1"}, "shards/shard-000.e3sh")
        last = unreachable.stderr.strip().splitlines()[-1]
        assert unreachable.returncode == 2 and "Traceback" not in unreachable.stderr, unreachable.stderr
        assert last.startswith("eagle3 repair: error: shards/shard-000.e3sh: ") and "check remote 'store'" in last


def _remote_kinds() -> list[tuple[str, str, str]]:
    """docs/hero-run.md's table of remote kinds: (kind, the URL its `dvc remote add` takes, its credential line)."""
    from conftest import REPO

    lines = (REPO / "docs/hero-run.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| remote | `dvc remote add -d store ...` |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        kind, url, credentials = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append((kind, url.strip("`"), credentials.strip("`")))
    return rows


@pytest.mark.parametrize("kind, url, credentials", _remote_kinds(), ids=[row[0] for row in _remote_kinds()])
def test_each_remote_kind_the_runbook_offers_takes_its_own_credential_line(tmp_path, kind, url, credentials):
    """The runbook's alternatives run as written: each kind of remote added, its credential line set with --local,
    and DVC still reads its configuration (an S3 option on an SSH remote made every later DVC command fail)."""
    env = _env(tmp_path / "home")
    root = tmp_path / "project"
    root.mkdir()
    run_in(root, "git", "init", "-q", env=env)
    run_in(root, "dvc", "init", "-q", env=env)
    run_in(root, "dvc", "remote", "add", "-d", "store", url, env=env)
    run_in(root, "dvc", "remote", "modify", "store", "verify", "true", env=env)
    if credentials != "none":
        option, value = credentials.split(" ", 1)
        run_in(root, "dvc", "remote", "modify", "--local", "store", option, value.replace("~", str(tmp_path)), env=env)
    assert run_in(root, "dvc", "remote", "list", env=env).stdout.split() == ["store", url, "(default)"]
    assert "remote.store.verify=true" in run_in(root, "dvc", "config", "--list", env=env).stdout
    assert (root / ".dvc" / "config.local").exists() == (credentials != "none")
    if kind == "SSH":
        # The S3 line on an SSH remote (what the runbook's single line had every user run) is refused.
        s3_line = ("credentialpath", str(tmp_path / "credentials"))
        failed = run_in(root, "dvc", "remote", "modify", "--local", "store", *s3_line, check=False, env=env)
        assert failed.returncode != 0 and "extra keys not allowed" in failed.stderr
