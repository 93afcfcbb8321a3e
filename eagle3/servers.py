"""`eagle3 server start NAME -- COMMAND` / `eagle3 server stop NAME`: a model server in the background for the stages
that talk to one (generate's openai backend, evaluate's servers), on a machine reached by SSH.

`start` runs COMMAND (a `vllm serve ...`) in a session of its own, detached from the shell, with its output in
`.eagle3/servers/NAME.log` and its process id in `NAME.pid`, and returns once the server answers `/health` at the
address its `--host`/`--port` name. It stops in one line, with the log's last lines, if the process exits first or
the wait runs out. A `vllm serve` must name its `--host`: vLLM's default listens on every interface, which on a
rented machine puts an unauthenticated server (and, in development mode, its `/collective_rpc`) on the internet.
`stop` ends the whole session (the API server, its engine and workers) and returns once every process of it has
exited, so that the next server finds the GPU memory free.
"""

import argparse
import os
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from eagle3.errors import Eagle3Error
from eagle3.progress import status

SERVERS_DIR = Path(".eagle3/servers")
# vLLM's own default port.
DEFAULT_PORT = 8000
LOG_TAIL_LINES = 15


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", help="start COMMAND in the background and wait until it answers /health")
    start.add_argument("name", help="a name for it: its log and process id go to .eagle3/servers/NAME.{log,pid}")
    start.add_argument(
        "--timeout-min", type=float, default=60.0, help="minutes to wait for /health (default 60: a 1T model loads)"
    )
    start.add_argument("server_command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the server's command")
    stop = actions.add_parser("stop", help="stop a server `start` started, and wait until every process of it exited")
    stop.add_argument("name")
    stop.add_argument("--timeout-s", type=float, default=120.0, help="seconds to wait before killing it (default 120)")


def _flag(command: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in `command`, the last one given."""
    found = None
    for position, word in enumerate(command):
        if word == name and position + 1 < len(command):
            found = command[position + 1]
        elif word.startswith(name + "="):
            found = word.split("=", 1)[1]
    return found


def health_url(command: list[str]) -> str:
    """Where the server in `command` answers; a `vllm serve` without --host is refused (see the module doc)."""
    host = _flag(command, "--host")
    is_vllm = "serve" in command[1:2] and Path(command[0]).name == "vllm"
    if host is None and is_vllm:
        raise Eagle3Error(
            "server: `vllm serve` without --host listens on every interface; add --host 127.0.0.1 (or the address "
            "the clients reach it at)"
        )
    port = _flag(command, "--port") or str(DEFAULT_PORT)
    if not port.isdigit():
        raise Eagle3Error(f"server: --port {port!r} is not a port number")
    probe = "127.0.0.1" if host in (None, "", "0.0.0.0", "::") else host
    return f"http://{probe}:{port}/health"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _alive(pid: int) -> bool:
    """Whether the session `start` made for `pid` still has a process (the leader may be gone, its workers not)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return "(no log)"
    return " | ".join(line.strip() for line in lines if line.strip()) or "(empty log)"


def start(root: Path, name: str, command: list[str], timeout_min: float) -> None:
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise Eagle3Error(
            "server start: no command; give it after `--`, e.g. `eagle3 server start verifier -- vllm serve ...`"
        )
    url = health_url(command)
    directory = root / SERVERS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    pid_file, log = directory / f"{name}.pid", directory / f"{name}.log"
    running = _read_pid(pid_file)
    if running is not None and _alive(running):
        raise Eagle3Error(
            f"server {name} is already running (pid {running}, log {log}); `eagle3 server stop {name}` first"
        )
    if _answers(url):
        raise Eagle3Error(
            f"server {name}: something already answers at {url.removesuffix('/health')}, not started by `eagle3 "
            f"server start {name}`: stop it the way it was started (docs/hero-run.md, step 3), then rerun"
        )
    with open(log, "ab") as output:
        output.write(f"\n$ {shlex.join(command)}\n".encode())
        output.flush()
        try:
            process = subprocess.Popen(
                command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        except OSError as exc:
            raise Eagle3Error(f"server {name}: cannot run {command[0]!r}: {exc.strerror or exc}") from None
    pid_file.write_text(f"{process.pid}\n")
    status(f"server {name}: started (pid {process.pid}, log {log}); waiting for {url}")
    started = time.monotonic()
    deadline = started + timeout_min * 60
    while not _answers(url):
        code = process.poll()
        if code is not None:
            pid_file.unlink(missing_ok=True)
            raise Eagle3Error(f"server {name} exited with code {code} before answering; its log ends: {_tail(log)}")
        if time.monotonic() > deadline:
            raise Eagle3Error(
                f"server {name} did not answer {url} within {timeout_min:g} min (still running, pid {process.pid}: "
                f"`eagle3 server stop {name}`); its log ends: {_tail(log)}"
            )
        time.sleep(2)
    status(f"server {name}: ready at {url.removesuffix('/health')} after {time.monotonic() - started:.0f} s")


def stop(root: Path, name: str, timeout_s: float) -> None:
    pid_file = root / SERVERS_DIR / f"{name}.pid"
    pid = _read_pid(pid_file)
    if pid is None:
        # Stopping is idempotent: the runbook stops a standing server that may or may not run.
        status(f"server {name}: none started here, nothing to stop ({pid_file} is missing)")
        return
    if not _alive(pid):
        pid_file.unlink(missing_ok=True)
        status(f"server {name}: was not running")
        return
    os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.5)
    if _alive(pid):
        os.killpg(pid, signal.SIGKILL)
        while _alive(pid):
            _reap(pid)
            time.sleep(0.2)
        status(f"server {name}: killed after {timeout_s:g} s without exiting")
    else:
        status(f"server {name}: stopped")
    pid_file.unlink(missing_ok=True)


def _reap(pid: int) -> None:
    """Collect the leader's exit status where this process started it (a zombie still counts as alive)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def main(args: argparse.Namespace, root: Path) -> int:
    if args.action == "start":
        start(root, args.name, args.server_command, args.timeout_min)
    else:
        stop(root, args.name, args.timeout_s)
    return 0
