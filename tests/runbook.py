"""A page that tells users what to type, read as a program: its bash blocks in order, each opening with the machine
it runs on, and the substitutions its rehearsal table shows (docs/hero-run.md is the first such page).

A block's first line says where it runs and when:

    # here                                   # there, layout A            # here and there, every new shell
    # there, layouts B and C                 # there: not rehearsed (why; what runs instead)

`every new shell` marks the prologue each later block runs after (a new SSH session's set-up). A block marked not
rehearsed is one the rehearsal cannot run (a Hub download, an upload); the test lists each with its reason. The
rehearsal table is the page's table whose header reads `| on this page | in the rehearsal | why |`: each row's first
two cells (in backticks) are a literal replacement applied, in the table's order, to every block's text."""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from conftest import REPO

MACHINES = ("here", "there")
LAYOUTS = ("A", "B", "C")
_HEADER = re.compile(
    r"^# (?P<machines>here and there|here|there)"
    r"(?:, (?P<shell>every new shell)|, layouts? (?P<layouts>[ABC](?:(?:, | and )[ABC])*))?"
    r"(?:: not rehearsed \((?P<reason>[^)]+)\))?$"
)
_BLOCK = re.compile(r"^```bash\n(.*?)^```$", flags=re.S | re.M)
_TABLE_HEADER = "| on this page | in the rehearsal | why |"


@dataclass(frozen=True)
class Block:
    line: int  # where it starts on the page, 1-based
    machines: tuple[str, ...]
    layouts: tuple[str, ...]
    prologue: bool
    not_rehearsed: str | None
    text: str  # everything after the header line

    def runs_for(self, machine: str, layout: str) -> bool:
        return machine in self.machines and layout in self.layouts

    def first_command(self) -> str:
        return next(line.strip() for line in self.text.splitlines() if line.strip())


@dataclass(frozen=True)
class Substitution:
    page: str
    rehearsal: str
    why: str


class PageError(AssertionError):
    pass


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _BLOCK.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        header, _, body = match.group(1).partition("\n")
        parsed = _HEADER.match(header.strip())
        if parsed is None:
            raise PageError(
                f"{page.name}:{line}: a bash block must open with where it runs (`# here`, `# there`, `# here and "
                f"there`, optionally `, layout A` or `: not rehearsed (why)`), not {header!r}"
            )
        machines = MACHINES if parsed["machines"] == "here and there" else (parsed["machines"],)
        layouts = tuple(re.findall(r"[ABC]", parsed["layouts"])) if parsed["layouts"] else LAYOUTS
        found.append(Block(line, machines, layouts, bool(parsed["shell"]), parsed["reason"], body))
    return found


def _code(cell: str, page: Path) -> str:
    cell = cell.strip()
    if len(cell) < 2 or not (cell.startswith("`") and cell.endswith("`")):
        raise PageError(f"{page.name}: a rehearsal substitution must be `code`, not {cell!r}")
    return cell[1:-1]


def substitutions(page: Path) -> list[Substitution]:
    lines = page.read_text(encoding="utf-8").splitlines()
    try:
        start = lines.index(_TABLE_HEADER)
    except ValueError:
        raise PageError(f"{page.name}: no rehearsal table (a line {_TABLE_HEADER!r})") from None
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 3:
            raise PageError(f"{page.name}: rehearsal row {line!r} has {len(cells)} cells, not 3")
        rows.append(Substitution(_code(cells[0], page), _code(cells[1], page), cells[2].strip()))
    return rows


def rehearsed_text(block: Block, table: list[Substitution]) -> str:
    text = block.text
    for row in table:
        text = text.replace(row.page, row.rehearsal)
    return text


def unused_substitutions(page_blocks: list[Block], table: list[Substitution]) -> list[str]:
    """Rows that change no rehearsed block: a page edited without its table."""
    return [
        row.page
        for row in table
        if not any(row.page in block.text for block in page_blocks if block.not_rehearsed is None)
    ]


class Machine:
    """One side of the rehearsal: a directory, a home and an environment as a fresh machine has them."""

    def __init__(self, base: Path, name: str, variables: dict[str, str], page: Path):
        self.name, self.dir, self.page = name, base / name, page
        self.home = self.dir / "home"
        (self.home / ".aws").mkdir(parents=True)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "EAGLE3_", "VIRTUAL_ENV"))},
            # A fresh machine's PATH: the suite's venv is not on it until the page activates its own.
            "PATH": os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not p.startswith(sys.prefix)),
            "HOME": str(self.home),
            "MACHINE_DIR": str(self.dir),
            "GIT_AUTHOR_NAME": name,
            "GIT_AUTHOR_EMAIL": f"{name}@localhost",
            "GIT_COMMITTER_NAME": name,
            "GIT_COMMITTER_EMAIL": f"{name}@localhost",
            "DVC_NO_ANALYTICS": "1",
            **variables,
        }
        self.started = False  # whether its first block (the set-up) has run
        self.prologue = ""
        self.outputs: list[tuple[Block, str]] = []
        self.seconds: list[tuple[int, float]] = []  # (page line, seconds) of each block run

    @property
    def root(self) -> Path:
        return self.dir / "eagle3"

    def run(self, block: Block, text: str, prologue: str) -> str:
        script = f"set -eo pipefail\n{prologue if self.started else ''}\n{text}"
        started = time.monotonic()
        result = subprocess.run(
            ["bash", "-c", script], cwd=self.dir, capture_output=True, text=True, env=self.env, timeout=1500
        )
        self.seconds.append((block.line, round(time.monotonic() - started, 1)))
        self.started = True
        self.prologue = prologue
        output = result.stdout + result.stderr
        assert result.returncode == 0, (
            f"{self.page.name}:{block.line} ({self.name}) exited {result.returncode}:\n{text}\n---\n{output[-4000:]}"
        )
        self.outputs.append((block, output))
        return output

    def output_of(self, command: str) -> str:
        """The output of the block whose first command starts with `command`."""
        return next(out for block, out in self.outputs if block.first_command().startswith(command))

    def shell(self, *command: str, stdout_only: bool = False) -> str:
        """A command in a new shell on this machine, set up as the page says (what a user types after the page)."""
        script = f"set -eo pipefail\n{self.prologue}\n{shlex.join(command)}"
        result = subprocess.run(["bash", "-c", script], cwd=self.dir, capture_output=True, text=True, env=self.env)
        assert result.returncode == 0, f"{' '.join(command)} ({self.name}) failed:\n{result.stdout}\n{result.stderr}"
        return result.stdout if stdout_only else result.stdout + result.stderr

    def stop_servers(self) -> None:
        for pid_file in (self.root / ".eagle3/servers").glob("*.pid"):
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError, PermissionError):
                pass


def fork(base: Path) -> Path:
    """A bare repository holding this checkout's tracked files as they are now: the user's fork."""
    source = base / "fork-source"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if name and (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    identity = ["-c", "user.name=fork", "-c", "user.email=fork@localhost"]
    for cwd, *command in (
        (source, "git", "init", "-q", "-b", "main"),
        (source, "git", "add", "."),
        (source, "git", *identity, "commit", "-qm", "the fork"),
        (base, "git", "clone", "-q", "--bare", str(source), str(base / "origin.git")),
    ):
        subprocess.run(command, cwd=cwd, check=True, capture_output=True)
    shutil.rmtree(source)
    return base / "origin.git"
