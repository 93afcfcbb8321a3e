"""Which capture backend runs: the one extract.backend names (the interface: base.py)."""

from eagle3.engines.hidden_states.base import CaptureRequest, HiddenStateCapture


def open_capture(request: CaptureRequest) -> HiddenStateCapture:
    """The backend extract.backend names: `hf` (transformers forward) or `vllm` (vLLM's extract_hidden_states)."""
    if request.config.backend == "vllm":
        from eagle3.engines.hidden_states.vllm_capture import VllmHiddenStates

        return VllmHiddenStates(request)
    from eagle3.engines.hidden_states.hf_capture import HfHiddenStates

    return HfHiddenStates(request.model_dir, request.provenance.trust_remote_code, request.layer_ids, request.dtype)
