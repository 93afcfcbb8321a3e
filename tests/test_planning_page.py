"""docs/planning.md's example, run from the page: its command in an empty directory prints every line the page
quotes before its "...", each row of the page's abridged step table is the plan's own (a cell ending in "..." is
the start of the real one), and the largest runs the prose names are the plan's."""

import json
import re
import shlex

from eagle3.plan.facts import duration

from conftest import REPO, eagle3

PAGE = REPO / "docs" / "planning.md"
ABRIDGED = "..."


def _example() -> tuple[list[str], list[str]]:
    """The page's `$ eagle3 plan ...` block: the command's arguments and the lines it quotes."""
    block = next(b for b in re.findall(r"```\n(.*?)```", PAGE.read_text(), flags=re.S) if b.startswith("$ eagle3 "))
    command, *quoted = block.splitlines()
    words = shlex.split(command.removeprefix("$ "))
    assert words[:2] == ["eagle3", "plan"], command
    return words[2:], quoted


def _words(text: str) -> str:
    return " ".join(text.split())


def _same(page_cell: str, real: str) -> bool:
    return (
        real.startswith(page_cell.removesuffix(ABRIDGED).rstrip())
        if page_cell.endswith(ABRIDGED)
        else page_cell == real
    )


def test_the_planning_example_prints_what_the_page_quotes(tmp_path):
    args, quoted = _example()
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"COLUMNS": "200", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    printed = eagle3(empty, "plan", *args, env=env).stdout
    gap = quoted.index(ABRIDGED)
    answer, table = quoted[:gap], quoted[gap + 1 :]
    # Rich wraps at the terminal's width, the page at its own: the same words in the same order.
    assert _words(" ".join(answer)) in _words(printed)
    title, header, *rows = table
    assert _words(title) in _words(printed)
    assert re.split(r"\s{2,}", header.strip()) == ["where", "step", "time", "work", "rate from"]
    plan = json.loads(eagle3(empty, "plan", *args, "--json", env=env).stdout)
    steps = plan["scenarios"][plan["recommendation"]]["steps"]
    assert len(rows) == len(steps)
    for row, step in zip(rows, steps, strict=True):
        where, name, time, work, source = re.split(r"\s{2,}", row.strip())
        real = (
            "here, before renting" if step["machine"] == "here" else "there",
            step["name"].replace("_", " "),
            duration(step["seconds"]),
            step["work"],
            step["source"],
        )
        assert (where, name, time) == real[:3], row
        assert _same(work, real[3]) and _same(source, real[4]), (row, real)
    # The prose after the block reads the largest runs off the same plan.
    prose = _words(PAGE.read_text())
    for layout, pattern in {
        "A": r"caps A at ([\d,]+) samples",
        "B": r"buy B ([\d,]+) samples",
        "C": r"streaming C ([\d,]+) on",
    }.items():
        assert int(re.search(pattern, prose).group(1).replace(",", "")) == plan["largest_runs"][layout]["samples"]
