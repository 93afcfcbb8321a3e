"""What vLLM's EAGLE-3 proposer sees and proposes, recorded from a real vLLM engine running an exported draft.

    python tests/vllm_proposals.py VERIFIER_DIR DRAFT_DIR OUT_DIR K PROMPTS_JSON [v1|v2|auto] [eagle3|dflash]

Greedy decoding of each prompt (token ids) alone, in float32, with the draft at k=K. Every call of the proposer is
recorded to OUT_DIR/call-NNNN.safetensors: the inputs vLLM hands it (the verified tokens, their positions, the
verifier's captured aux states before the draft combines them, the token sampled after them, which of the tokens
is the last verified one) and the K draft tokens it returned. tests/test_draft_in_vllm.py recomputes the proposals
with the project's own draft forward from the same inputs.

With FAKE_AMX=1 in the environment, vLLM is told the CPU has AMX tiles (torch.cpu._is_amx_tile_supported), as
on an Intel Xeon with AMX: in float32 no AMX kernel may run then, so this runs on any x86 CPU and shows which
attention backends the engine set-up leads vLLM to on such a machine.

The last argument is the speculative method (default eagle3; dflash for a block draft, whose proposer V1 runs as
DFlashProposer with the same propose signature). The one before picks vLLM's model runner: v1
(vllm/v1/worker/gpu_model_runner.py, whose proposer is vllm/v1/spec_decode/eagle.py's EagleProposer; what vLLM-CPU
runs), v2 (vllm/v1/worker/gpu/model_runner.py, whose
proposer is vllm/v1/worker/gpu/spec_decode/eagle/speculator.py's EagleSpeculator; what vLLM picks on CUDA), or auto
(vLLM's own choice, the default). Both proposers are patched, and each records only if its runner runs; the script
exits non-zero if the runner asked for (any runner, for auto) recorded no call.
"""

import inspect
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from eagle3.engines.vllm_env import start_engine

# The switch vLLM 0.32 reads in VllmConfig.use_v2_model_runner (vllm/config/vllm.py): "1" or "0" overrides its choice.
RUNNER_SWITCH = {"v1": "0", "v2": "1"}


def _v2_inputs(arguments: dict) -> dict[str, torch.Tensor]:
    """V2's proposer inputs in V1's layout.

    V2's TargetDependentARSpeculator.propose gets the verifier's whole step rather than V1's prepared arguments: the
    batch (input_batch: input_ids and positions of all scheduled tokens, flattened, requests one after another as
    query_start_loc says, rejected draft tokens included), the captured aux states per layer (a list, each
    [num_tokens(+padding), hidden]), how many tokens each request rejected (num_rejected) and sampled (num_sampled),
    and the sampled tokens per request-state slot (last_sampled, next_prefill_tokens, indexed through idx_mapping).
    Its _prepare_prefill_inputs_kernel derives from them what V1 is handed; the same derivation here:
    - target_token_ids, target_positions: the batch's first num_tokens input_ids / positions (the same flattened
      layout V1 gets, rejected tokens included, as V1's padded drafting gets them);
    - target_hidden_states: the aux states concatenated on the last axis, as V1's runner concatenates them and as
      both proposers hand them to combine_hidden_states;
    - next_token_ids: last_sampled at the request's slot, or, for a partial prefill chunk (num_sampled == 0), the
      next prompt token, next_prefill_tokens at the slot (row 0: the kernel reads ptr + slot);
    - token_indices_to_sample: each request's last verified token, query_start_loc[i + 1] - num_rejected[i] - 1,
      a flat index into the batch as V1's is.
    """
    batch = arguments["input_batch"]
    num_tokens, num_reqs = batch.num_tokens, batch.num_reqs
    aux = arguments["aux_hidden_states"]
    assert aux, "an eagle3 draft needs the verifier's aux hidden states"
    ends = torch.from_numpy(batch.query_start_loc_np[1 : num_reqs + 1]).long()
    rejected = arguments["num_rejected"][:num_reqs].long().cpu()
    slots = batch.idx_mapping[:num_reqs].long().cpu()
    sampled = arguments["last_sampled"].flatten().cpu()[slots].long()
    prefill = arguments["next_prefill_tokens"].flatten().cpu()[slots].long()
    return {
        "target_token_ids": batch.input_ids[:num_tokens].cpu().clone(),
        "target_positions": batch.positions[:num_tokens].cpu().clone(),
        "target_hidden_states": torch.cat([states[:num_tokens] for states in aux], dim=-1).float().cpu(),
        "next_token_ids": torch.where(arguments["num_sampled"][:num_reqs].cpu() > 0, sampled, prefill),
        "token_indices_to_sample": ends - rejected - 1,
    }


def main(
    verifier: str, draft: str, out: str, k: str, prompts: str, runner: str = "auto", method: str = "eagle3"
) -> None:
    if runner not in ("v1", "v2", "auto"):
        sys.exit(f"vllm_proposals.py: runner must be v1, v2 or auto, not {runner!r}")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core, and so the proposer, in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if runner != "auto":
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = RUNNER_SWITCH[runner]
    if os.environ.get("FAKE_AMX") == "1":
        torch.cpu._is_amx_tile_supported = lambda: True
    import vllm
    from vllm.v1.spec_decode.dflash import DFlashProposer
    from vllm.v1.spec_decode.eagle import EagleProposer
    from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator

    calls = []
    recorded = {"v1": 0, "v2": 0}
    propose = EagleProposer.propose

    def recording(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                  next_token_ids, token_indices_to_sample, *args, **kwargs):  # fmt: skip
        inputs = {
            "target_token_ids": target_token_ids.cpu().clone(),
            "target_positions": target_positions.cpu().clone(),
            "target_hidden_states": target_hidden_states.float().cpu().clone(),
            "next_token_ids": next_token_ids.cpu().clone(),
        }
        if token_indices_to_sample is not None:
            inputs["token_indices_to_sample"] = token_indices_to_sample.cpu().clone()
        drafts = propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                         next_token_ids, token_indices_to_sample, *args, **kwargs)  # fmt: skip
        calls.append({**inputs, "drafts": drafts.cpu().clone()})
        recorded["v1"] += 1
        return drafts

    # Defined on TargetDependentARSpeculator; set on EagleSpeculator, so only the EAGLE speculator records.
    propose_v2 = EagleSpeculator.propose
    signature_v2 = inspect.signature(propose_v2)

    def recording_v2(self, *args, **kwargs):
        arguments = signature_v2.bind(self, *args, **kwargs)
        arguments.apply_defaults()
        if arguments.arguments["dummy_run"]:  # profiling and warm-up batches, not the verifier's steps
            return propose_v2(self, *args, **kwargs)
        inputs = _v2_inputs(arguments.arguments)
        drafts = propose_v2(self, *args, **kwargs)  # [num_reqs, K], a view of a buffer the next call overwrites
        calls.append({**inputs, "drafts": drafts.cpu().clone()})
        recorded["v2"] += 1
        return drafts

    EagleProposer.propose = recording
    DFlashProposer.propose = recording
    EagleSpeculator.propose = recording_v2
    # The project's own engine set-up (attention backends pinned where vLLM's choice would fail: an MLA verifier or
    # draft in float32 on a CPU with AMX), so what is proven here is what the stages start.
    llm = start_engine(
        vllm,
        "vllm_proposals.py",
        verifier,
        dtype="float32",
        max_model_len=256,
        tensor_parallel_size=1,
        gpu_memory_utilization=0.9,
        enforce_eager=True,
        trust_remote_code=False,
        skip_tokenizer_init=True,
        seed=0,
        speculative_config={"method": method, "model": draft, "num_speculative_tokens": int(k)},
    )
    greedy = vllm.SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for prompt in json.loads(prompts):
        llm.generate([{"prompt_token_ids": prompt}], greedy, use_tqdm=False)
        calls.append({"end_of_prompt": torch.zeros(1)})
    if not (recorded[runner] if runner != "auto" else sum(recorded.values())):
        sys.exit(f"vllm_proposals.py: model runner {runner} recorded no proposer call (calls recorded: {recorded})")
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    for number, call in enumerate(calls):
        save_file(
            {name: tensor.contiguous() for name, tensor in call.items()}, directory / f"call-{number:04d}.safetensors"
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
