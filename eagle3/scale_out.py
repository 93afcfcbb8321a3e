"""One stage run as several ranks: `--rank R --world-size W` takes the parts whose index % W == R.

generate and extract cut their work into parts that are the unit of resume; ranks share one output directory
or run on separate machines whose outputs are copied together. Every rank writes only its own parts (and its
own environment log); the run that finds every part finished writes what spans all of them (the manifest, the
index, the metrics), so one more run after the ranks, or `dvc repro`, completes the stage.
"""

import argparse
from dataclasses import dataclass
from typing import Any

from eagle3.environment import capture
from eagle3.errors import Eagle3Error
from eagle3.progress import status


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rank", type=int, default=0, help="this process's slice of the parts (default 0)")
    parser.add_argument("--world-size", type=int, default=1, help="number of slices run in parallel (default 1)")


@dataclass(frozen=True)
class Slice:
    rank: int = 0
    world_size: int = 1

    @classmethod
    def from_options(cls, options: argparse.Namespace | None) -> "Slice":
        taken = cls(getattr(options, "rank", 0), getattr(options, "world_size", 1))
        if not 0 <= taken.rank < taken.world_size:
            raise Eagle3Error(f"--rank {taken.rank} must be in [0, --world-size {taken.world_size})")
        return taken

    def owns(self, part_index: int) -> bool:
        return part_index % self.world_size == self.rank

    def environment(self, *, tensor_parallel_size: int | None, compute_dtype: str | None) -> dict[str, Any]:
        """The environment record of this rank's work (eagle3/environment.py)."""
        return capture(
            tensor_parallel_size=tensor_parallel_size, world_size=self.world_size, compute_dtype=compute_dtype
        )

    def finished_unless_missing(self, stage: str, missing: list[str]) -> bool:
        """True when no part is missing, so this run may write what spans every part; else says which parts other
        ranks still owe."""
        if missing:
            status(
                f"{stage}: rank {self.rank}/{self.world_size} done; {len(missing)} parts still missing (other ranks): "
                f"{missing[:4]}"
            )
        return not missing
