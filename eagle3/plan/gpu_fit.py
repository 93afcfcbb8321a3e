"""What one GPU holds beside the training memory (eagle3/plan/memory.py): the streamed verifier's vLLM engine and
the trainer sharing one GPU in layout C (the verifier's share, gpu_memory_utilization, sized from its weights and its
capture step's workspace; side by side or in phases), whether a machine can load the verifier at all, and `eagle3
check`'s GPU-memory checks of a params file (training, the streamed verifier beside it, evaluate's engines).

Apart from memory.py because these are the verifier engine's figures and the configured run held to them, not the
draft's training-memory estimate, which they only read.
"""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.errors import Eagle3Error
from eagle3.formats.hf_config import uses_mla
from eagle3.gpu_kinds import GPUS
from eagle3.params.train import draft_settings
from eagle3.plan.facts import GB, GPU_MEMORY_UTILIZATION, Machine, weights_fit
from eagle3.plan.memory import TrainMemory, compute_train_memory, estimate, memory_warning
from eagle3.training.data import tokens_per_process

if TYPE_CHECKING:
    from eagle3.params.params_file import Params


# Beside its weights, the streamed verifier's vLLM holds, per GPU, for its step of at most one sequence (the capture
# caps it at extract.max_seq_len + 1 tokens: eagle3/training/streamed.py): vLLM's captured states three times (its
# persistent buffer, the model's list of aux states and the stack handed to the connector:
# v1/worker/gpu/spec_decode/extract_hidden_states.py), the KV cache of KV_SEQUENCES such sequences, captured layers
# included (the connector copies them out of it), the step's other activations and a fixed part.
CAPTURE_COPIES = 3
# The sequence being computed and one whose blocks wait for the connector's save.
KV_SEQUENCES = 2
# Assumed until a GPU run measures them (vLLM's own profile run logs both): the step's other activations per token
# (a MoE verifier's expert outputs dominate: Kimi-K2.5's 8 experts x 7,168 x bf16 ~ 115 KB) and the CUDA graphs,
# NCCL and cuBLAS workspaces of one GPU.
ACTIVATION_BYTES_PER_TOKEN = 120_000
ENGINE_FIXED_BYTES = 3 * GB
# What a sleeping vLLM keeps on each GPU (sleep level 1: weights on the host, KV cache freed).
ASLEEP_BYTES = 1 * GB
# Two processes' memory pools on one GPU (vLLM's and the trainer's), each with its CUDA context, allocator slack
# and NCCL buffers: only this share of the GPU is counted on.
SHARED_GPU_USABLE = 0.9


@dataclass(frozen=True)
class StreamedFit:
    """Layout C on one GPU: the verifier (its share of the GPU, vLLM's gpu_memory_utilization) beside the trainer,
    side by side or in phases (the verifier asleep while the trainer trains, the trainer at rest while it computes).
    The trainer's figures are the estimate's at the longest sample: its peak, and its fixed part (weights, AdamW,
    gradients, the verifier's embedding and head) at rest."""

    gpu: str
    memory_bytes: float
    verifier_share: float
    phases: bool
    trainer_peak_bytes: float
    trainer_resting_bytes: float

    @property
    def verifier_bytes(self) -> float:
        return self.verifier_share * self.memory_bytes

    @property
    def peak_bytes(self) -> float:
        """The most one GPU holds at once."""
        if self.phases:
            return max(self.verifier_bytes + self.trainer_resting_bytes, ASLEEP_BYTES + self.trainer_peak_bytes)
        return self.verifier_bytes + self.trainer_peak_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= SHARED_GPU_USABLE * self.memory_bytes

    def summary(self) -> str:
        """The fit in one short line (a params comment)."""
        how = (
            f"phases: {self.verifier_bytes / GB:,.0f} GB awake + trainer at rest {self.trainer_resting_bytes / GB:,.0f}"
            f", then trainer {self.trainer_peak_bytes / GB:,.0f} GB"
            if self.phases
            else f"side by side: {self.verifier_bytes / GB:,.0f} GB + trainer {self.trainer_peak_bytes / GB:,.0f} GB"
        )
        return f"{how}: {self.peak_bytes / GB:,.0f} of {GPUS[self.gpu].memory_gb:g} GB"

    def words(self) -> str:
        gpu = GPUS[self.gpu]
        verifier = f"the verifier's {self.verifier_share:g} of a {gpu.name} ({self.verifier_bytes / GB:,.0f} GB)"
        trainer = f"the trainer's {self.trainer_peak_bytes / GB:,.0f} GB peak (estimated)"
        if self.phases:
            return (
                f"in phases, {verifier} awake beside the trainer at rest "
                f"({self.trainer_resting_bytes / GB:,.0f} GB), then {trainer} beside it asleep: at most "
                f"{self.peak_bytes / GB:,.0f} GB of {gpu.memory_gb:g} (usable: {SHARED_GPU_USABLE:.0%})"
            )
        return (
            f"side by side, {verifier} and {trainer}: {self.peak_bytes / GB:,.0f} GB of {gpu.memory_gb:g} (usable: "
            f"{SHARED_GPU_USABLE:.0%})"
        )


def kv_bytes_per_token(text: dict[str, Any], captured_layers: int, tensor_parallel_size: int) -> int:
    """KV cache bytes per token on one GPU of a capture engine (bf16): MLA's latent per layer (every GPU holds it
    whole), or keys and values of the GPU's share of the KV heads; and the captured layers' states, which the capture
    keeps in the KV cache (whole on every GPU)."""
    layers, hidden = text["num_hidden_layers"], text["hidden_size"]
    if uses_mla(text):
        attention = layers * (text["kv_lora_rank"] + text["qk_rope_head_dim"])
    elif text.get("num_attention_heads"):
        heads = text.get("num_key_value_heads") or text["num_attention_heads"]
        head_dim = text.get("head_dim") or hidden // text["num_attention_heads"]
        attention = layers * 2 * math.ceil(heads / tensor_parallel_size) * head_dim
    else:  # a config without its heads (a shape given by hand): keys and values of the whole width, split evenly
        attention = layers * 2 * math.ceil(hidden / tensor_parallel_size)
    return 2 * (attention + captured_layers * hidden)


def verifier_workspace_bytes(text: dict[str, Any], captured_layers: int, tensor_parallel_size: int, step: int) -> float:
    """What the streamed verifier's engine needs per GPU beside its weights, at a step of `step` tokens (the
    constants above say what each part is)."""
    states = CAPTURE_COPIES * step * captured_layers * text["hidden_size"] * 2
    kv = KV_SEQUENCES * step * kv_bytes_per_token(text, captured_layers, tensor_parallel_size)
    return states + kv + ACTIVATION_BYTES_PER_TOKEN * step + ENGINE_FIXED_BYTES


def verifier_share(
    weights_bytes: float, tensor_parallel_size: int, gpu: str, text: dict[str, Any], captured_layers: int, step: int
) -> float:
    """The smallest gpu_memory_utilization (to the percent above) that holds the verifier's weights split over
    `tensor_parallel_size` GPUs and its workspace at a step of `step` tokens."""
    need = weights_bytes / tensor_parallel_size + verifier_workspace_bytes(
        text, captured_layers, tensor_parallel_size, step
    )
    return math.ceil(need / (GPUS[gpu].memory_gb * GB) * 100) / 100


def streamed_fit(train: TrainMemory, recompute: str, share: float, phases: bool) -> StreamedFit | None:
    """The fit at `share` of one GPU of `train`'s kind; None where the trainer's memory is not estimated."""
    if train.settings is None:
        return None
    setting = train.settings[recompute]
    return StreamedFit(train.gpu, train.memory_bytes, share, phases, setting.at_max_tokens_bytes, setting.resting_bytes)


@dataclass(frozen=True)
class KnownVerifier:
    """What `eagle3 check` knows of the configured verifier before its stages run; config None: nothing, `source`
    says why."""

    config: dict[str, Any] | None
    weights: float | None
    stored_dtype: str | None
    source: str


def _verifier_config(params: "Params", root: Path) -> KnownVerifier:
    """The configured verifier's language-model config, weight bytes and stored dtype: a preset of that name, else
    its directory here, else the verifier stage's record of it, else a shipped recipe's files for it."""
    from eagle3.formats.hf_config import read_config, stored_dtype, text_config
    from eagle3.formats.provenance import read_provenance, verifier_dir, verifier_location
    from eagle3.init.files import recipe_for
    from eagle3.params.params_file import configured_verifier
    from eagle3.paths import PROVENANCE
    from eagle3.plan.facts import PRESETS
    from eagle3.plan.verifier import weight_file_bytes, weights_bytes

    name = configured_verifier(params)
    preset = next((shape for shape in PRESETS.values() if shape.name == name), None)
    if preset is not None:
        return KnownVerifier(preset.config, preset.weights_bytes, None, f"the {name} preset")
    try:
        if params.verifier.source.kind == "local":
            try:
                directory, _ = verifier_location(root)
            except Eagle3Error:
                directory = None
            if directory is not None and (directory / "config.json").is_file():
                config = read_config(directory)
                weights = weight_file_bytes(directory)
                if weights:
                    return KnownVerifier(text_config(config), weights, stored_dtype(config), f"{name}'s config.json")
        if (root / PROVENANCE).is_file() and read_provenance(root).name == name:
            record = read_provenance(root)
            config = text_config(read_config(verifier_dir(root)))
            return KnownVerifier(config, float(record.weight_bytes), record.dtype, f"{name}'s config.json")
        shipped = recipe_for(name)
        if shipped is not None:
            config = read_config(shipped.files)
            source = f"{name}'s config.json (the {shipped.name} recipe)"
            return KnownVerifier(text_config(config), weights_bytes(shipped.files), stored_dtype(config), source)
    except Eagle3Error as exc:
        return KnownVerifier(None, None, None, str(exc))
    return KnownVerifier(None, None, None, f"{name}'s shape is not known until `dvc repro verifier` records it")


def verifier_fit_problem(name: str, weights: float, gpus: int, gpu: str) -> str | None:
    """Why `gpus` GPUs of kind `gpu` cannot load the verifier's weights (`eagle3 plan`'s rule, weights_fit), with
    the kinds that can; None where they can. Every layout serves the verifier on the rented machine (evaluate), so
    no layout works there without it."""
    if weights_fit(weights, Machine(gpu, gpus, 0.0, 0.0, None)):
        return None
    held = gpus * GPUS[gpu].memory_gb * GPU_MEMORY_UTILIZATION
    kinds = [kind for kind in GPUS if weights_fit(weights, Machine(kind, gpus, 0.0, 0.0, None))]
    way_out = f"rent {', '.join(kinds)}" if kinds else f"no GPU kind known here holds it on {gpus}"
    return (
        f"{name}'s {weights / GB:,.0f} GB of weights do not fit {gpus} x {GPUS[gpu].name} ({gpus} x "
        f"{GPUS[gpu].memory_gb:g} GB x {GPU_MEMORY_UTILIZATION} = {held:,.0f} GB), and every layout serves it there "
        f"to evaluate; {way_out}"
    )


def check_gpu_memory(params: "Params", path: Path) -> list[str]:
    """`eagle3 check`: the training memory per GPU of train.launch.gpu at extract.max_seq_len, and with streamed
    states the verifier beside it; Eagle3Error naming the key to change where it does not fit. Returns what was
    checked, or why not, in one line."""
    train, extract = params.train, params.extract
    gpu = train.launch.gpu
    if gpu is None:
        return ["train.launch.gpu is not set: the training memory is not held to a GPU (`eagle3 init NAME --gpu KIND`)"]
    known = _verifier_config(params, path.resolve().parent)
    config, weights, source = known.config, known.weights, known.source
    if config is None:
        return [f"GPU memory not checked: {source}"]
    per_node = train.launch.processes_per_node
    processes = per_node * train.launch.nodes if isinstance(per_node, int) else 8
    if weights is not None:
        from eagle3.params.params_file import configured_verifier

        problem = verifier_fit_problem(
            configured_verifier(params), weights, per_node if isinstance(per_node, int) else 8, gpu
        )
        if problem is not None:
            raise Eagle3Error(f"{path}: train.launch.gpu: {gpu}: {problem} (`eagle3 init NAME --gpu KIND`)")
    shape = draft_settings(train)
    lines = estimate(config, params.vocab.draft_vocab_size, train.ttt_steps, processes, train.sharding, shape)
    tokens = tokens_per_process(train.max_tokens_per_batch, train.batch_size, processes, extract.max_seq_len)
    memory = compute_train_memory(lines, tokens, Machine(gpu, processes, 0.0, 0.0, None))
    if memory.settings is None:
        return [f"GPU memory not checked: {memory.source}"]
    recompute = train.activation_checkpointing
    if train.hidden_states != "streamed":
        problem = memory_warning(memory, tokens, recompute)
        if problem is not None:
            raise Eagle3Error(f"{path}: train.activation_checkpointing: {problem}")
        need = memory.settings[recompute].at_max_tokens_bytes
        return [
            f"training memory: {need / GB:,.0f} GB per {GPUS[gpu].name} at {tokens:,} tokens per process ({source})"
        ]
    share = extract.vllm.gpu_memory_utilization
    tensor_parallel = extract.vllm.tensor_parallel_size
    if weights is not None:
        captured = len(extract.aux_layer_ids or (None,) * 3) + 1
        step = extract.max_seq_len + 1
        workspace = verifier_workspace_bytes(config, captured, tensor_parallel, step)
        needed = weights / tensor_parallel + workspace
        if share * GPUS[gpu].memory_gb * GB < needed:
            raise Eagle3Error(
                f"{path}: extract.vllm.gpu_memory_utilization: {share:g} of a {GPUS[gpu].name} cannot hold the "
                f"verifier's {weights / tensor_parallel / GB:,.0f} GB of weights per GPU and its "
                f"{workspace / GB:,.1f} GB of workspace for a {step:,}-token step (captured states, KV for "
                f"{KV_SEQUENCES} sequences, activations); `eagle3 init NAME --layout C --gpu {gpu}` sizes it"
            )
    fit = streamed_fit(memory, recompute, share, phases=train.stream_phase_steps is not None)
    assert fit is not None
    if not fit.fits:
        raise Eagle3Error(
            f"{path}: extract.vllm.gpu_memory_utilization: streamed states {fit.words()}: more than one GPU holds; "
            f"`eagle3 init NAME --layout C --gpu {gpu}` sizes it (a smaller share, or train.stream_phase_steps)"
        )
    return [f"GPU memory with streamed states: {fit.summary()} per {GPUS[gpu].name} ({source})"]


def check_evaluate_memory(params: "Params", path: Path) -> list[str]:
    """`eagle3 check`: evaluate's in-process engines hold the verifier within evaluate.vllm.gpu_memory_utilization
    of train.launch.gpu, in the dtype they compute in there (float32 doubles 16-bit weights: the CPU's exact
    lossless setting, not a GPU's). Eagle3Error naming the keys where it does not fit."""
    evaluate, gpu = params.evaluate, params.train.launch.gpu
    if evaluate.backend != "engines" or gpu is None:
        return []
    root = path.resolve().parent
    known = _verifier_config(params, root)
    weights, source = known.weights, known.source
    if weights is None:
        return [f"evaluate's GPU memory not checked: {source}"]
    engine = evaluate.vllm
    widened = engine.dtype == "float32" and known.stored_dtype in ("bfloat16", "float16")
    need = weights * (2 if widened else 1) / engine.tensor_parallel_size
    held = engine.gpu_memory_utilization * GPUS[gpu].memory_gb * GB
    dtype = "float32" if widened else "the dtype they are stored in"
    if need > held:
        raise Eagle3Error(
            f"{path}: evaluate.vllm.gpu_memory_utilization: {engine.gpu_memory_utilization:g} of a {GPUS[gpu].name} "
            f"({held / GB:,.0f} GB) cannot hold the verifier's weights in {dtype} ({need / GB:,.0f} GB per GPU at "
            f"tensor_parallel_size {engine.tensor_parallel_size}); raise it"
            + (
                ", and on a GPU set evaluate.vllm.dtype: auto (float32 is the CPU's exact lossless setting)"
                if widened
                else ""
            )
        )
    return [f"evaluate's engines: the verifier's {need / GB:,.1f} GB per GPU within {held / GB:,.0f} GB ({source})"]
