"""The whole params.yaml as one typed object: every section validated (`eagle3 check`, tests, benchmarks).

Stages do not import this module: each validates the sections it reads (eagle3/runner.py), so that a stage's
DVC deps name only its own section's module. The runner still validates the whole file through this module
before a stage starts, so a typo anywhere stops `dvc repro` at once instead of hours later; that check's
result is discarded, so no stage output depends on it and it is deliberately not a dep.
"""

from pathlib import Path

from pydantic import model_validator

from eagle3.params.base import Section
from eagle3.params.benchmarks import BenchmarksParams
from eagle3.params.evaluate import EvaluateParams
from eagle3.params.export import ExportParams
from eagle3.params.extract import ExtractParams
from eagle3.params.generate import GenerateParams
from eagle3.params.loading import read_yaml, validate
from eagle3.params.prepare import PrepareParams
from eagle3.params.report import ReportParams
from eagle3.params.train import TrainParams
from eagle3.params.verifier import VerifierParams
from eagle3.params.vocab import VocabParams


class Params(Section):
    verifier: VerifierParams
    prepare: PrepareParams
    benchmarks: BenchmarksParams = BenchmarksParams()
    generate: GenerateParams
    extract: ExtractParams
    vocab: VocabParams = VocabParams()
    train: TrainParams = TrainParams()
    export: ExportParams = ExportParams()
    evaluate: EvaluateParams = EvaluateParams()
    report: ReportParams = ReportParams()

    @model_validator(mode="after")
    def _streamed_training_stores_no_training_states(self) -> "Params":
        if self.train.hidden_states == "streamed" and "train" in self.extract.splits:
            raise ValueError(
                "extract.splits: train.hidden_states is streamed, so training computes the training split's states "
                "itself; set extract.splits to [heldout] so extract does not store them too"
            )
        return self


def load_params(path: Path | str = "params.yaml") -> Params:
    path = Path(path)
    return validate(read_yaml(path), Params, path)
