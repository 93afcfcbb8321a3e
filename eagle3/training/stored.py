"""The training split as extract stored it (`train.hidden_states: stored`): the shards, read by DataLoader workers
that decompress in parallel, one TrainingData (eagle3/training/data.py) beside the streamed kind."""

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from eagle3.errors import Eagle3Error
from eagle3.formats.provenance import Provenance
from eagle3.formats.shards import HiddenStateDataset, read_index, split_shards
from eagle3.hashing import sha256_file
from eagle3.params.train import TrainParams
from eagle3.paths import HIDDEN_INDEX
from eagle3.training.data import (
    PREFETCH_BATCHES,
    SCALE_SAMPLES,
    BatchPlan,
    Collate,
    TrainingData,
    data_workers,
    loader_batches,
    measure_aux_scale,
)
from eagle3.training.distributed import Dist


class StoredData(TrainingData):
    def __init__(self, root: Path, provenance: Provenance, world: Dist):
        index = read_index(root)
        self.layer_ids = tuple(index["layer_ids"])
        if self.layer_ids[-1] != provenance.num_hidden_layers:
            raise Eagle3Error(
                f"{root / HIDDEN_INDEX}: the last captured layer must be the final one "
                f"({provenance.num_hidden_layers}), got {self.layer_ids[-1]}; rerun `eagle3 extract`"
            )
        expected = {
            "layer_ids": index["layer_ids"],
            "hidden_size": provenance.hidden_size,
            "tokenizer_sha256": provenance.tokenizer_sha256,
        }
        self.shards = HiddenStateDataset(split_shards(root, "train"), expected, provenance.vocab_size)
        self.lengths = self.shards.lengths
        self.index_sha256 = sha256_file(root / HIDDEN_INDEX)
        self.world = world

    def __len__(self) -> int:
        return len(self.shards)

    def __getitem__(self, position: int) -> dict[str, Any]:
        return self.shards[position]

    def identity(self) -> dict[str, Any]:
        return {"shards_index_sha256": self.index_sha256}

    def first_states(self) -> Iterable[torch.Tensor]:
        """The stored states of the first samples, which fc's input scale is measured on."""
        return (self.shards[position]["hidden"] for position in range(min(SCALE_SAMPLES, len(self))))

    def begin(self, plan: BatchPlan, config: TrainParams, collate: Collate, fresh: bool) -> torch.Tensor | None:
        return measure_aux_scale(self.first_states(), collate.layers - 1) if fresh else None

    def batches(self, plan: BatchPlan, config: TrainParams, collate: Collate) -> Iterator[dict[str, torch.Tensor]]:
        workers = data_workers(config, self.world)
        loader = torch.utils.data.DataLoader(
            self.shards,
            batch_sampler=plan,
            collate_fn=collate,
            num_workers=workers,
            prefetch_factor=PREFETCH_BATCHES if workers else None,
            # Page-locked batches let the copy to the GPU run asynchronously, overlapping the previous step.
            pin_memory=self.world.device.type == "cuda",
        )
        return loader_batches(loader)

    def summary(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        """Nothing to release: the loader's workers end with its last batch."""
