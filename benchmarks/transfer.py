"""Moving hidden-state shards: `dvc push` / `dvc pull` vs a plain copy of the same bytes to the same server.

    python benchmarks/transfer.py [--mb 256] [--shard-mb 32] [--jobs 1 4 16] [--servers s3 ssh] [--root PROJECT]

Takes real samples from the project's data/hidden shards (`dvc repro extract` or `dvc pull data/hidden` first)
and re-shards them into --shard-mb files until --mb MB, tracked by `dvc add` in a scratch DVC project. Starts
moto's S3 server and Debian's sshd on 127.0.0.1 (tests/servers.py), then, for each --jobs value, times in this one
process:
  - dvc push --jobs J to an empty location on the server, and dvc pull --jobs J of it into an empty cache;
  - the plain copy: boto3 upload_file / download_file of the same files on J threads (S3), or one
    `scp -r` each way (SSH, same cipher as DVC's: aes128-gcm, no compression).
Prints MB/s, effective Gbit/s and dvc/plain ratios. On 127.0.0.1 the servers, not a wire, set the pace: use the
ratios, and `eagle3 plan --link-from-remote` for the link you will actually rent.
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from eagle3.formats.shards import ShardReader, ShardWriter  # noqa: E402

from servers import S3_KEY_ID, S3_SECRET, MotoS3, Sshd  # noqa: E402

DVC = str(Path(sys.executable).with_name("dvc"))


def reshard(source: Path, out: Path, total_mb: float, shard_mb: float) -> int:
    """Real samples from `source`'s shards rewritten into shards of ~shard_mb until total_mb; returns bytes."""
    sources = sorted(source.rglob("*.e3sh"))
    if not sources:
        sys.exit(f"transfer.py: no shards under {source}: run `dvc repro extract` (or `dvc pull data/hidden`) first")
    out.mkdir(parents=True)
    written, index, writer = 0, 0, None
    for path in sources:
        reader = ShardReader(path)
        for position in range(len(reader)):
            if writer is None:
                writer = ShardWriter(out / f"shard-{index:05d}.e3sh", reader.meta)
                index += 1
            sample = reader.read(position)
            writer.add(sample.sample_id, sample.input_ids, sample.loss_mask, sample.hidden)
            if writer.handle.tell() >= shard_mb * 1e6:
                written += writer.close().stat().st_size
                writer = None
                if written >= total_mb * 1e6:
                    reader.close()
                    return written
        reader.close()
    if writer is not None:
        written += writer.close().stat().st_size
    return written


def run(root: Path, *command: str) -> None:
    result = subprocess.run(command, cwd=root, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"transfer.py: {' '.join(command)} failed:\n{result.stdout}{result.stderr}")


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def dvc_round(project: Path, remote: str, url: str, jobs: int, local_config: list[list[str]]) -> tuple[float, float]:
    """Seconds of `dvc push --jobs J` to an empty location, then `dvc pull --jobs J` into an empty cache."""
    from dvc.repo import Repo

    run(project, DVC, "remote", "add", "-f", "-d", remote, url)
    for setting in local_config:
        run(project, DVC, "remote", "modify", "--local", remote, *setting)
    with Repo(str(project)) as repo:
        push = timed(lambda: repo.push(jobs=jobs))
    shutil.rmtree(project / ".dvc" / "cache")
    shutil.rmtree(project / "shards")
    with Repo(str(project)) as repo:
        pull = timed(lambda: repo.pull(jobs=jobs))
    return push, pull


def plain_s3(server: MotoS3, files: list[Path], jobs: int, scratch: Path) -> tuple[float, float]:
    """Seconds to upload, then download, the same files with boto3 on `jobs` threads."""
    client, prefix, back = server.client(), f"plain-{jobs}", scratch / f"s3-back-{jobs}"
    back.mkdir()

    def upload(path: Path) -> None:
        client.upload_file(str(path), MotoS3.bucket, f"{prefix}/{path.name}")

    def download(path: Path) -> None:
        client.download_file(MotoS3.bucket, f"{prefix}/{path.name}", str(back / path.name))

    with ThreadPoolExecutor(jobs) as pool:
        up = timed(lambda: list(pool.map(upload, files)))
        down = timed(lambda: list(pool.map(download, files)))
    return up, down


def plain_scp(server: Sshd, source: Path, remote_dir: Path) -> tuple[float, float]:
    """Seconds of one `scp -r` up and one back, with DVC's cipher and no compression."""
    known_hosts = server.home() / ".ssh" / "known_hosts"
    options = [
        "-q",
        "-r",
        "-P",
        str(server.port),
        "-i",
        str(server.client_key),
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "Compression=no",
        "-c",
        "aes128-gcm@openssh.com",
    ]
    target = f"{server.user}@127.0.0.1:{remote_dir}"
    up = timed(lambda: run(source.parent, "scp", *options, str(source), target))
    down = timed(
        lambda: run(source.parent, "scp", *options, target, str(remote_dir.with_name(remote_dir.name + "-back")))
    )
    return up, down


def rate(megabytes: float, seconds: float) -> str:
    return f"{megabytes / seconds:6.0f} MB/s {megabytes * 8 / 1000 / seconds:4.2f}G"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=256)
    parser.add_argument("--shard-mb", type=float, default=32)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--servers", nargs="+", choices=["s3", "ssh"], default=["s3", "ssh"])
    parser.add_argument("--root", type=Path, default=REPO, help="project whose data/hidden holds real shards")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="eagle3-transfer-") as scratch:
        scratch = Path(scratch)
        project = scratch / "project"
        project.mkdir()
        size = reshard(args.root / "data" / "hidden", project / "shards", args.mb, args.shard_mb)
        files = sorted((project / "shards").iterdir())
        print(f"{len(files)} shards, {size / 1e6:.1f} MB of real hidden states from {args.root / 'data' / 'hidden'}")
        run(project, "git", "init", "-q")
        run(project, DVC, "init", "-q")
        run(project, DVC, "config", "--local", "cache.type", "hardlink,symlink")
        run(project, DVC, "add", "-q", "shards")

        rows = []
        for kind in args.servers:
            server = (MotoS3 if kind == "s3" else Sshd)(scratch / kind)
            server.start()
            try:
                for jobs in args.jobs:
                    if kind == "s3":
                        config = [
                            ["endpointurl", server.endpoint],
                            ["access_key_id", S3_KEY_ID],
                            ["secret_access_key", S3_SECRET],
                        ]
                        push, pull = dvc_round(project, "s3", f"s3://{MotoS3.bucket}/dvc-{jobs}", jobs, config)
                        plain_up, plain_down = plain_s3(server, files, jobs, scratch)
                        plain = "boto3, J threads"
                    else:
                        url = f"ssh://{server.user}@127.0.0.1:{server.port}{scratch / f'ssh-storage-{jobs}'}"
                        push, pull = dvc_round(project, "ssh", url, jobs, [["keyfile", str(server.client_key)]])
                        plain_up, plain_down = plain_scp(server, project / "shards", scratch / f"scp-{jobs}")
                        plain = "one scp -r"
                    rows.append((kind, jobs, push, pull, plain_up, plain_down, plain))
            finally:
                server.kill()

    mb = size / 1e6
    print(
        f"\n{'server':6} {'jobs':>4}  {'dvc push':>15} {'plain up':>15} {'ratio':>6}  {'dvc pull':>15} "
        f"{'plain down':>15} {'ratio':>6}  plain copy"
    )
    for kind, jobs, push, pull, up, down, plain in rows:
        print(
            f"{kind:6} {jobs:>4}  {rate(mb, push):>15} {rate(mb, up):>15} {up / push:6.2f}  "
            f"{rate(mb, pull):>15} {rate(mb, down):>15} {down / pull:6.2f}  {plain}"
        )
    print("ratio = dvc speed / plain-copy speed (1.00 = as fast); G = effective Gbit/s")


if __name__ == "__main__":
    main()
