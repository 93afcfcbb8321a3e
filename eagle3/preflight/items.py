"""`eagle3 preflight`'s shared vocabulary (eagle3/preflight/run.py runs the items): an item's result, the verdicts
its measurement raises, the context the items share, and each item's measuring budget."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eagle3.formats.provenance import Provenance
    from eagle3.params.params_file import Params

GB = 1e9
# Seconds each item may spend measuring (engine and model loading come on top where stated in its `how`).
BUDGETS_S = {
    "machine": 6.0,
    "verifier": 20.0,
    "training": 30.0,
    "collectives": 20.0,
    "extraction": 20.0,
    "data_path": 20.0,
    "serving": 10.0,
}
ITEMS = tuple(BUDGETS_S)


class Fix(Exception):
    """A condition the user has to change: the item's verdict, one line."""


class NotAvailable(Exception):
    """The item does not apply on this machine (one line saying why)."""


@dataclass
class Item:
    name: str
    status: str = "ready"  # ready | fix | failed | not available
    verdict: str = "ready"
    figures: dict[str, Any] = field(default_factory=dict)
    how: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "verdict": self.verdict,
            "figures": self.figures,
            "how": self.how,
            "seconds": round(self.seconds, 2),
        }


@dataclass
class Context:
    """What the items share: the project, its params, a scratch directory, and what earlier items measured."""

    root: Path
    params: "Params"
    scratch: Path
    budget_scale: float = 1.0
    results: dict[str, Item] = field(default_factory=dict)
    # Real states the extraction item captured, encoded as extract.storage stores them (the data path decodes them).
    encoded_samples: list[tuple[bytes, int]] = field(default_factory=list)
    # The verifier stage's record and the directory it points at, once an item has read them (ensure_verifier).
    provenance: "Provenance | None" = None
    model_dir: Path | None = None

    def budget(self, item: str) -> float:
        return BUDGETS_S[item] * self.budget_scale

    def figure(self, item: str, name: str) -> Any:
        result = self.results.get(item)
        return result.figures.get(name) if result else None
