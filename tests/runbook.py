"""A page that tells users what to type, read as a program: its bash blocks in order, each opening with the machine
it runs on, and the substitutions its rehearsal table shows (docs/hero-run.md is the first such page).

A block's first line says where it runs and when:

    # here                                   # there, layout A            # here and there, every new shell
    # there, layouts B and C                 # there: not rehearsed (why; what runs instead)

`every new shell` marks the prologue each later block runs after (a new SSH session's set-up). A block marked not
rehearsed is one the rehearsal cannot run (a Hub download, an upload); the test lists each with its reason. The
rehearsal table is the page's table whose header reads `| on this page | in the rehearsal | why |`: each row's first
two cells (in backticks) are a literal replacement applied, in the table's order, to every block's text."""

import re
from dataclasses import dataclass
from pathlib import Path

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
