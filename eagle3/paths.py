"""Where every output of the pipeline lives, relative to the project root (the directory of params.yaml).

dvc.yaml declares the same paths as the stages' outs (tests/test_wiring.py checks that they agree), so this
is the one place to read or change them. Every stage depends on this module: changing a path reruns the
stages, which then resume from what they find (generate and extract redo no finished work).
"""

from pathlib import Path

# The project's parameters; the project root is its directory.
PARAMS_FILE = Path("params.yaml")

# verifier
VERIFIER_DIR = Path("models/verifier")
PROVENANCE = VERIFIER_DIR / "provenance.json"

# prepare
PREPARED_DIR = Path("data/prepared")
PREPARED_CARD = PREPARED_DIR / "card.json"

# benchmarks
BENCHMARKS_DIR = Path("data/benchmarks")
BENCHMARKS_FILE = BENCHMARKS_DIR / "benchmarks.json"

# generate
SYNTHETIC_DIR = Path("data/synthetic")
SYNTHETIC_MANIFEST = SYNTHETIC_DIR / "manifest.json"

# extract
HIDDEN_DIR = Path("data/hidden")
HIDDEN_INDEX = HIDDEN_DIR / "index.json"
# The vllm backend's connector leaves each request's states here until they are in a shard; never an output.
VLLM_SPOOL = HIDDEN_DIR / ".vllm-spool"

# vocab
VOCAB_DIR = Path("data/vocab")
VOCAB_FILE = VOCAB_DIR / "vocab.safetensors"

# train
CHECKPOINT_DIR = Path("checkpoints")
# A streamed run's token layout of the training split (train.hidden_states: streamed); never an output.
STREAM_DIR = Path(".eagle3/stream")

# export
DRAFT_DIR = Path("models/draft")
SPECULATORS_DRAFT_DIR = Path("models/draft-speculators")

# report
REPORTS_DIR = Path("reports")
LINEAGE_JSON = REPORTS_DIR / "lineage.json"
LINEAGE_MD = REPORTS_DIR / "lineage.md"
MODEL_CARD = DRAFT_DIR / "README.md"

# metrics and plots (kept by git: `dvc metrics diff` / `dvc plots diff` across commits)
METRICS_DIR = Path("metrics")
GENERATE_METRICS = METRICS_DIR / "generate.json"
EXTRACT_METRICS = METRICS_DIR / "extract.json"
VOCAB_METRICS = METRICS_DIR / "vocab.json"
# DVCLive writes the training curves here (metrics.json + plots/metrics/*.tsv).
TRAIN_LOG_DIR = METRICS_DIR / "train"
EVAL_METRICS = METRICS_DIR / "eval.json"
EVAL_PLOTS_DIR = METRICS_DIR / "eval"
EVAL_FIGURE = REPORTS_DIR / "eval.png"
EVAL_BENCHMARKS_FIGURE = REPORTS_DIR / "eval_benchmarks.png"
# What evaluate has measured so far, kept for its next run (eagle3/formats/evaluation_kept.py); never an output.
EVALUATION_KEPT_DIR = Path(".eagle3/evaluation")

# Throughput of the last run that did work, outside DVC's outputs (eagle3/resume.py: measured_run).
LAST_RUN_DIR = Path(".eagle3/last_run")


def prepared_split(split: str) -> Path:
    return PREPARED_DIR / f"{split}.parquet"
