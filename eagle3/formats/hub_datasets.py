"""Hugging Face datasets at a pinned commit: the prompt sources of `prepare` and the benchmark sets (`kind: hf`).

Offline (`HF_HUB_OFFLINE=1`) `datasets` falls back to whatever revision it has cached: anything but the pinned
commit is refused, so a dataset can only be the one dvc.lock and the lineage name.
"""

import re
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.progress import status


def load_pinned(dataset_id: str, config: str | None, revision: str, split: str, field: str) -> tuple[Any, dict]:
    """(the loaded split, its description for a card); errors name `field`, the params entry it came from."""
    import datasets

    status(f"loading {dataset_id}@{revision[:12]} ({split}) with datasets {datasets.__version__}")
    try:
        dataset = datasets.load_dataset(dataset_id, config, revision=revision, split=split)
    except Exception as exc:  # datasets raises many unrelated types for "not reachable / not cached / no such split"
        raise Eagle3Error(
            f"{field}: cannot load {dataset_id}@{revision} split {split}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
            "(online: check the id and revision; offline: the dataset must already be in the datasets cache)"
        ) from None
    loaded_revision = cached_revision(dataset)
    if loaded_revision is not None and loaded_revision != revision:
        raise Eagle3Error(
            f"{field}.revision: pinned {revision} but datasets loaded cached revision "
            f"{loaded_revision}; download the pinned revision or update the pin"
        )
    description = {
        "kind": "hf",
        "dataset": dataset_id,
        "revision": revision,
        "config": config,
        "split": split,
        "fingerprint": dataset._fingerprint,
    }
    return dataset, description


def cached_revision(dataset: Any) -> str | None:
    """The commit hash a hub dataset was materialised from: datasets caches it as .../<config>/<version>/<commit>/."""
    files = getattr(dataset, "cache_files", None) or []
    if not files:
        return None
    name = Path(files[0]["filename"]).parent.name
    return name if re.fullmatch(r"[0-9a-f]{40}", name) else None
