import importlib.util
import json
import re
from collections import Counter

from eagle3.chat.conversations import normalize, prompt_hash
from eagle3.params.params_file import load_params

from conftest import REPO

PROMPTS = REPO / "data" / "prompts"


def _builder():
    spec = importlib.util.spec_from_file_location("build_prompts", PROMPTS / "build_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows() -> list[dict]:
    return [json.loads(line) for line in (PROMPTS / "eagle3-prompts.jsonl").read_text(encoding="utf-8").splitlines()]


def test_shipped_file_is_exactly_what_the_builder_writes():
    builder = _builder()
    assert (PROMPTS / "eagle3-prompts.jsonl").read_text(encoding="utf-8") == builder.render(builder.build())


def test_at_least_2000_distinct_valid_prompts_across_every_category():
    rows = _rows()
    hashes = {prompt_hash(normalize(row)) for row in rows}  # normalize raises on any invalid row
    assert len(hashes) == len(rows) >= 2000
    categories = Counter(row["source"].split("/")[1] for row in rows)
    assert set(categories) == {"chat", "reasoning", "math", "code", "writing", "multi-turn"}
    assert min(categories.values()) >= 150


def test_multi_turn_answers_are_correct():
    checked = 0
    for row in _rows():
        turns = row["conversations"]
        if row["source"].endswith("multi-turn"):
            assert [turn["from"] for turn in turns] == ["human", "gpt", "human"]
            product = re.fullmatch(r"What is (\d+) times (\d+)\?", turns[0]["value"])
            if product:
                assert turns[1]["value"] == f"{product[1]} × {product[2]} = {int(product[1]) * int(product[2])}."
                checked += 1
            sort = re.fullmatch(r"Sort these words alphabetically: (.*)\.", turns[0]["value"])
            if sort:
                assert turns[1]["value"] == ", ".join(sorted(sort[1].split(", "))) + "."
                checked += 1
    assert checked >= 150


def test_license_is_recorded_where_prepare_reads_it():
    params = load_params(REPO / "params.yaml")
    shipped = [s for s in params.prepare.sources if getattr(s, "path", None) == "data/prompts/eagle3-prompts.jsonl"]
    assert [s.license for s in shipped] == ["apache-2.0"]
    assert "Apache-2.0" in (PROMPTS / "README.md").read_text()
