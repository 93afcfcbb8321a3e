"""Stage evaluate: held-out prompt selection. The vLLM measurements themselves are checked on the smoke
pipeline's own evaluate stage (tests/test_pipeline.py: check_evaluation), which runs it anyway."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3.errors import Eagle3Error
from eagle3.stages.evaluate import heldout_prompts


def _prepared(root, train_hashes, heldout_hashes):
    out = root / "data/prepared"
    out.mkdir(parents=True)
    for split, hashes in (("train", train_hashes), ("heldout", heldout_hashes)):
        rows = [
            {
                "id": h[:16],
                "prompt_hash": h,
                "messages": [
                    {"role": "user", "content": f"question {h}"},
                    {"role": "assistant", "content": "an old answer"},
                ],
            }
            for h in hashes
        ]
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")


def test_a_heldout_prompt_seen_in_training_stops_the_stage(tmp_path):
    _prepared(tmp_path, ["a" * 64, "b" * 64], ["c" * 64, "b" * 64])
    with pytest.raises(Eagle3Error, match="1 held-out prompts are also training prompts"):
        heldout_prompts(tmp_path, None)


def test_heldout_prompts_stop_before_the_first_answer(tmp_path):
    _prepared(tmp_path, ["a" * 64], ["c" * 64, "d" * 64])
    hashes, prompts = heldout_prompts(tmp_path, 1)
    assert hashes == ["c" * 64] and prompts == [[{"role": "user", "content": f"question {'c' * 64}"}]]


def test_per_token_expansion_repeats_each_request_value_over_its_draft_tokens():
    """The torch replacement for vLLM-CPU's temperature expansion (eagle3/engines/speculative.py): a greedy request's
    0 becomes 1 as in vLLM, and a request without draft tokens takes no slot."""
    import torch

    from eagle3.engines.speculative import _expand_per_token

    temperatures = torch.tensor([0.7, 0.0, 0.9, 0.5])
    expanded = _expand_per_token(
        temperatures, torch.tensor([2, 3, 3, 5], dtype=torch.int32), 5, replace_from=0, replace_to=1
    )
    assert expanded.dtype == torch.float32
    assert torch.equal(expanded, torch.tensor([0.7, 0.7, 1.0, 0.5, 0.5]))
    top_k = _expand_per_token(torch.tensor([5, 7]), torch.tensor([1, 4]), 4)
    assert torch.equal(top_k, torch.tensor([5, 7, 7, 7]))


def test_offline_walk_decodes_each_answer_as_vllm_does():
    """Prompt of 2 tokens, answer of 5 (tokens 2-6), a second turn's answer of 3 (tokens 9-11). vLLM drafts from
    position 1 (input token 2): 2 leading matches accepted, the verifier adds token 5; from position 4 only token
    6 is left to check. The second answer's first draft (position 8) is rejected, the next (position 9) accepts
    its one checkable token."""
    from eagle3.stages.evaluate import _walk_answers

    answer = [False, False, True, True, True, True, True, False, False, True, True, True]
    leading = [3, 2, 0, 0, 3, 3, 3, 3, 0, 3, 3, 3]
    walk = {"output": 0, "accepted": 0, "drafts": 0, "by_position": [0, 0, 0]}
    _walk_answers(leading, answer, walk)
    assert walk == {"output": 8, "accepted": 4, "drafts": 4, "by_position": [3, 1, 0]}
