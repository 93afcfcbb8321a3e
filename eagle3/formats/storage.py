"""`extract.storage`: how a shard encodes each role's hidden states, and what each choice is expected to save.

One table, read by everything that needs a storage's facts: the params type (which names are valid), the shard
codec (eagle3/formats/shards.py: the encoding of the aux layers, the draft's input, and of the final layer, its
targets), extract's free-space check (the planning ratio) and `eagle3 plan` (the gain over lossless, to turn a
ratio measured with one storage into another's). Adding a storage is one row here, plus its encodings in the
codec if they are new. No torch and no codecs here, so that loading params stays light.

Encodings: `bf16` lossless (byte planes, the high one zstd-compressed); `e4m3` / `e5m2` 8-bit floats with one
scale per layer and token (the shard module's docstring has the layout and the error bound).
"""

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Storage:
    aux: str  # encoding of the aux layers
    final: str  # encoding of the final layer
    # raw/stored that the free-space check plans with: what it achieved on real states, rounded down.
    planning_ratio: float
    # Stored size relative to bf16-lossless (its raw/stored over lossless's), measured on the embedded verifier's
    # real states by benchmarks/storage_8bit.py; the fp8 storages' gain depends little on the model (a fixed byte
    # per value plus a scale per token).
    gain_over_lossless: float


# The valid values of extract.storage (and `eagle3 plan --storage`): the table's keys, in its order (a test holds
# them equal; written out so that a type checker reads the options).
StorageName = Literal["bf16-lossless", "fp8-aux", "fp8", "fp8-compact"]
STORAGES: dict[StorageName, Storage] = {
    "bf16-lossless": Storage(aux="bf16", final="bf16", planning_ratio=1.4, gain_over_lossless=1.0),
    "fp8-aux": Storage(aux="e4m3", final="bf16", planning_ratio=1.9, gain_over_lossless=1.378),
    "fp8": Storage(aux="e4m3", final="e4m3", planning_ratio=2.2, gain_over_lossless=1.572),
    "fp8-compact": Storage(aux="e5m2", final="e4m3", planning_ratio=2.5, gain_over_lossless=1.774),
}
DEFAULT_STORAGE: StorageName = "bf16-lossless"
