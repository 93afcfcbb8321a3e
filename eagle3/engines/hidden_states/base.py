"""One interface for capturing the verifier's hidden states, whatever runs the verifier.

`capture.forward(batch)` takes planned sequences (eagle3/chat/token_layout.py) and returns, per sequence and in
the batch's order, a bf16 tensor [layers, tokens, hidden]: the layers in `layer_ids` order (vLLM numbering: id
k = HF hidden_states[k], the residual stream entering layer k), the last one the verifier's final layer after
its final norm (HF hidden_states[N]). Both backends store the same tensors within bf16 tolerance
(tests/test_extract.py measures how close).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from eagle3.chat.token_layout import Sequence
from eagle3.errors import Eagle3Error
from eagle3.formats.provenance import Provenance
from eagle3.params.extract import ExtractParams
from eagle3.precision import engine_device_type, resolve

# Bump when the same inputs and params give other shard bytes (2: length-sorted batches, zstd hash_log 10; 3: shards
# planned per synthetic part; 4: a turn cut at max_tokens masked only through its generated tokens), so the run key
# changes and shards made by older code are discarded, never mixed.
EXTRACTION_VERSION = 4


class HiddenStateCapture(Protocol):
    # Whether a batch costs its longest sequence x its size (padded tensors) or only its real tokens.
    pads_batches: bool

    def forward(self, batch: list[Sequence]) -> list[torch.Tensor]: ...

    def sleep(self) -> None:
        """Free the accelerator memory the verifier holds until wake_up (train.stream_phase_steps); a no-op where
        there is none to free."""
        ...

    def wake_up(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class CaptureRequest:
    model_dir: Path
    provenance: Provenance
    layer_ids: tuple[int, ...]
    config: ExtractParams
    # Where the vllm backend's connector hands each request's states over (eagle3/paths.py VLLM_SPOOL).
    spool: Path
    # What the forward pass computes in (extract.dtype resolved: eagle3/precision.py); states are stored as bf16.
    dtype: str
    # Whether the engine will be put to sleep between phases (streamed training); vLLM must know at start.
    sleep_mode: bool = False
    # The vllm engine's step budget in tokens; None: extract's, max(max_seq_len + 1, batch_tokens). Streamed training
    # caps it at one sequence (max_seq_len + 1), so the verifier's share of each GPU holds its step (the captured
    # states of a step are kept three times: eagle3/plan/gpu_fit.py).
    step_tokens: int | None = None


def layer_ids(config: ExtractParams, provenance: Provenance) -> tuple[int, ...]:
    """The layers a capture stores for this verifier (vLLM numbering): extract.aux_layer_ids or vLLM's default, then
    the final layer. Shared by extract, streamed training and preflight, so all three capture the same layers."""
    layers = provenance.num_hidden_layers
    aux = config.aux_layer_ids or provenance.default_aux_layer_ids
    if max(aux) >= layers:
        raise Eagle3Error(f"extract.aux_layer_ids: {aux} must be < {layers} (the verifier's layer count)")
    if len(set(aux)) != len(aux):  # only the default can repeat one (params refuse it): (2, N//2, N-3) at N <= 7
        raise Eagle3Error(
            f"extract.aux_layer_ids: the verifier's default {list(aux)} ((2, N//2, N-3) at N = {layers}) repeats a "
            "layer; set extract.aux_layer_ids to distinct layers"
        )
    return (*aux, layers)


def compute_dtype(config: ExtractParams) -> str:
    """extract.dtype resolved where the forward pass runs: both backends use the GPUs when there are any."""
    return resolve(config.dtype, engine_device_type())
