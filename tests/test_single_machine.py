"""docs/single-machine.md executed as written on tiny random verifiers of two families (tests/single_machine.py: a
dense Qwen3 and a Qwen3-MoE): the page's bash blocks in order (tests/runbook.py reads them) with only the
substitutions of its rehearsal table, in a clone of a bare repository of this checkout's tracked files; then what
the page promises: every stage ran, the draft is lossless against its verifier in vLLM-CPU, and the card names the
verifier and the thinking switch it was trained and measured with."""

import json
import sys

import pytest
from runbook import Machine, blocks, fork, rehearsed_text, substitutions, unused_substitutions
from single_machine import build

from conftest import REPO

pytestmark = pytest.mark.slow

PAGE = REPO / "docs/single-machine.md"
# Each block the page marks "not rehearsed", by its command.
NOT_REHEARSED = ("hf download", "make gpu-check")
FAMILIES = ("qwen3-tiny", "qwen3-moe-tiny")
VALIDATED = "models/draft: valid EAGLE-3 draft for"


def test_the_page_s_blocks_and_its_rehearsal_table_agree():
    page = blocks(PAGE)
    assert unused_substitutions(page, substitutions(PAGE)) == []
    skipped = [b for b in page if b.not_rehearsed is not None]
    assert [next(c for c in NOT_REHEARSED if b.first_command().startswith(c)) for b in skipped] == list(NOT_REHEARSED)
    assert all(set(block.machines) == {"here"} for block in page)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_page_runs_end_to_end_on_a_verifier_of_each_family(family, verifier_project, tmp_path):
    origin = fork(tmp_path)
    variables = {
        "REHEARSAL": str(tmp_path),
        "SUITE_VENV": sys.prefix,
        "REHEARSAL_TOOLS": str(REPO / "tests" / "single_machine.py"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    assert origin == tmp_path / "origin.git"
    here = Machine(tmp_path, "here", variables, PAGE)
    # What `hf download` would have put there.
    build(family, here.dir / "models" / "Qwen3-8B", verifier_project / "models/verifier")
    page, table = blocks(PAGE), substitutions(PAGE)
    prologue = "\n".join(rehearsed_text(block, table) for block in page if block.prologue)
    skipped = []
    for block in page:
        if block.prologue:
            continue
        if block.not_rehearsed is not None:
            skipped.append(next(c for c in NOT_REHEARSED if block.first_command().startswith(c)))
            continue
        here.run(block, rehearsed_text(block, table), prologue)
    assert skipped == ["hf download", "make gpu-check"]
    root = here.root
    assert "Data and pipelines are up to date" in here.shell("dvc", "status")
    metrics = json.loads((root / "metrics/eval.json").read_text())
    headline = metrics["headline"]
    assert f'"tokens_per_step_greedy": {headline["tokens_per_step_greedy"]}' in here.output_of("python -c")
    prompts = metrics["prompts"]["count"]
    assert metrics["lossless"]["dtype"] == "float32" and headline["lossless_greedy"] == f"{prompts}/{prompts}"
    assert metrics["chat_template_kwargs"] == {"enable_thinking": False}
    card = (root / "models/draft/README.md").read_text()
    assert "Qwen/Qwen3-8B" in card and "(`enable_thinking: false`)" in card
    assert VALIDATED in here.output_of("python -c")  # the same block
    print(
        f"{family}: k=3 greedy {headline['tokens_per_step_greedy']} tokens per verifier step, n-gram "
        f"{headline['ngram_tokens_per_step_greedy']}, lossless {headline['lossless_greedy']}"
    )
