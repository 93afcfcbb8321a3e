"""Hidden-state storage against draft quality: the lossless shards beside each 8-bit storage, same data, same
training, same evaluation.

Each arm (an `extract.storage`) re-encodes this project's lossless shards with that storage (the bytes
`eagle3 extract` writes for it, since extraction stores the bf16 states it captured), then runs the real stages
`train`, `export` and `evaluate` (eagle3 train/export/evaluate, one process each) in a scratch project linking
this one's verifier, prepared prompts and vocab, with this project's params (evaluate without the n-gram
baseline, which does not depend on the draft). Arms run one after another in this process, so their train
times are comparable. Printed: bytes per token and ratio to raw bf16; the training loss curve at five points;
tokens per verifier step in vLLM at every k, greedy and at the evaluate temperature; the offline estimate; each
beside the lossless arm. Needs a project whose extract and vocab stages have run (default: this directory).

    python benchmarks/storage_8bit.py [--root .] [--storages bf16-lossless fp8-aux fp8] [--json results.json]
"""

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import yaml
from scratch_project import link, run_stage

from eagle3.formats.shards import STORAGES, ShardReader, ShardWriter, read_index, split_shards, write_index
from eagle3.paths import (
    EVAL_METRICS,
    HIDDEN_DIR,
    PREPARED_DIR,
    TRAIN_LOG_DIR,
    VERIFIER_DIR,
    VOCAB_DIR,
)
from eagle3.stages.extract import raw_bytes_per_token

LINKED = (VERIFIER_DIR, PREPARED_DIR, VOCAB_DIR)


def reencode(root: Path, work: Path, storage: str) -> dict[str, float]:
    """This project's shards, every split, re-encoded with `storage` into `work`; bytes and tokens."""
    splits: dict[str, list[Path]] = {}
    meta, stored, tokens = None, 0, 0
    for split in read_index(root)["splits"]:
        for source in split_shards(root, split):
            reader = ShardReader(source)
            meta = replace(reader.meta, storage=storage)
            target = work / HIDDEN_DIR / split / source.name
            target.parent.mkdir(parents=True, exist_ok=True)
            with ShardWriter(target, meta, threads=2) as writer:
                for position in range(len(reader)):
                    sample = reader.read(position)
                    writer.add(sample.sample_id, sample.input_ids, sample.loss_mask, sample.hidden)
                    tokens += len(sample.input_ids)
            reader.close()
            stored += target.stat().st_size
            splits.setdefault(split, []).append(target)
    write_index(work / HIDDEN_DIR, meta, splits)
    raw = raw_bytes_per_token(meta)
    return {"bytes_per_token": stored / tokens, "ratio_to_raw": raw * tokens / stored}


def loss_curve(work: Path) -> list[tuple[int, float]]:
    rows = (work / TRAIN_LOG_DIR / "plots" / "metrics" / "train" / "loss.tsv").read_text().splitlines()[1:]
    return [(int(step), float(loss)) for step, loss, *_ in (row.split("\t") for row in rows)]


def arm(root: Path, base: dict, storage: str, scratch: Path) -> dict:
    work = scratch / storage
    link(root, work, LINKED)
    params = {**base, "extract": {**base.get("extract", {}), "storage": storage}}
    methods = [m for m in base.get("evaluate", {}).get("methods", ["none", "eagle3", "ngram"]) if m != "ngram"]
    params["evaluate"] = {**base.get("evaluate", {}), "methods": methods}
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    result = {"storage": storage, **reencode(root, work, storage)}
    result["train_s"] = run_stage(work, "train")
    run_stage(work, "export")
    run_stage(work, "evaluate")
    evaluation = json.loads((work / EVAL_METRICS).read_text())
    result["tokens_per_step"] = {
        f"k={run['k']} T={run['temperature']:g}": run["tokens_per_step"]
        for run in evaluation["runs"]
        if run["method"] == "eagle3"
    }
    result["lossless"] = evaluation["lossless"]["identical"], evaluation["lossless"]["prompts"]
    result["offline_tokens_per_step"] = evaluation["offline_estimate"]["tokens_per_step"]
    curve = loss_curve(work)
    picks = sorted({round(i * (len(curve) - 1) / 4) for i in range(5)})
    result["loss_curve"] = [curve[i] for i in picks]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--storages", nargs="+", choices=sorted(STORAGES), default=list(STORAGES))
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    root = args.root.resolve()
    base = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))
    results = []
    with tempfile.TemporaryDirectory(prefix="eagle3-storage-") as scratch:
        for storage in args.storages:
            results.append(arm(root, base, storage, Path(scratch)))
            print(json.dumps(results[-1]), flush=True)
    first = results[0]
    print(f"\nbaseline: {first['storage']}; ratios and differences against it")
    print("storage | bytes/token | x raw | train s | loss curve (step: loss) | lossless")
    for r in results:
        curve = ", ".join(f"{step}: {loss:.3f}" for step, loss in r["loss_curve"])
        print(
            f"{r['storage']} | {r['bytes_per_token']:.0f} | {r['ratio_to_raw']:.3f}x | {r['train_s']:.0f} | {curve} | "
            f"{r['lossless'][0]}/{r['lossless'][1]}"
        )
    print("\nstorage | " + " | ".join(first["tokens_per_step"]) + " | offline k=3")
    for r in results:
        cells = [
            f"{value:.4f} ({value / first['tokens_per_step'][key] - 1:+.1%})"
            for key, value in r["tokens_per_step"].items()
        ]
        offline = r["offline_tokens_per_step"]
        cells.append(f"{offline:.4f} ({offline / first['offline_tokens_per_step'] - 1:+.1%})")
        print(f"{r['storage']} | " + " | ".join(cells))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
