"""What evaluate has measured so far (.eagle3/evaluation/), kept so that a rerun measures only the rest.

One directory per item evaluate measures: each configuration (`none`, `eagle3-k3`, `ngram-k5`, ...) and the offline
estimate (`offline-estimate`). A configuration's batches (one per sampling setting and turn:
eagle3/engines/turn_by_turn.py) are written as each finishes, `s<sampling>-t<turn>.json.zst` holding the sha256 of
the messages asked, the completions, the counter deltas and the seconds; `done.json` (the environment and, on
servers, the server's identity it was measured with) once all are. `key.json` holds the item's key: the sha256 of
everything its measurements depend on (the verifier's identity, the prompts, the sampling, the engine or the
endpoint, the draft for `eagle3`, the reference's key for the configurations whose later turns follow its answers).
An item whose key differs is emptied before it is measured again; a batch whose messages differ is asked again.

Outside DVC's outputs (like .eagle3/last_run): no output's hash depends on how often a measurement was resumed, and
`eagle3 evaluate --only ITEM` (run outside `dvc repro`, e.g. with only one server up) keeps what it measured for the
stage's run that follows.
"""

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import zstandard

from eagle3.files import write_bytes, write_json
from eagle3.resume import run_key

FORMAT_VERSION = 1
OFFLINE_ESTIMATE = "offline-estimate"


def item_name(method: str, k: int | None) -> str:
    """The name `--only` takes for configuration (method, k): none, eagle3-k3, ngram-k5."""
    return method if k is None else f"{method}-k{k}"


def messages_sha256(messages: list[list[dict[str, str]]]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()


class KeptItem:
    """One item's directory (its key already checked: `KeptEvaluation.item`): kept batches, and its record once
    done."""

    def __init__(self, directory: Path, key: str):
        self.directory, self.key = directory, key

    def _batch_path(self, sampling: int, turn: int) -> Path:
        return self.directory / f"s{sampling}-t{turn}.json.zst"

    def batch(self, sampling: int, turn: int, messages_sha: str) -> dict[str, Any] | None:
        """A kept batch asked with exactly these messages, else None."""
        path = self._batch_path(sampling, turn)
        try:
            kept = json.loads(zstandard.ZstdDecompressor().decompress(path.read_bytes()))
        except (OSError, ValueError, zstandard.ZstdError):
            return None
        return kept if isinstance(kept, dict) and kept.get("messages_sha256") == messages_sha else None

    def keep_batch(self, sampling: int, turn: int, messages_sha: str, batch: dict[str, Any]) -> None:
        data = json.dumps({"messages_sha256": messages_sha, **batch}).encode()
        write_bytes(self._batch_path(sampling, turn), zstandard.ZstdCompressor(level=3).compress(data))

    @property
    def done(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.directory / "done.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def finish(self, record: dict[str, Any]) -> None:
        write_json(self.directory / "done.json", record)


class KeptEvaluation:
    def __init__(self, directory: Path):
        self.directory = directory

    def item(self, name: str, settings: dict[str, Any]) -> KeptItem:
        """Item `name`, emptied first unless what it holds was measured with these settings."""
        directory = self.directory / name
        key = run_key({"format": FORMAT_VERSION, **settings})
        key_file = directory / "key.json"
        try:
            same = json.loads(key_file.read_text(encoding="utf-8")).get("key") == key
        except (OSError, ValueError, AttributeError):
            same = False
        if not same:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            write_json(key_file, {"key": key, "settings": settings})
        return KeptItem(directory, key)

    def forget_others(self, names: set[str]) -> None:
        """Drop the items no longer measured (a k or method removed from the params)."""
        if not self.directory.is_dir():
            return
        for path in self.directory.iterdir():
            if path.is_dir() and path.name not in names:
                shutil.rmtree(path, ignore_errors=True)
