"""The whole params.yaml as one typed object: every section validated (`eagle3 check`, tests, benchmarks).

Stages do not import this module: each validates the sections it reads (eagle3/runner.py), so that a stage's
DVC deps name only its own section's module. The runner still validates the whole file through this module
before a stage starts, so a typo anywhere stops `dvc repro` at once instead of hours later; that check's
result is discarded, so no stage output depends on it and it is deliberately not a dep.
"""

from pathlib import Path

from pydantic import model_validator

from eagle3.errors import Eagle3Error
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

    @model_validator(mode="after")
    def _settings_that_would_go_wrong_hours_later(self) -> "Params":
        """Combinations no run can mean, refused before any stage starts (each found only hours later otherwise)."""
        answer, sequence = self.generate.sampling.max_tokens, self.extract.max_seq_len
        if answer >= sequence:
            raise ValueError(
                f"extract.max_seq_len: {sequence} tokens cannot hold an answer of generate.sampling.max_tokens "
                f"({answer}) with its prompt, so long answers would be cut; raise extract.max_seq_len above {answer}"
            )
        if self.generate.backend == "vllm" and self.generate.vllm.max_model_len <= answer:
            raise ValueError(
                f"generate.vllm.max_model_len: {self.generate.vllm.max_model_len} leaves no room for a prompt beside "
                f"generate.sampling.max_tokens ({answer}); raise it above {answer}"
            )
        evaluate = self.evaluate
        if evaluate.backend == "engines" and evaluate.vllm.max_model_len <= evaluate.max_tokens:
            raise ValueError(
                f"evaluate.vllm.max_model_len: {evaluate.vllm.max_model_len} leaves no room for a prompt beside "
                f"evaluate.max_tokens ({evaluate.max_tokens}); raise it above {evaluate.max_tokens}"
            )
        probe = evaluate.long_context
        if (
            evaluate.backend == "engines"
            and probe
            and probe.context_tokens + evaluate.max_tokens > evaluate.vllm.max_model_len
        ):
            raise ValueError(
                f"evaluate.long_context.context_tokens: {probe.context_tokens} prompt tokens and an answer of "
                f"evaluate.max_tokens ({evaluate.max_tokens}) exceed evaluate.vllm.max_model_len "
                f"({evaluate.vllm.max_model_len}); lower it or raise evaluate.vllm.max_model_len"
            )
        missing = [split for split in self.extract.splits if split not in self.generate.splits]
        if missing:
            raise ValueError(
                f"extract.splits: {missing} are not regenerated (generate.splits is {self.generate.splits}); "
                "extract reads the verifier's answers: add them to generate.splits"
            )
        return self

    @model_validator(mode="after")
    def _evaluated_as_trained(self) -> "Params":
        """evaluate measures the draft train trains, served at the k it was trained for: every setting that must
        change with train.draft_method in one message."""
        method, evaluate = self.train.draft_method, self.evaluate
        fixes = []
        if evaluate.draft_method != method:
            if evaluate.backend == "servers":
                fixes.append(f"evaluate.servers.endpoints: serve {method}, not {evaluate.draft_method}")
            else:
                methods = [method if m == evaluate.draft_method else m for m in evaluate.methods]
                fixes.append(f"evaluate.methods: [{', '.join(methods)}]")
        if method == "dflash":
            # vLLM serves any num_speculative_tokens; the block is trained for its size less one.
            proposed = self.train.dflash.block_size - 1
            served = {
                "evaluate.headline_k": evaluate.headline_k,
                "export.num_speculative_tokens": self.export.num_speculative_tokens,
            }
            fixes += [f"{key}: {proposed}" for key, k in served.items() if k != proposed]
            if evaluate.backend == "engines" and proposed not in evaluate.num_speculative_tokens:
                fixes.append(f"evaluate.num_speculative_tokens: include {proposed}")
        if fixes:
            reason = (
                f"a block of train.dflash.block_size {self.train.dflash.block_size} proposes "
                f"{self.train.dflash.block_size - 1} tokens per verifier step"
                if method == "dflash"
                else "evaluate measures the trained draft"
            )
            raise ValueError(f"train.draft_method is {method} ({reason}): set {'; '.join(fixes)}")
        return self

    def warnings(self) -> list[str]:
        """Settings a user may want but that usually mean a mistake, one line each naming the keys."""
        if self.train.draft_method == "dflash":
            return []  # its served k is checked above
        found = []
        served = {"export.num_speculative_tokens": self.export.num_speculative_tokens}
        served["evaluate.headline_k"] = self.evaluate.headline_k
        depth = self.train.ttt_steps
        for key, k in served.items():
            if k > depth:
                found.append(
                    f"{key} is {k} but train.ttt_steps is {depth}: draft positions past {depth} are never trained, "
                    "so their acceptance collapses"
                )
        return found


def load_params(path: Path | str = "params.yaml") -> Params:
    path = Path(path)
    return validate(read_yaml(path), Params, path)


def configured_verifier(params: Params) -> str:
    """The public name of the verifier the params configure, as the verifier stage records it."""
    source = params.verifier.source
    return source.name if source.kind == "local" else source.upstream_model


def check_against_verifier(params: Params, path: Path) -> list[str]:
    """What needs the verifier's shape, against the verifier stage's record where it describes the configured
    verifier: Eagle3Error naming the key. Returns what could not be checked, one line each (no record yet, or the
    record of another verifier, e.g. the embedded default's left by `make repro`)."""
    from eagle3.formats.provenance import read_provenance
    from eagle3.paths import PROVENANCE

    root = path.resolve().parent
    unchecked = "vocab.draft_vocab_size and extract.max_seq_len are not checked against the verifier's shape"
    if not (root / PROVENANCE).is_file():
        return [f"{PROVENANCE.as_posix()} is missing (`dvc repro verifier` writes it): {unchecked}"]
    provenance = read_provenance(root)
    configured = configured_verifier(params)
    if provenance.name != configured:
        return [
            f"{PROVENANCE.as_posix()} describes {provenance.name}, not the configured {configured} (`dvc repro "
            f"verifier` records it): {unchecked}"
        ]
    if params.vocab.draft_vocab_size > provenance.vocab_size:
        raise Eagle3Error(
            f"{path}: vocab.draft_vocab_size: {params.vocab.draft_vocab_size} exceeds the verifier's vocabulary "
            f"({provenance.vocab_size} tokens, {PROVENANCE.as_posix()}); lower it"
        )
    if params.extract.max_seq_len > provenance.max_position_embeddings:
        raise Eagle3Error(
            f"{path}: extract.max_seq_len: {params.extract.max_seq_len} exceeds the verifier's context "
            f"(max_position_embeddings {provenance.max_position_embeddings}); lower it"
        )
    return []


def check_license_gate(params: Params, path: Path) -> str:
    """The report stage's license gate (eagle3/publish/licenses.py) on the licenses the params declare: the
    verifier's, each prompt source's and each sub-source's in report.sub_source_licenses. Eagle3Error naming what
    blocks publishing and the override to write; else the line saying what passed."""
    from eagle3.publish.licenses import LicensedInput, gate

    inputs = [LicensedInput("verifier", configured_verifier(params), params.verifier.source.license)]
    inputs += [LicensedInput("dataset", source.name, source.license) for source in params.prepare.sources]
    inputs += [
        LicensedInput("sub-source", name, license) for name, license in params.report.sub_source_licenses.items()
    ]
    try:
        decisions = gate(inputs, params.report.license_overrides)
    except Eagle3Error as exc:
        raise Eagle3Error(f"{path}: report: {exc}") from None
    overridden = [d["license"] for d in decisions if d["override_reason"]]
    return (
        f"license gate: {len(decisions)} declared input licenses allow publishing"
        + (f" ({', '.join(overridden)} by report.license_overrides)" if overridden else "")
        + "; the report stage also checks the sub-sources prepare finds"
    )
