"""`eagle3 init --verifier DIR --gpu KIND [--gpus N]`: a complete params file for any verifier on one GPU machine
(layout `single`: every stage there, one after the other), sized from the model's own files and the GPUs.

Read from the model directory (eagle3/init/verifier_files.py): config.json (its `text_config` where it nests one:
architecture, hidden size, layers, vocabulary, context length, heads, stored dtype, whether it needs its own code),
the *.safetensors sizes (the weights per GPU), the chat template (whether it has a thinking switch),
generation_config.json (the sampling the model recommends) and README.md's front matter (the license). Each value
written carries its reason as a comment, as the shipped Kimi-K2.5 configuration does; a value that cannot be decided
from those (the Hub id, a license the card does not state, thinking on or off, running the model's own code) is
refused with the flag that sets it, never guessed. The file is validated as params before it is written.
"""

import argparse
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.gpu_kinds import GPUS
from eagle3.init.verifier_files import Verifier
from eagle3.plan.facts import GB

# vLLM's share of each GPU while a stage runs it: the stages run one after the other, each alone on the GPUs.
ENGINE_SHARE = 0.9
# Of that share, the most the weights may take: the rest holds the KV cache of long answers and the activations.
WEIGHTS_OF_SHARE = 0.6
# Room for the prompt and the earlier turns beside the longest answer.
PROMPT_ROOM = 4096
DRAFT_VOCAB = 32000
LONG_CONTEXT = 32768


def tensor_parallel(verifier: Verifier, gpu: str, gpus: int) -> int:
    """The fewest GPUs (a power of two dividing `gpus` and the attention heads) whose share holds the weights with
    room for the KV cache."""
    heads = int(verifier.text.get("num_attention_heads") or 1)
    held = WEIGHTS_OF_SHARE * ENGINE_SHARE * GPUS[gpu].memory_gb * GB
    size = 1
    while size <= gpus:
        if gpus % size == 0 and heads % size == 0 and verifier.weights_bytes / size <= held:
            return size
        size *= 2
    raise Eagle3Error(
        f"--gpus: {verifier.name}'s {verifier.weights_bytes / GB:,.0f} GB of weights need more than {gpus} "
        f"{GPUS[gpu].name} (each holds {held / GB:,.0f} GB of weights beside the KV cache); give more GPUs"
    )


def answer_tokens(verifier: Verifier, thinking: bool) -> int:
    wanted = 16384 if thinking else 4096
    fits = verifier.context - PROMPT_ROOM
    if fits < 1024:
        raise Eagle3Error(
            f"--verifier: a context of {verifier.context} tokens (max_position_embeddings) leaves no room for "
            f"answers beside {PROMPT_ROOM} tokens of prompt"
        )
    return min(wanted, fits)


def recompute_that_fits(verifier: Verifier, gpu: str, gpus: int, tokens: int, ttt_steps: int) -> tuple[str, str]:
    """The least recompute (train.activation_checkpointing) at which `tokens` per GPU train, and the figure why."""
    from eagle3.params.train import EAGLE_3_1, RECOMPUTE, TrainParams, draft_settings
    from eagle3.plan.facts import Machine
    from eagle3.plan.memory import compute_train_memory, estimate

    train = TrainParams(draft_layout=EAGLE_3_1)
    lines = estimate(verifier.text, DRAFT_VOCAB, ttt_steps, gpus, "ddp", draft_settings(train))
    memory = compute_train_memory(lines, tokens, Machine(gpu, gpus, 0.0, 0.0, None))
    if memory.settings is None:
        raise Eagle3Error(f"--verifier: the draft's training memory cannot be estimated: {memory.source}")
    for setting in RECOMPUTE:
        need = memory.settings[setting].at_max_tokens_bytes
        if memory.settings[setting].fits:
            return (
                setting,
                f"{need / GB:,.0f} GB of {GPUS[gpu].memory_gb:,.0f} at {tokens:,} tokens (fake-tensor estimate)",
            )
    raise Eagle3Error(f"--gpu {gpu}: the draft does not train {tokens:,} tokens on one GPU even with full recompute")


def _map(*entries: tuple[str, Any, str | None]):
    """A YAML mapping whose keys carry their reasons as end-of-line comments."""
    from ruamel.yaml.comments import CommentedMap

    node = CommentedMap()
    for key, value, reason in entries:
        node[key] = value
        if reason:
            node.yaml_add_eol_comment(reason, key, column=0)
    return node


def _gb(value: float) -> str:
    return f"{value:,.1f}" if value < 10 else f"{value:,.0f}"


def _flow(values: list[Any]):
    from ruamel.yaml.comments import CommentedSeq

    node = CommentedSeq(values)
    node.fa.set_flow_style()
    return node


@dataclass(frozen=True)
class Sizing:
    """What `init --verifier` decides for one verifier on one machine, before it is written section by section."""

    verifier: Verifier
    gpu: str
    gpus: int
    license_id: str
    thinks: bool
    answers: int  # generate's answer length
    longest: int  # the longest sample extract stores
    ttt_steps: int
    recompute: str
    recompute_reason: str
    engine: list[tuple[str, Any, str | None]]  # the vLLM settings every engine shares
    probe: bool  # whether the context holds evaluate's long-context probe

    @property
    def switch(self) -> dict[str, bool]:
        """The chat template's thinking switch, as generate and evaluate pass it."""
        return {self.verifier.thinking_switch: self.thinks} if self.verifier.thinking_switch else {}

    @property
    def captured(self) -> tuple[int, int, int]:
        layers = self.verifier.layers
        return 2, layers // 2, layers - 3


def _refuse_what_needs_a_choice(
    verifier: Verifier, thinking: bool | None, trust_remote_code: bool, license_override: str | None
) -> str:
    """The verifier's license id, once every choice the user must make for it is made; one line otherwise."""
    from eagle3.publish.licenses import CONDITIONAL, PERMISSIVE, classify, normalize

    if verifier.remote_code and not trust_remote_code:
        raise Eagle3Error(
            f"--trust-remote-code: {verifier.name}'s config.json runs code of its own (auto_map); pass it to let the "
            "stages run that code (verifier.trust_remote_code), having read it"
        )
    if verifier.thinking_switch is not None and thinking is None:
        raise Eagle3Error(
            f"--thinking on|off: {verifier.name}'s chat template switches thinking ({verifier.thinking_switch}); "
            "say which the draft is trained and measured with (generate.chat_template_kwargs)"
        )
    license_id = normalize(verifier.license)
    category, terms = classify(license_id)
    if category != PERMISSIVE and license_override is None:
        raise Eagle3Error(
            f"--license-override REASON: {verifier.name} is {license_id} ({category}: {terms}); publishing a draft "
            "derived from it needs your reason that it is allowed (report.license_overrides)"
            + ("" if category == CONDITIONAL else ", or another verifier")
        )
    layers = verifier.layers
    if not 2 < layers // 2 < layers - 3:
        raise Eagle3Error(
            f"--verifier: {layers} layers, where vLLM's default captured layers {(2, layers // 2, layers - 3)} do not "
            "rise; a verifier this shallow needs extract.aux_layer_ids set by hand"
        )
    return license_id


def size_for(verifier: Verifier, gpu: str, gpus: int, thinking: bool | None, license_id: str) -> Sizing:
    thinks = bool(thinking)
    answers = answer_tokens(verifier, thinks)
    longest = answers + PROMPT_ROOM
    ttt_steps = 7
    recompute, reason = recompute_that_fits(verifier, gpu, gpus, longest, ttt_steps)
    tensor_parallel_size = tensor_parallel(verifier, gpu, gpus)
    weights_gb = verifier.weights_bytes / GB
    tp_reason = (
        f"{_gb(weights_gb)} GB of weights: {_gb(weights_gb / tensor_parallel_size)} GB per GPU leaves the KV cache "
        f"room in {ENGINE_SHARE} of a {GPUS[gpu].name}"
    )
    engine: list[tuple[str, Any, str | None]] = [
        ("tensor_parallel_size", tensor_parallel_size, tp_reason),
        ("gpu_memory_utilization", ENGINE_SHARE, "the stages run one at a time, each alone on the GPUs"),
        ("enforce_eager", False, "CUDA graphs"),
    ]
    probe = verifier.context >= LONG_CONTEXT + answers
    return Sizing(
        verifier=verifier,
        gpu=gpu,
        gpus=gpus,
        license_id=license_id,
        thinks=thinks,
        answers=answers,
        longest=longest,
        ttt_steps=ttt_steps,
        recompute=recompute,
        recompute_reason=reason,
        engine=engine,
        probe=probe,
    )


def _verifier_section(sizing: Sizing, source_path: str | None, license_override: str | None):
    verifier = sizing.verifier
    if verifier.dtype:
        dtype_reason = "as its checkpoint stores it (its config.json)"
    else:
        dtype_reason = "its config.json names none: what the GPUs compute in" + (
            f" (its weights are {verifier.quantization}-quantized)" if verifier.quantization else ""
        )
    return _map(
        (
            "source",
            _map(
                ("kind", "local", "its Hugging Face directory on this machine (hashed, not copied)"),
                ("path", source_path or str(verifier.directory), None),
                ("name", verifier.name, None),
                ("license", sizing.license_id, "from its model card" if not license_override else None),
            ),
            None,
        ),
        ("dtype", verifier.dtype or "bfloat16", dtype_reason),
        (
            "trust_remote_code",
            verifier.remote_code,
            "its config.json names code of its own (auto_map)" if verifier.remote_code else None,
        ),
    )


def _generate_section(sizing: Sizing):
    sampling, thinks = sizing.verifier.sampling, sizing.thinks
    return _map(
        ("backend", "vllm", "in-process on this machine's GPUs"),
        ("turns", "all", "every assistant turn, each on the regenerated history"),
        ("splits", _flow(["train", "heldout"]), None),
        ("chunk_size", 256, "conversations per part: the unit of resume"),
        ("chat_template_kwargs", _map(*[(key, value, None) for key, value in sizing.switch.items()]),
         f"thinking {'on' if thinks else 'off'} (eagle3 init --thinking); evaluate asks with the same"
         if sizing.switch else None),
        ("sampling", _map(
            ("temperature", sampling.get("temperature", 1.0),
             "generation_config.json's" if "temperature" in sampling else "the model's own distribution"),
            ("top_p", sampling.get("top_p", 1.0), "generation_config.json's" if "top_p" in sampling else "unshaped"),
            ("max_tokens", sizing.answers, ("long reasoning answers whole" if thinks else "whole answers")
             + f", within its {sizing.verifier.context:,}-token context"),
            ("seed", 0, None),
        ), None),
        ("vllm", _map(*sizing.engine, ("max_model_len", sizing.longest, "the longest sample extract stores")), None),
    )  # fmt: skip


def _extract_section(sizing: Sizing):
    layers, answers = sizing.verifier.layers, sizing.answers
    return _map(
        ("backend", "vllm", "the same engine as generate, on the same GPUs"),
        ("vllm", _map(*sizing.engine), None),
        ("aux_layer_ids", None, f"vLLM's default for {layers} layers: {', '.join(map(str, sizing.captured))}"),
        ("dtype", "auto", "bfloat16 on the GPUs"),
        ("splits", _flow(["train", "heldout"]), None),
        ("max_seq_len", sizing.longest, f"a {answers:,}-token answer plus up to {PROMPT_ROOM:,} tokens of prompt"),
        ("batch_tokens", 65536, None),
        ("shard_raw_mb", 1024, "the unit of resume and of `dvc push`"),
        ("storage", "bf16-lossless", "lossless; `eagle3 plan` prices the 8-bit storages beside it"),
        ("compression_level", 1, None),
        ("compression_threads", 8, None),
        ("reserve_free_gb", 50.0, None),
    )


def _train_section(sizing: Sizing):
    from eagle3.params.train import EAGLE_3_1

    gpus = sizing.gpus
    return _map(
        ("ttt_steps", sizing.ttt_steps, "SpecForge's training depth; serving drafts 3"),
        ("epochs", 4, None),
        ("optimizer", "muon", "deeper acceptance than AdamW at the same steps (benchmarks/README.md)"),
        ("batch_size", 2 * gpus, f"sequences per optimizer step, over {gpus} GPU(s)"),
        ("max_tokens_per_batch", gpus * sizing.longest, "one longest sample per GPU, more of the short ones"),
        ("precision", "auto", "bf16 autocast on the GPUs"),
        ("activation_checkpointing", sizing.recompute, sizing.recompute_reason),
        ("sharding", "ddp", "the one-layer draft replicates on every GPU"),
        ("draft_layout", _map(*[(key, value, None) for key, value in EAGLE_3_1.model_dump().items()]),
         "EAGLE 3.1: a norm per captured layer before fc, post-norm feedback (benchmarks/README.md)"),
        ("launch", _map(
            ("processes_per_node", gpus, "one per GPU"),
            ("gpu", sizing.gpu, f"{GPUS[sizing.gpu].name}: `eagle3 check` holds training and evaluate to its memory"),
        ), None),
        ("seed", 0, None),
    )  # fmt: skip


def _evaluate_section(sizing: Sizing):
    answers, probe = sizing.answers, sizing.probe
    if probe:
        long_context = _map(("conversations", 32, None), ("context_tokens", LONG_CONTEXT, None))
        probe_reason = "chat histories of held-out conversations"
    else:
        long_context = None
        probe_reason = f"off: its {sizing.verifier.context:,}-token context holds no {LONG_CONTEXT:,}-token history"
    return _map(
        ("backend", "engines", "in-process vLLM engines on this machine, one configuration at a time"),
        ("headline_k", 3, "the published drafts' \"3 steps, top-k 1, 4 draft tokens\""),
        ("temperature", sizing.verifier.sampling.get("temperature", 1.0), "the sampled runs as generate sampled"),
        ("max_tokens", min(answers, 4096), "acceptance over up to 4,096 tokens of each answer"),
        ("max_prompts", None, "every held-out prompt"),
        ("seed", 0, None),
        ("long_context", long_context, probe_reason),
        ("vllm", _map(
            ("dtype", "auto", "bfloat16 on the GPUs: the lossless check is then a measured agreement"),
            *sizing.engine,
            ("max_model_len", (LONG_CONTEXT if probe else PROMPT_ROOM) + min(answers, 4096), None),
        ), None),
    )  # fmt: skip


def _report_section(sizing: Sizing, license_override: str | None):
    overrides = (
        [_map(("license", sizing.license_id, None), ("reason", license_override, None))] if license_override else []
    )
    return _map(
        ("draft_repo", None, "the Hub repo you publish as (the card's serve command)"),
        ("license", None, f"the verifier's: {sizing.license_id}"),
        ("license_overrides", overrides, None),
        ("sub_source_licenses", {}, None),
    )


def params_for(
    verifier: Verifier,
    gpu: str,
    gpus: int,
    thinking: bool | None,
    trust_remote_code: bool,
    license_override: str | None,
    source_path: str | None = None,
    origin: str | None = None,
) -> str:
    """The params file (its text, comments included) for `verifier` on `gpus` x `gpu` in one machine; the weights at
    `source_path` (default: where its files are), `origin` saying where its files came from (a shipped recipe's).
    The data sources and benchmark sets are the shipped hero configuration's."""
    from eagle3.init.files import CONFIGS_DIR, yaml_round_trip

    license_id = _refuse_what_needs_a_choice(verifier, thinking, trust_remote_code, license_override)
    sizing = size_for(verifier, gpu, gpus, thinking, license_id)
    kimi = yaml_round_trip().load((CONFIGS_DIR / "kimi-k2.5.yaml").read_text(encoding="utf-8"))
    draft_vocab = min(DRAFT_VOCAB, int(verifier.text["vocab_size"]))
    prepare = _map(
        ("sources", kimi["prepare"]["sources"], None),
        ("max_rows", 3000, "a first run's conversations; raise it as `eagle3 plan` prices more"),
        ("max_rows_per_source", None, None),
        ("heldout_rows", 128, "the offline estimate and the held-out acceptance"),
        ("seed", 0, None),
    )
    document = _map(
        ("verifier", _verifier_section(sizing, source_path, license_override), None),
        ("prepare", prepare, None),
        ("benchmarks", _map(("sets", kimi["benchmarks"]["sets"], None)), None),
        ("generate", _generate_section(sizing), None),
        ("extract", _extract_section(sizing), None),
        ("vocab", _map(("draft_vocab_size", draft_vocab, "as published EAGLE-3 drafts (SpecForge's configs)")), None),
        ("train", _train_section(sizing), None),
        ("export", _map(("dtype", "bfloat16", None), ("num_speculative_tokens", 3, None)), None),
        ("evaluate", _evaluate_section(sizing), None),
        ("report", _report_section(sizing, license_override), None),
    )
    document.yaml_set_start_comment(
        f"An EAGLE-3 draft for {verifier.name} ({verifier.architecture}, hidden {verifier.text['hidden_size']}, "
        f"{verifier.layers} layers, vocabulary {int(verifier.text['vocab_size']):,}) on one machine of {gpus} x "
        f"{GPUS[gpu].name}:\nevery stage there (`dvc repro`). Written by `eagle3 init --verifier`; each value says why."
        + (f"\n{origin}" if origin else "")
    )
    out = io.StringIO()
    yaml_round_trip().dump(document, out)
    return out.getvalue()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verifier", type=Path, metavar="DIR", help="the verifier's Hugging Face directory")
    parser.add_argument(
        "--gpus", type=int, help="GPUs on the machine (with --verifier: default 1; a recipe: the count it names)"
    )
    parser.add_argument(
        "--name", dest="name_override", metavar="ORG/MODEL", help="the verifier's Hub id where its config does not say"
    )
    parser.add_argument("--license", dest="license_id", metavar="ID", help="its license where its card does not say")
    parser.add_argument("--thinking", choices=("on", "off"), help="where its chat template switches thinking")
    parser.add_argument("--trust-remote-code", action="store_true", help="where its config names code of its own")
    parser.add_argument("--license-override", metavar="REASON", help="why publishing a draft of it is allowed")
