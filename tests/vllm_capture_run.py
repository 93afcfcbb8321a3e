"""Run as a script by tests/test_extract_chunked.py: the vllm capture backend on a verifier directory, for the
sequences in a safetensors file, with the stage's engine settings, or (--step-tokens) chunked prefill forced on at
that budget, or (--cuda-connector-path) vLLM's connector on the path it takes on CUDA (tests/cuda_connector_on_cpu.py);
writes each sequence's states, what the stage's check said of the engine, how many asynchronous writes ran, and
what was left in the spool."""

import argparse
import json
import os
from pathlib import Path
from types import SimpleNamespace

import torch
from cuda_connector_on_cpu import WRITES, force_cuda_connector_path
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
    if args.cuda_connector_path:
        force_cuda_connector_path(writers_stall=args.writers_stall)
    if args.step_tokens is not None:
        chunked = {"enable_chunked_prefill": True, "max_num_batched_tokens": args.step_tokens, "max_num_seqs": 4}
        vllm_capture.whole_prefills = lambda step_tokens: chunked
    config = json.loads((args.model_dir / "config.json").read_text())
    cuda = torch.cuda.is_available()
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
            # On a GPU as the shipped configurations run it (torch.compile and CUDA graphs); eager on a CPU, as the
            # embedded default runs it.
            vllm={"gpu_memory_utilization": 0.3, "cpu_kvcache_space_gib": 1, "enforce_eager": not cuda},
        ),
        spool=args.out.parent / "spool",
        dtype=args.dtype,
    )
    if args.save_timeout is not None:
        vllm_capture.SAVE_TIMEOUT_S = args.save_timeout
    capture = vllm_capture.VllmHiddenStates(request)
    error = None
    try:
        states = capture.forward(sequences)
    except Eagle3Error as exc:
        error, states = str(exc), []
    else:
        capture.close()
    save_file({s.sample_id: h for s, h in zip(sequences, states, strict=False)}, args.out)
    left = sorted(path.name for path in request.spool.iterdir())
    record = {"refusals": refusals, "writes": WRITES, "spool_left": left, "error": error}
    args.out.with_suffix(".json").write_text(json.dumps(record))
    # Stalled writer threads would keep the interpreter from exiting.
    os._exit(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("sequences", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, nargs="+", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--step-tokens", type=int)
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("--cuda-connector-path", action="store_true")
    parser.add_argument("--writers-stall", action="store_true")
    parser.add_argument("--save-timeout", type=float)
    main(parser.parse_args())
