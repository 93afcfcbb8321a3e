"""`eagle3 plan`: disk, time and cost of the hero run before any money is spent.

(Longer than most modules on purpose: the docstring is the plan's specification and each function below is one of
its sections; apart, a formula could change without its spec.)

Two machines: *here* (the user's own, which serves the verifier and generates the synthetic data) and *there* (the
rented GPU machine that trains the draft), joined by a link. The plan answers: how much disk each needs, and
whether to extract the hidden states here and ship them (A), ship the text and extract there (B), or ship the text and
stream the states there, storing none (C: train.hidden_states streamed, the verifier's forward pass in every epoch,
the buffer train.stream_buffer_gb as its only disk for states).

Not a DVC stage: it reads CLI flags (eagle3/plan/flags.py), params.yaml and, where present, the extract stage's
metrics.
Every number comes from one of the formulas below (the training memory's: eagle3/plan/memory.py);
docs/planning.md walks through the seed case.
Each section below is a function here building a frozen dataclass whose fields are the plan's JSON keys (to_json in
eagle3/plan/facts.py, with the fixed facts and the inputs' types).

Units: 1 GB = 1e9 bytes, 1 TB = 1e12 bytes, 1 Gbit/s = 1e9 bit/s (as links and disks are sold).

Sizes
    tokens              = samples * mean_tokens
    bytes_per_token     = captured_layers * hidden_size * bytes_per_element
    raw                 = tokens * bytes_per_token
    stored              = raw / compression_ratio
    largest_sample      = max_tokens * bytes_per_token              (one record, held in memory while written)
    text                = tokens * TEXT_BYTES_PER_TOKEN             (prompts + synthetic answers, before zstd)
    draft_params        = the parameters of the draft the train stage builds for these inputs (the verifier's
                          config, the aux layers, the draft vocabulary and the train settings: eagle3/plan/memory.py
                          draft_figures, on the meta device; embeddings are the verifier's and are not stored)
    checkpoint          = its weights in fp32 and train.optimizer's state (eagle3/formats/checkpoints.py
                          checkpoint_bytes: AdamW's two moments, Muon's one per matrix)
    checkpoints         = checkpoint * keep_checkpoints

Disk (per machine and scenario; every pipeline output is DVC-tracked, the verifier's weights are not: the verifier
stage records where a local model is without copying it)
    cache               = 1 for hardlink, reflink or symlink (workspace and cache share the bytes), 2 for copy
    A here              = (stored + text) * cache * (1 + headroom)
    A there             = (weights + (text + stored + checkpoints) * cache) * (1 + headroom)
    B here, C here      = text * cache * (1 + headroom)
    B there             = (weights + (text + stored + checkpoints) * cache) * (1 + headroom)
    C there             = (weights + (text + checkpoints) * cache + stream_buffer) * (1 + headroom)
    largest samples that fit = floor((disk_tb * 1e12 / (1 + headroom) - fixed) / per_sample), where disk(samples) =
                          (fixed + samples * per_sample) * (1 + headroom) is the scenario's formula above

Rates
    link                = link_gbit * 1e9 * link_efficiency / 8                      (bytes/s; likewise weights_link)
    remote_up           = remote_up_gbit * 1e9 / 8        (here -> the DVC remote; default: the link)
    remote_down         = remote_down_gbit * 1e9 / 8      (the rented machine <-> the DVC remote; default: the link)
    flops_per_token     = 2 * active_params + 2 * num_layers * mean_tokens * hidden_size
                          (forward matmuls; causal attention averages mean_tokens / 2 keys per token, and
                           QK^T plus AV cost 2 * 2 * hidden FLOPs per key per layer)
    extract_tokens_per_s = gpus * gpu_tflops * 1e12 * mfu * share / flops_per_token  (share: 1 there; here, the
                          part of the GPUs extraction gets beside the server), unless given or measured
    train_tokens_per_s  = gpus_there * per_gpu, per_gpu = TRAIN_MEASURED.tokens_per_s * gpu_tflops / its tflops
                          unless given or measured by preflight (then without its optimizer step)
    optimizer_step      = preflight's measured step of train.optimizer, else for muon its Newton-Schulz FLOPs
                          (every matrix on every GPU under ddp) / (gpu_tflops * 1e12 * NEWTON_SCHULZ_MFU), else 0
                          (AdamW's fused step is in the measured training rate)
    samples_per_step    = train.batch_size, or max_tokens_per_batch / mean_tokens where fewer (at least 1)
    serve_here          = generate's measured completion tokens/s on this verifier, else given, else
                          SERVE_TOKENS_PER_S_PER_GPU * here gpus (an assumption the plan names)
    serve_there         = serve_here / here gpus / here tflops * there gpus * there tflops
    server_start        = weights / SERVER_LOAD_BYTES_PER_S + SERVER_WARMUP_S, unless given
    hash                = min(sha256 bytes/s of one thread, measured here, * HASH_THREADS, SERVER_LOAD_BYTES_PER_S)
    machine_usd_per_h   = gpus * usd_per_gpu_hour

Scenarios: every step of docs/hero-run.md, in its order, on the machine that takes it (rented time is what the bill
counts; generation and, in A, extraction happen here before renting, extraction costing here_usd_per_hour, 0 for an
owned machine). Each step's counted work (answers, turns, tokens, bytes, server starts) is in the plan beside it.
    here   verifier             = weights / hash                     (every weight file's bytes, once per machine)
           generate             = answers * answer_tokens / serve_here + server_start
           extract_here (A)     = tokens / extract_here (+ server_start where extract.backend is vllm)
           push_hidden_states (A) = stored / remote_up                (dvc push, before renting)
    there  setup                = SETUP_S (make setup: the CUDA lock's wheels)
           gpu_check            = the sum of make gpu-check's time boxes
           fetch_weights        = weights / weights_link             (every layout: evaluation serves it there)
           hash_weights         = weights / hash                     (the copy checked against here's record)
           ship_text            = text / remote_down                 (dvc pull)
           ship_hidden_states   = stored / remote_down               (A: dvc pull)
           preflight            = sum(preflight budgets) + server_start * (1 + extraction on vllm)
           extract (B)          = tokens / extract_there (+ server_start on vllm)
           verifier_forward_all_epochs (C) = epochs * tokens / extract_there (+ server_start on vllm)
                                  (the verifier and the trainer share the GPUs, so their times add)
           train                = epochs * tokens / train_tokens_per_s
                                  + epochs * samples / samples_per_step * optimizer_step
           offline_estimate     = held-out tokens read / train_tokens_per_s
           evaluate             = sum over configurations (each on its own server, one after the other):
                                  server_start + runs * turns * evaluate.max_tokens / serve_there
           push_results         = checkpoints / remote_down          (dvc push)
    rented = the sum of there's steps; cost = rented * machine_usd_per_h (+ for A: extract_here's time *
    here_usd_per_hour)

Largest run (per scenario: every term above is linear in samples, so each scenario's cost, rented time and disk
are f(N) = f(0) + N * (f(samples) - f(0)) / samples, f(0) its fixed part: the weights fetched, the tensors)
    by budget_usd       = floor((budget_usd.high - cost(0)) / cost per sample)
    by budget_hours     = floor((budget_hours.high * 3600 - rented(0)) / rented seconds per sample)
    by disk here/there  = largest samples that fit (above)
    samples             = the smallest of those given, bounded_by naming it; the disk each machine then needs

Break-even between A and B (the steps both take cancel; only B starts an engine to extract on vLLM):
    cost_A(N) = F_A + N * a,  F_A = 0,  a = stored_per_token / remote_down * P + here_usd_tok
    cost_B(N) = F_B + N * b,  F_B = (server_start if extract.backend is vllm) * P,  b = P / extract_there
    (P: the rented machine's $/s; here_usd_tok: here_usd_per_hour / 3600 / extract_here)
    N* = (F_B - F_A) / (a - b) when a > b and F_B > F_A: A is cheaper below N*, B above. Otherwise the one with the
    lower per-token cost is cheaper at any size.
"""

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from functools import partial

from eagle3.gpu_kinds import GPUS
from eagle3.plan.facts import (
    CACHE_LINKS,
    GB,
    GPU_MEMORY_UTILIZATION,
    INLINE,
    NOT_IN_JSON,
    TB,
    TRAIN_MEASURED,
    Budget,
    Inputs,
    Machine,
    size,
    weights_fit,
)
from eagle3.plan.gpu_fit import StreamedFit, streamed_fit, verifier_share
from eagle3.plan.memory import TrainMemory, compute_train_memory
from eagle3.preflight.gpu_check import total_limit_s
from eagle3.preflight.items import BUDGETS_S as PREFLIGHT_BUDGETS_S

# Prompts and answers as UTF-8 text: ~4 characters per token, before zstd.
TEXT_BYTES_PER_TOKEN = 4
# The transfers docs/hero-run.md makes through the DVC remote from the rented machine: `dvc pull` of the text and
# (A) the hidden states, `dvc push` of the checkpoints.
REMOTE_DOWN = "the DVC remote <-> there"
# Assumptions for steps nothing measures before the run; each is named as one in the plan's output.
# make setup on the rented machine: uv installs locks/cuda.txt (~6 GB of wheels) and compiles its bytecode.
SETUP_S = 15 * 60
# A server's start: its weights read from a local NVMe disk (~2 GB/s), then CUDA graphs and the KV cache. Hashing the
# weights (eagle3/formats/weight_hashes.py, up to 16 threads) reads them at that rate too, unless the CPU's sha256 is
# slower (the plan measures it on this machine).
SERVER_LOAD_BYTES_PER_S = 2 * GB
HASH_THREADS = 16
SERVER_WARMUP_S = 60
# Output tokens/s a `vllm serve` of a large MoE verifier gives per GPU at a few hundred requests in flight.
SERVE_TOKENS_PER_S_PER_GPU = 250.0
# Muon's Newton-Schulz products (bf16, 7K-21K on a side for Kimi-K2.5's draft): their share of the GPU's dense peak.
NEWTON_SCHULZ_MFU = 0.5


@dataclass(frozen=True)
class HiddenStates:
    raw_bytes: float
    stored_bytes: float
    largest_sample_bytes: int


@dataclass(frozen=True)
class Sizes:
    tokens: float
    bytes_per_token: int
    hidden_states: HiddenStates
    text_bytes: float
    verifier_weights_bytes: float
    draft_params: int
    checkpoints_bytes: int
    stored_bytes_per_token: float = field(metadata=NOT_IN_JSON)


def compute_sizes(inputs: Inputs, compression_ratio: float) -> Sizes:
    """Sizes, with the hidden states stored at `compression_ratio`."""
    v = inputs.verifier
    tokens = inputs.samples * inputs.mean_tokens
    bytes_per_token = inputs.captured_layers * v.hidden_size * inputs.bytes_per_element
    raw = tokens * bytes_per_token
    return Sizes(
        tokens=tokens,
        bytes_per_token=bytes_per_token,
        hidden_states=HiddenStates(raw, raw / compression_ratio, inputs.max_tokens * bytes_per_token),
        text_bytes=tokens * TEXT_BYTES_PER_TOKEN,
        verifier_weights_bytes=v.known_weights_bytes,
        draft_params=inputs.draft.parameters,
        checkpoints_bytes=inputs.draft.checkpoint_bytes * inputs.keep_checkpoints,
        stored_bytes_per_token=bytes_per_token / compression_ratio,
    )


@dataclass(frozen=True)
class Rates:
    link_bytes_per_s: float
    weights_link_bytes_per_s: float
    remote_up_bytes_per_s: float
    remote_down_bytes_per_s: float
    flops_per_token: float
    extract_there_tokens_per_s: float
    extract_here_tokens_per_s: float
    train_tokens_per_s: float
    optimizer_step_s: float
    serve_here_tokens_per_s: float
    serve_there_tokens_per_s: float
    server_start_s: float
    hash_bytes_per_s: float
    machine_usd_per_hour: float
    usd_per_s: float = field(metadata=NOT_IN_JSON)  # P: what the formulas bill by


def extraction_rate(machine: Machine, mfu: float, share: float, flops_per_token: float) -> float:
    return machine.gpus * machine.tflops * 1e12 * mfu * share / flops_per_token


def train_rate_per_gpu(machine: Machine) -> float:
    return TRAIN_MEASURED.tokens_per_s * machine.tflops / GPUS[TRAIN_MEASURED.gpu].bf16_tflops


def optimizer_step_seconds(inputs: Inputs) -> float:
    if inputs.optimizer_step_s is not None:
        return inputs.optimizer_step_s
    return inputs.optimizer_step_flops / (inputs.there.tflops * 1e12 * NEWTON_SCHULZ_MFU)


def compute_rates(inputs: Inputs) -> Rates:
    """Rates: the links, extraction and training speeds, and the rented machine's price."""
    v, there, here, mfu = inputs.verifier, inputs.there, inputs.here, inputs.mfu
    flops = 2 * (v.active_params or 0) + 2 * v.num_layers * inputs.mean_tokens * v.hidden_size
    usd_per_s = there.gpus * there.usd_per_gpu_hour / 3600
    serve_here = inputs.serve_tokens_per_s or SERVE_TOKENS_PER_S_PER_GPU * here.gpus
    server_start = inputs.server_start_s
    if server_start is None:
        server_start = (v.weights_bytes or 0) / SERVER_LOAD_BYTES_PER_S + SERVER_WARMUP_S
    return Rates(
        link_bytes_per_s=inputs.link_gbit * 1e9 * inputs.link_efficiency / 8,
        weights_link_bytes_per_s=inputs.weights_link_gbit * 1e9 * inputs.link_efficiency / 8,
        remote_up_bytes_per_s=inputs.remote_up_gbit * 1e9 / 8,
        remote_down_bytes_per_s=inputs.remote_down_gbit * 1e9 / 8,
        flops_per_token=flops,
        extract_there_tokens_per_s=inputs.there_tokens_per_s or extraction_rate(there, mfu, 1.0, flops),
        extract_here_tokens_per_s=inputs.here_tokens_per_s or extraction_rate(here, mfu, inputs.here_share, flops),
        train_tokens_per_s=there.gpus * (inputs.train_tokens_per_s_per_gpu or train_rate_per_gpu(there)),
        optimizer_step_s=optimizer_step_seconds(inputs),
        serve_here_tokens_per_s=serve_here,
        serve_there_tokens_per_s=serve_here / here.gpus / here.tflops * there.gpus * there.tflops,
        server_start_s=server_start,
        hash_bytes_per_s=min(inputs.sha256_bytes_per_s * HASH_THREADS, SERVER_LOAD_BYTES_PER_S),
        machine_usd_per_hour=usd_per_s * 3600,
        usd_per_s=usd_per_s,
    )


@dataclass(frozen=True)
class DiskNeed:
    bytes: float
    budget_tb: float | None
    fits: bool
    largest_samples: int | None


@dataclass(frozen=True)
class ScenarioDisk:
    here: DiskNeed
    there: DiskNeed

    def sides(self) -> tuple[tuple[str, DiskNeed], tuple[str, DiskNeed]]:
        return ("here", self.here), ("there", self.there)


def largest_samples(disk_tb: float | None, headroom: float, fixed: float, per_sample: float) -> int | None:
    """Samples of the planned length that fit `disk_tb`; None where there is no limit to check."""
    if disk_tb is None:
        return None
    return samples_within(disk_tb * TB / (1 + headroom), fixed, per_sample)


def samples_within(limit: float, fixed: float, per_sample: float) -> int | None:
    """The most samples with `fixed + samples * per_sample <= limit`; None where samples cost nothing of it."""
    if per_sample <= 0:
        return None
    return max(0, math.floor((limit - fixed) / per_sample))


def _disk_need(inputs: Inputs, machine: Machine, fixed: float, per_sample: float) -> DiskNeed:
    need, budget_tb = (fixed + inputs.samples * per_sample) * (1 + inputs.headroom), machine.disk_tb
    fits = budget_tb is None or need <= budget_tb * TB
    return DiskNeed(need, budget_tb, fits, largest_samples(budget_tb, inputs.headroom, fixed, per_sample))


def compute_disk(inputs: Inputs, sizes: Sizes) -> dict[str, ScenarioDisk]:
    """Disk, per scenario (A, B, C) and machine."""
    cache = CACHE_LINKS[inputs.cache_link]
    sample_text = TEXT_BYTES_PER_TOKEN * inputs.mean_tokens * cache
    sample_states = sizes.stored_bytes_per_token * inputs.mean_tokens * cache
    checkpoints = sizes.checkpoints_bytes * cache
    with_weights = sizes.verifier_weights_bytes + checkpoints
    # (fixed bytes, bytes per sample) of each machine's formula, here then there, before headroom
    terms = {
        "A": ((0.0, sample_states + sample_text), (with_weights, sample_text + sample_states)),
        "B": ((0.0, sample_text), (with_weights, sample_text + sample_states)),
        "C": ((0.0, sample_text), (with_weights + inputs.stream_buffer_gb * GB, sample_text)),
    }
    return {
        key: ScenarioDisk(_disk_need(inputs, inputs.here, *here), _disk_need(inputs, inputs.there, *there))
        for key, (here, there) in terms.items()
    }


@dataclass(frozen=True)
class BudgetVerdict:
    usd: str | None
    hours: str | None


@dataclass(frozen=True)
class Step:
    """One step of the runbook: where it runs, its time, the work it counts (in words and as numbers: answers,
    turns, tokens, bytes, server_starts) and where its rate comes from."""

    machine: str  # "here" (before renting) or "there" (rented)
    name: str
    seconds: float
    work: str
    counted: dict[str, float]
    source: str


@dataclass(frozen=True)
class Scenario:
    name: str
    steps: list[Step]
    rented_steps_s: dict[str, float]
    here_steps_s: dict[str, float]
    rented_s: float
    wall_s: float
    cost_usd: float
    disk: ScenarioDisk
    feasible: bool
    problems: list[str]
    budget: BudgetVerdict


@dataclass(frozen=True)
class Scenarios:
    A: Scenario
    B: Scenario
    C: Scenario

    def items(self) -> Iterator[tuple[str, Scenario]]:
        return ((item.name, getattr(self, item.name)) for item in fields(self))


def _within(budget: Budget | None, value: float) -> str | None:
    if budget is None:
        return None
    if value > budget.high:
        return "over"
    return "below" if budget.low is not None and value < budget.low else "inside"


def streamed_memory(inputs: Inputs) -> StreamedFit | None:
    """Layout C on one GPU there: as the params set it, else as `eagle3 init --layout C` sizes it (the smallest share
    that holds the verifier, side by side where that fits, else phases). None where the trainer's memory is not
    estimated."""
    memory = compute_train_memory(inputs.train_memory, inputs.process_tokens, inputs.there)
    if inputs.streamed_share is not None:
        return streamed_fit(memory, inputs.recompute, inputs.streamed_share, bool(inputs.streamed_phases))
    share = verifier_share(
        inputs.verifier.known_weights_bytes,
        inputs.there.gpus,
        inputs.there.gpu,
        inputs.verifier.config,
        inputs.captured_layers,
        inputs.max_tokens + 1,
    )
    fit = streamed_fit(memory, inputs.recompute, share, phases=False)
    return fit if fit is None or fit.fits else streamed_fit(memory, inputs.recompute, share, phases=True)


def _scenario(inputs: Inputs, rates: Rates, name: str, disk: ScenarioDisk, steps: list[Step]) -> Scenario:
    """One scenario from its steps and disk; what rules it out (a disk too small, weights that do not fit the GPUs
    there: every layout serves the verifier there to evaluate; in C the verifier beside the trainer)."""
    there = inputs.there
    rented_steps = {step.name: step.seconds for step in steps if step.machine == "there"}
    here_steps = {step.name: step.seconds for step in steps if step.machine == "here"}
    rented = sum(rented_steps.values())
    problems = [
        f"needs {size(need.bytes)} {side}, more than its {size(need.budget_tb * TB)}"
        for side, need in disk.sides()
        if not need.fits and need.budget_tb is not None  # a need without a budget always fits
    ]
    weights = inputs.verifier.known_weights_bytes
    fits = weights_fit(weights, there)
    if not fits:
        problems.append(
            f"the verifier's {weights / GB:,.0f} GB of weights do not fit {there.gpus} x {there.memory_gb:g} GB "
            f"x {GPU_MEMORY_UTILIZATION} of GPU memory there"
        )
    # Where the weights alone do not fit, the trainer beside them is no second problem for the user to solve.
    streamed = streamed_memory(inputs) if fits and "verifier_forward_all_epochs" in rented_steps else None
    if streamed is not None and not streamed.fits:
        problems.append(f"streamed states do not fit a GPU there: {streamed.words()}")
    here_usd = here_steps.get("extract_here", 0.0) * inputs.here_usd_per_hour / 3600
    cost = rented * rates.usd_per_s + here_usd
    return Scenario(
        name=name,
        steps=steps,
        rented_steps_s=rented_steps,
        here_steps_s=here_steps,
        rented_s=rented,
        wall_s=rented + sum(here_steps.values()),
        cost_usd=cost,
        disk=disk,
        feasible=not problems,
        problems=problems,
        budget=BudgetVerdict(_within(inputs.budget_usd, cost), _within(inputs.budget_hours, rented / 3600)),
    )


def _transfer(machine: str, name: str, what: str, nbytes: float, rate: float, source: str) -> Step:
    return Step(machine, name, nbytes / rate, f"{what}: {size(nbytes)}", {"bytes": nbytes}, source)


def _starting(work: str, counted: dict[str, float], starts: int, rates: Rates) -> tuple[str, dict[str, float], float]:
    """Work, counts and seconds of `starts` engine or server starts added to a step's."""
    if not starts:
        return work, counted, 0.0
    return (
        f"{work}; {starts} start{'s' * (starts > 1)} of the verifier",
        {**counted, "server_starts": starts},
        starts * rates.server_start_s,
    )


def _measured(what: str, measured: float | None) -> str:
    """What a transfer ships: measured (the outputs as they are here) or estimated from the plan's sizes."""
    return f"{what} (as they are here)" if measured is not None else what


def run_steps(inputs: Inputs, sizes: Sizes, rates: Rates, layout: str) -> list[Step]:
    """Every step of docs/hero-run.md for `layout`, in its order (formulas: the module docstring)."""
    work, sources = inputs.work, inputs.sources
    weights_link = rates.weights_link_bytes_per_s
    on_vllm = 1 if work.extract_on_vllm else 0
    generated = work.answers * work.answer_tokens
    weights = sizes.verifier_weights_bytes
    hashing = f"{size(weights)} of weights, every byte once on this machine"
    steps = [
        Step("here", "verifier", weights / rates.hash_bytes_per_s, hashing, {"bytes": weights}, sources["hash"]),
        Step(
            "here",
            "generate",
            generated / rates.serve_here_tokens_per_s + rates.server_start_s,
            f"{work.answers:,} answers ({work.answers_source}) x {work.answer_tokens:,.0f} tokens "
            f"({work.answer_tokens_source}); 1 start of the verifier",
            {"answers": work.answers, "tokens": generated, "server_starts": 1},
            sources["serve"],
        ),
    ]
    up, down = rates.remote_up_bytes_per_s, rates.remote_down_bytes_per_s
    if layout == "A":
        words, counted, starts = _starting(f"{sizes.tokens:,.0f} tokens", {"tokens": sizes.tokens}, on_vllm, rates)
        seconds = sizes.tokens / rates.extract_here_tokens_per_s + starts
        steps.append(Step("here", "extract_here", seconds, words, counted, "extraction here"))
        stored = work.states_bytes or sizes.hidden_states.stored_bytes
        what = _measured("the hidden states", work.states_bytes)
        steps.append(_transfer("here", "push_hidden_states", what, stored, up, "here -> the DVC remote"))
    weights_source = "the weights link" if inputs.weights_link_gbit != inputs.link_gbit else "the link"
    text = work.text_bytes or sizes.text_bytes
    steps += [
        Step("there", "setup", SETUP_S, "make setup: locks/cuda.txt", {}, "assumed"),
        Step("there", "gpu_check", total_limit_s(), "make gpu-check", {}, "assumed: its time boxes, spent"),
        _transfer(
            "there",
            "fetch_weights",
            "the verifier's weights",
            sizes.verifier_weights_bytes,
            weights_link,
            weights_source,
        ),
        Step("there", "hash_weights", weights / rates.hash_bytes_per_s, hashing, {"bytes": weights}, sources["hash"]),
        _transfer("there", "ship_text", _measured("prompts and answers", work.text_bytes), text, down, REMOTE_DOWN),
    ]
    if layout == "A":
        steps.append(_transfer("there", "ship_hidden_states", what, stored, down, REMOTE_DOWN))
    words, counted, starts = _starting("its measurements", {}, 1 + on_vllm, rates)
    budgets = sum(PREFLIGHT_BUDGETS_S.values())
    steps.append(Step("there", "preflight", budgets + starts, words, counted, "its items' time budgets"))
    if layout in ("B", "C"):
        # C: the verifier's forward in every epoch, beside the trainer.
        name, forward = ("extract", sizes.tokens) if layout == "B" else ("verifier_forward_all_epochs", 0.0)
        forward = forward or inputs.epochs * sizes.tokens
        epochs = "" if layout == "B" else f" ({inputs.epochs} epochs)"
        words, counted, starts = _starting(f"{forward:,.0f} tokens{epochs}", {"tokens": forward}, on_vllm, rates)
        seconds = forward / rates.extract_there_tokens_per_s + starts
        steps.append(Step("there", name, seconds, words, counted, "extraction there"))
    trained = inputs.epochs * sizes.tokens
    optimizer_steps = inputs.epochs * inputs.samples / inputs.samples_per_step
    words, counted = f"{trained:,.0f} tokens ({inputs.epochs} epochs)", {"tokens": trained}
    if rates.optimizer_step_s:
        words += f"; {optimizer_steps:,.0f} {inputs.optimizer} steps of {rates.optimizer_step_s:.2f} s"
        counted["optimizer_steps"] = optimizer_steps
    seconds = trained / rates.train_tokens_per_s + optimizer_steps * rates.optimizer_step_s
    steps.append(Step("there", "train", seconds, words, counted, "training there"))
    if work.held_out_tokens:
        steps.append(
            Step(
                "there",
                "offline_estimate",
                work.held_out_tokens / rates.train_tokens_per_s,
                f"at most {work.held_out_tokens:,} held-out tokens (evaluate.offline.max_tokens)",
                {"tokens": work.held_out_tokens},
                "the training rate",
            )
        )
    for run in work.evaluation:
        turns = run.runs * run.turns
        tokens = turns * work.evaluate_max_tokens
        steps.append(
            Step(
                "there",
                f"evaluate {run.configuration}",
                tokens / rates.serve_there_tokens_per_s + rates.server_start_s,
                f"{run.runs} x {run.turns:,} turns ({work.evaluation_source}) x at most "
                f"{work.evaluate_max_tokens:,} tokens; 1 start of the verifier",
                {"turns": turns, "tokens": tokens, "server_starts": 1},
                sources["serve_there"],
            )
        )
    steps.append(_transfer("there", "push_results", "the checkpoints", sizes.checkpoints_bytes, down, REMOTE_DOWN))
    return steps


def compute_scenarios(inputs: Inputs, sizes: Sizes, rates: Rates) -> Scenarios:
    """Scenarios: each layout's steps, rented time, cost and disk, and what rules it out."""
    disk = compute_disk(inputs, sizes)
    scenario = partial(_scenario, inputs, rates)
    return Scenarios(
        A=scenario("extract here, ship hidden states", disk["A"], run_steps(inputs, sizes, rates, "A")),
        B=scenario("ship text, extract on the rented machine", disk["B"], run_steps(inputs, sizes, rates, "B")),
        C=scenario(
            "ship text, stream the hidden states on the rented machine (train.hidden_states: streamed)",
            disk["C"],
            run_steps(inputs, sizes, rates, "C"),
        ),
    )


def recommend(scenarios: Scenarios) -> str | None:
    """The cheapest feasible scenario (to the cent, then the shorter rental); None if none."""
    candidates = {key: s for key, s in scenarios.items() if s.feasible}
    return min(candidates, key=lambda key: (round(candidates[key].cost_usd, 2), candidates[key].rented_s), default=None)


@dataclass(frozen=True)
class LargestRun:
    samples: int | None  # None: nothing given bounds it
    bounded_by: str | None  # "budget usd" | "budget hours" | "disk here" | "disk there"
    limits: dict[str, int]  # the largest samples each given limit allows
    disk_here_bytes: float | None  # what each machine's disk then needs
    disk_there_bytes: float | None


@dataclass(frozen=True)
class LargestRuns:
    A: LargestRun
    B: LargestRun
    C: LargestRun


def compute_largest_runs(inputs: Inputs, scenarios: Scenarios, rates: Rates) -> LargestRuns:
    """Largest run: per scenario, the most samples of this length the budgets and disks allow, and which binds.
    Extrapolated from the plan's per-sample sizes: shipped outputs measured here are this run's, not a sample's."""
    estimated = replace(inputs, work=replace(inputs.work, text_bytes=None, states_bytes=None))
    scenarios = compute_scenarios(estimated, compute_sizes(estimated, inputs.compression_ratio), rates)
    empty = replace(estimated, samples=0)
    at_zero = compute_scenarios(empty, compute_sizes(empty, inputs.compression_ratio), rates)

    def largest(key: str) -> LargestRun:
        now, fixed = getattr(scenarios, key), getattr(at_zero, key)
        limits: dict[str, int | None] = {}
        if inputs.budget_usd is not None:
            per_sample = (now.cost_usd - fixed.cost_usd) / inputs.samples
            limits["budget usd"] = samples_within(inputs.budget_usd.high, fixed.cost_usd, per_sample)
        if inputs.budget_hours is not None:
            per_sample = (now.rented_s - fixed.rented_s) / inputs.samples
            limits["budget hours"] = samples_within(inputs.budget_hours.high * 3600, fixed.rented_s, per_sample)
        limits |= {f"disk {side}": need.largest_samples for side, need in now.disk.sides()}
        given = {name: samples for name, samples in limits.items() if samples is not None}
        if not given:
            return LargestRun(None, None, {}, None, None)
        bound = min(given, key=given.__getitem__)
        most = replace(inputs, samples=given[bound])
        disk = compute_disk(most, compute_sizes(most, inputs.compression_ratio))[key]
        return LargestRun(given[bound], bound, given, disk.here.bytes, disk.there.bytes)

    return LargestRuns(*(largest(key) for key in ("A", "B", "C")))


@dataclass(frozen=True)
class BreakEven:
    tokens: float | None
    samples: float | None
    raw_bytes: float | None
    stored_bytes: float | None
    meaning: str


def compute_break_even(inputs: Inputs, sizes: Sizes, rates: Rates) -> BreakEven:
    """Break-even between A and B."""
    usd_per_s, link = rates.usd_per_s, rates.remote_down_bytes_per_s
    fixed_a = 0.0
    fixed_b = (rates.server_start_s if inputs.work.extract_on_vllm else 0.0) * usd_per_s
    here_usd_per_token = inputs.here_usd_per_hour / 3600 / rates.extract_here_tokens_per_s
    per_token_a = sizes.stored_bytes_per_token / link * usd_per_s + here_usd_per_token
    per_token_b = usd_per_s / rates.extract_there_tokens_per_s
    if per_token_a > per_token_b and fixed_b > fixed_a:
        n = (fixed_b - fixed_a) / (per_token_a - per_token_b)
        return BreakEven(
            tokens=n,
            samples=n / inputs.mean_tokens,
            raw_bytes=n * sizes.bytes_per_token,
            stored_bytes=n * sizes.stored_bytes_per_token,
            meaning="A is cheaper below this size, B above",
        )
    cheaper = "A" if per_token_a <= per_token_b else "B"
    return BreakEven(None, None, None, None, f"{cheaper} is cheaper at any size")


@dataclass(frozen=True)
class StorageOutcome:
    there_disk_bytes: float
    rented_s: float
    cost_usd: float
    feasible: bool

    @classmethod
    def of(cls, scenario: Scenario) -> "StorageOutcome":
        return cls(scenario.disk.there.bytes, scenario.rented_s, scenario.cost_usd, scenario.feasible)


@dataclass(frozen=True)
class StorageOutcomes:
    A: StorageOutcome
    B: StorageOutcome


@dataclass(frozen=True)
class StorageOption:
    storage: str
    compression_ratio: float
    stored_bytes: float
    ship_hidden_states_s: float
    scenarios: StorageOutcomes
    recommendation: str | None


def compute_storage_option(inputs: Inputs, rates: Rates, storage: str, ratio: float) -> StorageOption:
    """What one extract.storage changes: the sizes and scenarios at its ratio (the rates do not depend on it)."""
    sizes = compute_sizes(inputs, ratio)
    scenarios = compute_scenarios(inputs, sizes, rates)
    return StorageOption(
        storage=storage,
        compression_ratio=ratio,
        stored_bytes=sizes.hidden_states.stored_bytes,
        ship_hidden_states_s=scenarios.A.rented_steps_s["ship_hidden_states"],
        scenarios=StorageOutcomes(StorageOutcome.of(scenarios.A), StorageOutcome.of(scenarios.B)),
        recommendation=recommend(scenarios),
    )


@dataclass(frozen=True)
class Plan:
    inputs: Inputs
    warnings: list[str]
    sizes: Sizes = field(metadata=INLINE)
    rates: Rates
    scenarios: Scenarios
    recommendation: str | None
    largest_runs: LargestRuns
    break_even_a_vs_b: BreakEven
    storage_options: list[StorageOption]
    train_memory: TrainMemory


def compute(inputs: Inputs) -> Plan:
    """The whole plan as plain numbers (bytes, seconds, dollars). Formulas: the module docstring."""
    sizes = compute_sizes(inputs, inputs.compression_ratio)
    rates = compute_rates(inputs)
    scenarios = compute_scenarios(inputs, sizes, rates)
    return Plan(
        inputs=inputs,
        warnings=list(inputs.warnings),
        sizes=sizes,
        rates=rates,
        scenarios=scenarios,
        recommendation=recommend(scenarios),
        largest_runs=compute_largest_runs(inputs, scenarios, rates),
        break_even_a_vs_b=compute_break_even(inputs, sizes, rates),
        storage_options=[
            compute_storage_option(inputs, rates, storage, ratio) for storage, ratio in inputs.storage_ratios.items()
        ],
        train_memory=compute_train_memory(inputs.train_memory, inputs.process_tokens, inputs.there),
    )
