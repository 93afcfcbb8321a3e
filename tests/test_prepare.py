import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3.chat.conversations import prompt_hash

from conftest import eagle3, make_project, smoke_params

VALID_SHAREGPT = {"conversations": [{"from": "human", "value": "Name three primes."}], "source": "blend/math"}
VALID_OPENAI = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "Again, louder."},
    ]
}
VALID_WITH_ANSWER = {
    "conversations": [{"from": "human", "value": "What is 2+2?"}, {"from": "gpt", "value": "4"}],
    "source": "blend/math",
}
# (raw JSONL line, reason it must be dropped for)
MALFORMED = [
    (b'{"source": "x"}', "missing_field"),
    (b'{"conversations": "not a list"}', "missing_field"),
    (b'{"conversations": []}', "empty_conversation"),
    (b'{"conversations": [{"from": "human", "value": "   "}]}', "empty_turn"),
    (b'{"messages": [{"role": "user", "content": ""}]}', "empty_turn"),
    (b'{"conversations": [{"from": "wizard", "value": "hi"}]}', "bad_role"),
    (b'{"conversations": [{"from": "human"}]}', "malformed_turn"),
    (b'{"conversations": ["just a string"]}', "malformed_turn"),
    (b'{"messages": [{"role": "user", "content": 42}]}', "malformed_turn"),
    (b'{"conversations": [{"from": "human", "value": "caf\xe9 au lait"}]}', "undecodable_text"),
    (b'{"conversations": [{"from": "human", "value": "bad \\ud800 surrogate"}]}', "undecodable_text"),
    (b'{"conversations": [{"from": "human", "value": "lost \\ufffd byte"}]}', "undecodable_text"),
    (b'{"conversations": [{"from": "gpt", "value": "answer first"}]}', "bad_turn_order"),
    (b'{"messages": [{"role": "system", "content": "only system"}]}', "bad_turn_order"),
    (b'{"conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}]}', "bad_turn_order"),
    (b'{"conversations": [{"from": "human", "value": "unterminated"', "invalid_json"),
    (b'["a", "list"]', "not_an_object"),
]
# Same prompt as VALID_SHAREGPT once case, width and spacing are normalised, and a different answer.
DUPLICATE = {
    "conversations": [{"from": "human", "value": "  name THREE   primes. "}, {"from": "gpt", "value": "2, 3, 5"}]
}


def _jsonl(rows: list) -> bytes:
    return b"\n".join(row if isinstance(row, bytes) else json.dumps(row).encode() for row in rows) + b"\n"


def _project(tmp_path: Path, sources: list[dict], **prepare) -> Path:
    params = smoke_params()
    params["prepare"] = {"sources": sources, "heldout_rows": 1, "seed": 7, **prepare}
    return make_project(tmp_path, params)


def _read(root: Path) -> tuple[dict, dict[str, list[dict]]]:
    card = json.loads((root / "data/prepared/card.json").read_text())
    splits = {name: pq.read_table(root / f"data/prepared/{name}.parquet").to_pylist() for name in ("train", "heldout")}
    return card, splits


def test_malformed_rows_are_counted_and_valid_rows_kept(tmp_path):
    root = _project(tmp_path, [{"kind": "local", "name": "mixed", "path": "in.jsonl", "license": "apache-2.0"}])
    lines = [
        json.dumps(VALID_SHAREGPT).encode(),
        *(line for line, _ in MALFORMED),
        json.dumps(VALID_OPENAI).encode(),
        json.dumps(DUPLICATE).encode(),
        json.dumps(VALID_WITH_ANSWER).encode(),
    ]
    (root / "in.jsonl").write_bytes(_jsonl(lines))

    result = eagle3(root, "prepare")

    card, splits = _read(root)
    expected_drops: dict[str, int] = {}
    for _, reason in MALFORMED:
        expected_drops[reason] = expected_drops.get(reason, 0) + 1
    assert card["dropped"] == expected_drops
    assert card["duplicates"] == 1
    assert card["rows_in"] == len(lines)
    assert card["inputs"][0]["rows_valid"] == 4
    assert sum(len(example) > 0 for example in card["drop_examples"].values()) == len(expected_drops)
    kept = splits["train"] + splits["heldout"]
    assert len(kept) == 3 and len(splits["heldout"]) == 1
    by_hash = {row["prompt_hash"]: row for row in kept}
    # The first occurrence wins the dedupe, with its own sub-source.
    first = by_hash[prompt_hash([{"role": "user", "content": "Name three primes."}])]
    assert first["messages"] == [{"role": "user", "content": "Name three primes."}]
    assert first["source"] == "blend/math" and first["origin"] == "mixed"
    openai = by_hash[prompt_hash([{"role": m["role"], "content": m["content"]} for m in VALID_OPENAI["messages"]])]
    assert openai["messages"] == VALID_OPENAI["messages"]
    assert openai["source"] == "mixed"  # no `source` field: falls back to the input's name
    assert "Traceback" not in result.stderr


def test_parquet_input_with_undecodable_bytes(tmp_path):
    root = _project(tmp_path, [{"kind": "local", "name": "pq", "path": "in.parquet", "license": "apache-2.0"}])
    turn = pa.struct([("from", pa.string()), ("value", pa.binary())])
    values = [b"first prompt", b"second prompt", b"\xff\xfe broken", b"third prompt"]
    table = pa.table({"conversations": pa.array([[{"from": "human", "value": v}] for v in values], pa.list_(turn))})
    pq.write_table(table, root / "in.parquet")

    eagle3(root, "prepare")

    card, splits = _read(root)
    assert card["dropped"] == {"undecodable_text": 1}
    prompts = sorted(row["messages"][0]["content"] for split in splits.values() for row in split)
    assert prompts == ["first prompt", "second prompt", "third prompt"]


def test_same_params_give_byte_identical_outputs(tmp_path):
    outputs = []
    for name in ("a", "b"):
        root = make_project(tmp_path / name)
        eagle3(root, "prepare")
        outputs.append({p.name: p.read_bytes() for p in sorted((root / "data/prepared").iterdir())})
    assert outputs[0] == outputs[1]
    assert set(outputs[0]) == {"card.json", "heldout.parquet", "train.parquet"}


def test_split_is_disjoint_and_seeded(tmp_path):
    heldout_by_seed = {}
    for seed in (0, 1):
        params = smoke_params()
        params["prepare"].update(seed=seed, max_rows=None)
        root = make_project(tmp_path / f"seed{seed}", params)
        eagle3(root, "prepare")
        card, splits = _read(root)
        train = {row["prompt_hash"] for row in splits["train"]}
        heldout = {row["prompt_hash"] for row in splits["heldout"]}
        assert len(heldout) == params["prepare"]["heldout_rows"]
        assert not train & heldout
        assert len(train) + len(heldout) == card["inputs"][0]["rows_valid"] - card["duplicates"]
        heldout_by_seed[seed] = heldout
    assert heldout_by_seed[0] != heldout_by_seed[1]


def test_caps_per_source_and_total(tmp_path):
    rows = [{"conversations": [{"from": "human", "value": f"question {i}"}], "source": f"s{i % 3}"} for i in range(30)]
    root = _project(
        tmp_path,
        [{"kind": "local", "name": "capped", "path": "in.jsonl", "license": "apache-2.0"}],
        max_rows_per_source=4,
        max_rows=10,
    )
    (root / "in.jsonl").write_bytes(_jsonl(rows))

    eagle3(root, "prepare")

    card, splits = _read(root)
    kept = splits["train"] + splits["heldout"]
    per_source = {s: sum(row["source"] == s for row in kept) for s in ("s0", "s1", "s2")}
    # 10 rows in total, no sub-source over 4: two sources full, the third cut by the total cap.
    assert sorted(per_source.values()) == [2, 4, 4]
    assert card["capped"] == {"max_rows": 8, "max_rows_per_source": 12}
    assert card["rows_out"] == {"train": 9, "heldout": 1}


def test_an_excluded_sub_source_is_left_out_and_a_misspelt_one_refused(tmp_path):
    """A sub-source whose license forbids publishing (tulu-3-sft-mixture's No Robots rows) never reaches the
    prepared data; an id the data does not have would let those rows through, so it stops the stage."""
    rows = [{"conversations": [{"from": "human", "value": f"question {i}"}], "source": f"s{i % 3}"} for i in range(30)]
    source = {"kind": "local", "name": "mix", "path": "in.jsonl", "license": "odc-by", "exclude_sub_sources": ["s1"]}
    root = _project(tmp_path / "kept", [source])
    (root / "in.jsonl").write_bytes(_jsonl(rows))
    eagle3(root, "prepare")
    card, splits = _read(root)
    assert {row["source"] for row in splits["train"] + splits["heldout"]} == {"s0", "s2"}
    assert card["inputs"][0]["excluded"] == {"s1": 10} and card["rows_out"] == {"train": 19, "heldout": 1}

    misspelt = _project(tmp_path / "misspelt", [{**source, "exclude_sub_sources": ["s1", "S4"]}])
    (misspelt / "in.jsonl").write_bytes(_jsonl(rows))
    result = eagle3(misspelt, "prepare", check=False)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (
        "eagle3 prepare: error: prepare.sources[0].exclude_sub_sources: S4 not among mix's sub-sources (its rows' "
        "`source` field); it has: s0 (10), s1 (10), s2 (10)"
    )
    assert not (misspelt / "data/prepared").exists()


def test_too_few_rows_for_heldout_is_one_clear_error(tmp_path):
    root = _project(
        tmp_path, [{"kind": "local", "name": "tiny", "path": "in.jsonl", "license": "apache-2.0"}], heldout_rows=5
    )
    (root / "in.jsonl").write_bytes(_jsonl([VALID_SHAREGPT, VALID_OPENAI]))
    result = eagle3(root, "prepare", check=False)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors == [
        "eagle3 prepare: error: prepare.heldout_rows: 5 held-out rows would leave no training rows "
        "(only 2 valid, unique rows after caps); lower it or add data"
    ]
    assert "Traceback" not in result.stderr
    assert not (root / "data/prepared").exists()


REVISION = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(
    cache: Path, rows: list[dict], dataset: str = "mlabonne/open-perfectblend", config: str = "default", split="train"
) -> None:
    """Lay out `dataset` in a datasets cache exactly as `load_dataset` leaves it after a download."""
    from datasets import Dataset, DatasetInfo, SplitDict, SplitInfo
    from datasets.arrow_writer import ArrowWriter

    owner, name = dataset.split("/")
    folder = cache / f"{owner}___{name}" / config / "0.0.0" / REVISION
    folder.mkdir(parents=True)
    data = Dataset.from_list(rows)
    with ArrowWriter(path=str(folder / f"{name}-{split}.arrow"), features=data.features) as writer:
        writer.write_table(data.data.table)
        writer.finalize()
    splits = SplitDict(dataset_name=name)
    splits.add(SplitInfo(name=split, num_examples=len(rows), dataset_name=name))
    DatasetInfo(features=data.features, config_name=config, dataset_name=name, splits=splits).write_to_directory(
        str(folder)
    )


@pytest.mark.parametrize("pinned, ok", [(REVISION, True), ("f" * 40, False)])
def test_hub_dataset_offline(tmp_path, pinned, ok):
    rows = [
        {
            "conversations": [{"from": "human", "value": f"hub question {i}"}, {"from": "gpt", "value": "ok"}],
            "source": f"sub{i % 2}",
        }
        for i in range(12)
    ]
    rows.append({"conversations": [{"from": "gpt", "value": "orphan answer"}], "source": "sub0"})
    cache = tmp_path / "hf-datasets"
    _hub_cache(cache, rows)
    source = {
        "kind": "hf",
        "name": "blend",
        "dataset": "mlabonne/open-perfectblend",
        "revision": pinned,
        "split": "train",
        "license": "apache-2.0",
    }
    root = _project(tmp_path / "project", [source], heldout_rows=2)
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(cache), "HF_HOME": str(tmp_path / "hf-home")}

    result = eagle3(root, "prepare", env=env, check=False)

    if not ok:
        assert result.returncode == 2
        assert result.stderr.strip().splitlines()[-1] == (
            f"eagle3 prepare: error: prepare.sources[blend].revision: pinned {'f' * 40} but datasets loaded cached "
            f"revision {REVISION}; download the pinned revision or update the pin"
        )
        return
    assert result.returncode == 0, result.stderr
    card, splits = _read(root)
    assert card["inputs"][0]["revision"] == REVISION and card["inputs"][0]["dataset"] == "mlabonne/open-perfectblend"
    assert card["dropped"] == {"bad_turn_order": 1}
    assert card["rows_out"] == {"train": 10, "heldout": 2}
    assert {name: c["train"] + c["heldout"] for name, c in card["by_source"].items()} == {"sub0": 6, "sub1": 6}
    assert {row["messages"][0]["content"] for split in splits.values() for row in split} == {
        f"hub question {i}" for i in range(12)
    }
