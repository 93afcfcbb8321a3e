"""Run as a script by tests/test_extract_chunked.py: the vllm capture backend on a verifier directory, for the
sequences in a safetensors file, with the stage's engine settings or (--step-tokens) chunked prefill forced on at
that budget; writes each sequence's states, and what the stage's check said of the engine."""

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file

from eagle3.chat.token_layout import Sequence
from eagle3.engines.hidden_states import vllm_capture
from eagle3.engines.hidden_states.base import CaptureRequest
from eagle3.errors import Eagle3Error
from eagle3.formats.hf_config import text_config
from eagle3.params.extract import ExtractParams


def main(args: argparse.Namespace) -> None:
    ids = load_file(args.sequences)
    sequences = [Sequence(name, t, torch.ones_like(t, dtype=torch.bool), False) for name, t in ids.items()]
    longest = max(len(s.input_ids) for s in sequences)
    stage_check, refusals = vllm_capture.check_whole_prefills, []

    def checked(llm, max_model_len: int) -> None:
        try:
            stage_check(llm, max_model_len)
        except Eagle3Error as exc:
            refusals.append(str(exc))

    vllm_capture.check_whole_prefills = checked
    if args.step_tokens is not None:
        chunked = {"enable_chunked_prefill": True, "max_num_batched_tokens": args.step_tokens, "max_num_seqs": 4}
        vllm_capture.whole_prefills = lambda step_tokens: chunked
    config = json.loads((args.model_dir / "config.json").read_text())
    request = CaptureRequest(
        model_dir=args.model_dir,
        # What the capture reads of the verifier stage's record.
        provenance=SimpleNamespace(
            num_hidden_layers=text_config(config)["num_hidden_layers"], trust_remote_code=args.trust_remote_code
        ),
        layer_ids=tuple(args.layers),
        config=ExtractParams(
            backend="vllm",
            max_seq_len=longest,
            batch_tokens=len(sequences) * longest,
            vllm={"gpu_memory_utilization": 0.3, "cpu_kvcache_space_gib": 1, "enforce_eager": True},
        ),
        spool=args.out.parent / "spool",
        dtype=args.dtype,
    )
    capture = vllm_capture.VllmHiddenStates(request)
    states = capture.forward(sequences)
    capture.close()
    save_file({s.sample_id: h for s, h in zip(sequences, states, strict=True)}, args.out)
    args.out.with_suffix(".json").write_text(json.dumps({"refusals": refusals}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("sequences", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, nargs="+", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--step-tokens", type=int)
    parser.add_argument("--trust-remote-code", action="store_true")
    main(parser.parse_args())
