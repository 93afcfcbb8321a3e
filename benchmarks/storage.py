"""Hidden-state storage: eagle3 shards vs the formats the anchors use, on real hidden states, one process.

    python benchmarks/storage.py [--samples 48] [--threads 1] [--root PROJECT]

Needs models/verifier and data/synthetic (`dvc repro generate`) in the project
(default: this repository). Renders
regenerated conversations with the verifier's chat template, runs the verifier
(HF, bf16) and keeps the aux layers (2, N//2, N-3) plus the final layer: the
same 4 x hidden bf16 per token that extraction stores. Then writes and reads
them as
  - torch.save per sample (SpecForge, ModelOpt)
  - safetensors per sample (speculators)
  - torch.save + gzip -6 per sample (SpecForge --compress)
  - eagle3 shard (zstd over bf16 byte planes, one file, checksummed)
and prints bytes/token, size ratio vs raw, write and read MB/s (of raw bytes)
and the latency of reading one random sample. Everything runs on --threads
compression threads for eagle3 (the others are single-threaded), so the
default compares per core.
"""

import argparse
import gzip
import io
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle3.chat.reasoning import render  # noqa: E402
from eagle3.formats.provenance import read_provenance, verifier_dir  # noqa: E402
from eagle3.formats.shards import ShardMeta, ShardReader, ShardWriter  # noqa: E402
from eagle3.formats.synthetic import iter_records  # noqa: E402


def hidden_states(root: Path, samples: int) -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    provenance, model_dir = read_provenance(root), verifier_dir(root)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    layers = [*provenance.default_aux_layer_ids, provenance.num_hidden_layers]
    records = [r for r in iter_records(root, "train") if r["status"] == "ok"][:samples]
    if len(records) < samples:
        raise SystemExit(f"need {samples} regenerated samples in data/synthetic; run `dvc repro generate`")
    out = []
    with torch.no_grad():
        for record in records:
            ids = tokenizer(render(tokenizer, record["messages"]), return_tensors="pt", add_special_tokens=False)[
                "input_ids"
            ]
            states = model(ids, output_hidden_states=True).hidden_states
            hidden = torch.stack([states[k][0] for k in layers]).to(torch.bfloat16).contiguous()
            out.append((record["id"], ids[0], torch.ones(ids.shape[1], dtype=torch.bool), hidden))
    return out


def per_file_format(name, save, load):
    def write(samples, folder):
        for sample_id, ids, mask, hidden in samples:
            save({"input_ids": ids, "loss_mask": mask, "hidden": hidden}, folder / f"{sample_id}.{name}")

    def read_all(samples, folder):
        for sample_id, *_ in samples:
            load(folder / f"{sample_id}.{name}")

    def read_one(folder, sample_id):
        return load(folder / f"{sample_id}.{name}")["hidden"]

    return write, read_all, read_one


def gzip_save(tensors, path):
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    path.write_bytes(gzip.compress(buffer.getvalue(), compresslevel=6))


def gzip_load(path):
    return torch.load(io.BytesIO(gzip.decompress(path.read_bytes())), weights_only=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="eagle3 compression threads (default 1: per core)")
    parser.add_argument("--root", type=Path, default=ROOT, help="project directory (default: this repository)")
    args = parser.parse_args()

    samples = hidden_states(args.root, args.samples)
    tokens = sum(len(ids) for _, ids, _, _ in samples)
    raw = sum(hidden.numel() * 2 for *_, hidden in samples)
    provenance = read_provenance(args.root)
    meta = ShardMeta(
        provenance.name,
        tuple([*provenance.default_aux_layer_ids, provenance.num_hidden_layers]),
        provenance.hidden_size,
        provenance.tokenizer_sha256,
    )

    def shard_write(samples, folder):
        with ShardWriter(folder / "shard.e3sh", meta, threads=args.threads) as writer:
            for sample in samples:
                writer.add(*sample)

    def shard_read_all(samples, folder):
        reader = ShardReader(folder / "shard.e3sh")
        for position in range(len(reader)):
            reader.read(position)

    def shard_read_one(folder, sample_id):
        reader = ShardReader(folder / "shard.e3sh")
        return reader.read(reader.position[sample_id]).hidden

    formats = {
        "torch.save": per_file_format("pt", lambda t, p: torch.save(t, p), lambda p: torch.load(p, weights_only=True)),
        "safetensors": per_file_format("safetensors", save_file, load_file),
        "torch.save+gzip6": per_file_format("pt.gz", gzip_save, gzip_load),
        "eagle3 shard": (shard_write, shard_read_all, shard_read_one),
    }
    print(
        f"{len(samples)} samples, {tokens} tokens, {raw / 2**20:.1f} MiB raw hidden states "
        f"({raw // tokens} B/token: {meta.layer_ids} x {meta.hidden_size} bf16)\n"
    )
    print(f"{'format':18s} {'B/token':>8s} {'vs raw':>7s} {'write MB/s':>11s} {'read MB/s':>10s} {'1 sample ms':>12s}")
    results = {}
    for name, (write, read_all, read_one) in formats.items():
        with tempfile.TemporaryDirectory(dir=args.root / "data") as scratch:
            folder = Path(scratch)
            start = time.perf_counter()
            write(samples, folder)
            write_s = time.perf_counter() - start
            size = sum(p.stat().st_size for p in folder.iterdir())
            start = time.perf_counter()
            read_all(samples, folder)
            read_s = time.perf_counter() - start
            picks = random.Random(0).sample([s[0] for s in samples], min(16, len(samples)))
            latencies = []
            for sample_id in picks:
                start = time.perf_counter()
                read_one(folder, sample_id)
                latencies.append((time.perf_counter() - start) * 1000)
        results[name] = (size, raw / write_s / 1e6, raw / read_s / 1e6)
        print(
            f"{name:18s} {size / tokens:8.0f} {raw / size:6.2f}x {raw / write_s / 1e6:11.0f} "
            f"{raw / read_s / 1e6:10.0f} "
            f"{statistics.median(latencies):12.2f}"
        )
    shard_size, shard_write_rate, shard_read_rate = results["eagle3 shard"]
    gzip_size, gzip_write_rate, gzip_read_rate = results["torch.save+gzip6"]
    print(
        f"\neagle3 shard vs raw: {raw / shard_size:.2f}x smaller; vs torch.save+gzip6: {gzip_size / shard_size:.2f}x "
        "smaller, "
        f"{shard_write_rate / gzip_write_rate:.1f}x faster to write, {shard_read_rate / gzip_read_rate:.1f}x faster to "
        "read"
    )


if __name__ == "__main__":
    main()
