"""The Kimi-K2.5-shaped miniature verifier (tests/kimi_miniature.py), and the token layout on its slow tokenizer."""

import hashlib
import json
from pathlib import Path

import pytest
import torch
from kimi_miniature import SPECIAL_TOKENS, build, shipped_texts

from eagle3.chat.reasoning import opens_reasoning, split_opened_reasoning
from eagle3.chat.token_layout import end_of_turn_id, layout
from eagle3.errors import Eagle3Error

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def miniature(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("kimi") / "verifier", REPO)


@pytest.fixture(scope="module")
def tokenizer(miniature):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(miniature, trust_remote_code=True)


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_miniature_is_deterministic_and_shaped_like_kimi(miniature, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert _digests(build(tmp_path / "again", REPO)) == _digests(miniature)
    index = json.loads((miniature / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 1  # sharded, with an index, as every large checkpoint
    config = json.loads((miniature / "config.json").read_text())
    assert (config["model_type"], config["kv_lora_rank"], config["qk_rope_head_dim"]) == ("deepseek_v3", 512, 64)
    assert (config["n_routed_experts"], config["first_k_dense_replace"], config["topk_method"]) == (8, 1, "noaux_tc")
    assert config["rope_parameters"]["rope_type"] == "yarn" and config["vocab_size"] < 1024
    bias_name = "model.layers.1.mlp.gate.e_score_correction_bias"
    with safe_open(miniature / index[bias_name], "pt") as weights:
        assert weights.get_tensor(bias_name).abs().min() > 0  # routing with a correction, as Kimi's

    model = AutoModelForCausalLM.from_pretrained(miniature, dtype=torch.bfloat16)
    states = model(torch.tensor([[1, 2, 3]]), output_hidden_states=True).hidden_states
    assert len(states) == config["num_hidden_layers"] + 1 and states[-1].shape == (1, 3, 256)

    wrapped_dir = build(tmp_path / "wrapped", REPO, wrapper=True)
    wrapped = json.loads((wrapped_dir / "config.json").read_text())
    assert wrapped["architectures"] == ["KimiK25ForConditionalGeneration"] and wrapped["text_config"] == config
    assert wrapped["image_token_id"] == AutoTokenizer.from_pretrained(
        miniature, trust_remote_code=True
    ).convert_tokens_to_ids("<|media_pad|>")
    wrapped_index = json.loads((wrapped_dir / "model.safetensors.index.json").read_text())["weight_map"]
    assert wrapped_index == {f"language_model.{name}": file for name, file in index.items()}  # as Kimi-K2.5's
    with (
        safe_open(wrapped_dir / index[bias_name], "pt") as weights,
        safe_open(miniature / index[bias_name], "pt") as plain,
    ):
        assert torch.equal(weights.get_tensor(f"language_model.{bias_name}"), plain.get_tensor(bias_name))
    assert "media_proc_cfg" in json.loads((wrapped_dir / "preprocessor_config.json").read_text())


def test_tokenizer_is_a_slow_tiktoken_one_like_kimis(tokenizer):
    assert not tokenizer.is_fast and type(tokenizer).__name__ == "KimiMiniatureTokenizer"
    for text in shipped_texts(REPO)[:200]:
        assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    assert [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in SPECIAL_TOKENS] == [1] * len(
        SPECIAL_TOKENS
    )
    # What broke the token layout: no offsets from a slow tokenizer, and EOS is not the end of a turn.
    assert "offset_mapping" not in tokenizer("a b", return_offsets_mapping=True)
    assert end_of_turn_id(tokenizer) == tokenizer.convert_tokens_to_ids("<|im_end|>") != tokenizer.eos_token_id


CONVERSATION = [
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue.", "reasoning": "Any colour will do."},
    {"role": "user", "content": "And a fruit?"},
    {"role": "assistant", "content": "A pear.", "reasoning": "Something short."},
]


def _masked(tokenizer, sequence) -> str:
    return tokenizer.decode(sequence.input_ids[sequence.loss_mask].tolist())


def test_layout_on_a_slow_tokenizer_whose_template_drops_earlier_reasoning(tokenizer):
    """Each turn on its own (the template renders the first turn's reasoning only while it is the last), masked from
    the generation prompt's <think> through <|im_end|>, the template's end of turn; [EOS] is never generated."""
    first, second = layout(tokenizer, "s", CONVERSATION, 512)
    assert (first.sample_id, second.sample_id) == ("s#0", "s#1")
    assert _masked(tokenizer, first) == "Any colour will do.</think>Blue.<|im_end|>"
    assert _masked(tokenizer, second) == "Something short.</think>A pear.<|im_end|>"
    assert tokenizer.decode(second.input_ids.tolist()).startswith(
        "<|im_user|>user<|im_middle|>Name a colour.<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>Blue."
    )
    # The ids are the tokenizer's own, piece by piece: the prompt, then the generated turn.
    prompt = tokenizer.apply_chat_template(CONVERSATION[:3], tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert second.input_ids[: len(prompt_ids)].tolist() == prompt_ids and not second.loss_mask[: len(prompt_ids)].any()

    # Thinking switched off: the prompt closes the block, the turn is one sequence with both answers masked.
    no_reasoning = [{k: v for k, v in m.items() if k != "reasoning"} for m in CONVERSATION]
    (whole,) = layout(tokenizer, "s", no_reasoning, 512, {"thinking": False})
    assert _masked(tokenizer, whole) == "Blue.<|im_end|>A pear.<|im_end|>"


def test_a_template_whose_turn_does_not_extend_its_prompt_is_one_clear_error(tokenizer):
    """The generation prompt opens <think> but a turn without reasoning renders `<think></think>` only when thinking
    is off: rendered with thinking on and no reasoning, the prompt is not a prefix of the turn."""
    broken = tokenizer.chat_template.replace("<think></think>{%- endif -%}", "{%- endif -%}", 1)
    original, tokenizer.chat_template = tokenizer.chat_template, broken
    try:
        with pytest.raises(Eagle3Error) as caught:
            layout(tokenizer, "sample-7", [{k: v for k, v in m.items() if k != "reasoning"} for m in CONVERSATION], 512)
    finally:
        tokenizer.chat_template = original
    assert str(caught.value).startswith(
        "sample-7: the chat template renders assistant turn 0 otherwise than the generation prompt it was generated "
        "from"
    )


def test_a_turn_cut_at_max_tokens_is_masked_only_through_what_it_generated(tokenizer):
    """A turn that ran out of max_tokens never generated the `<|im_end|>` the template ends it with, nor, cut inside
    its reasoning, the `</think>`: neither is a training target (both were before extraction 4)."""
    user = CONVERSATION[0]

    def masked(answer: dict, finish_reason: str, completion_tokens: int) -> str:
        turns = [{"finish_reason": finish_reason, "completion_tokens": completion_tokens}]
        (sequence,) = layout(tokenizer, "s", [user, {"role": "assistant", **answer}], 512, None, turns)
        return _masked(tokenizer, sequence)

    reasoning = {"content": "", "reasoning": "Any colour will"}
    generated = len(tokenizer("Any colour will", add_special_tokens=False)["input_ids"])
    assert masked(reasoning, "length", generated) == "Any colour will"
    # Re-tokenized text can come out shorter than what was generated: the template's </think> is still not masked.
    assert masked(reasoning, "length", generated + 2) == "Any colour will"
    assert masked(reasoning, "length", 2) == tokenizer.decode(tokenizer("Any colour will")["input_ids"][:2])
    assert masked(reasoning, "stop", generated + 2) == "Any colour will</think><|im_end|>"
    # Cut after the reasoning closed: the </think> was generated, the <|im_end|> was not.
    answered = {"content": "Blue, or", "reasoning": "Any."}
    assert masked(answered, "length", 32) == "Any.</think>Blue, or"
    # Only special tokens generated (they decode to nothing): nothing to learn from.
    assert masked({"content": "", "reasoning": ""}, "length", 32) == ""
    with pytest.raises(Eagle3Error, match="^s: 1 assistant turns but 2 turn records; the synthetic record is damaged"):
        layout(tokenizer, "s", [user, {"role": "assistant", **reasoning}], 512, None, [{}, {}])


def test_an_answer_generated_inside_an_opened_think_block_is_split_as_vllms_parsers_do(tokenizer):
    """Kimi's generation prompt ends in `<think>`: the offline engines' text is reasoning up to `</think>` (a special
    token, absent from the decoded text), content after it; unclosed, all of it is reasoning."""
    prompt = tokenizer.apply_chat_template(CONVERSATION[:1], tokenize=False, add_generation_prompt=True)
    assert opens_reasoning(prompt)
    assert not opens_reasoning(
        tokenizer.apply_chat_template(CONVERSATION[:1], tokenize=False, add_generation_prompt=True, thinking=False)
    )
    ids = tokenizer("Any colour.</think>Blue.", add_special_tokens=False)["input_ids"]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert text == "Any colour.Blue."  # what vLLM returns: the boundary is only in the ids
    assert split_opened_reasoning(tokenizer, ids, text) == ("Blue.", "Any colour.")
    unclosed = tokenizer("Any colour", add_special_tokens=False)["input_ids"]
    assert split_opened_reasoning(tokenizer, unclosed, "Any colour") == ("", "Any colour")
    # Rendered back, the split turn is exactly the text generated after the prompt.
    turn = {"role": "assistant", "content": "Blue.", "reasoning": "Any colour."}
    (sequence,) = layout(tokenizer, "s", [CONVERSATION[0], turn], 512)
    assert sequence.input_ids[sequence.loss_mask].tolist() == ids + [end_of_turn_id(tokenizer)]


def test_transformers_backend_stops_at_any_end_of_turn_id_and_splits_opened_reasoning(miniature, tmp_path):
    """The fallback backend: generate() stops at every EOS id of the generation config (Kimi's <|im_end|> besides
    [EOS]), and so must the answer it records; the template opened <think>, so the answer is reasoning."""
    import shutil
    from types import SimpleNamespace

    from eagle3.engines.generation.base import TurnRequest
    from eagle3.engines.generation.hf_transformers import TransformersBackend
    from eagle3.params.generate import GenerateParams

    verifier = SimpleNamespace(trust_remote_code=True, max_position_embeddings=4096)
    config = GenerateParams.model_validate({"backend": "transformers", "sampling": {"max_tokens": 12}})
    request = TurnRequest(messages=[CONVERSATION[0]], seed=0)
    unstopped = TransformersBackend(config, miniature, verifier, "float32")
    free = unstopped.generate([request])[0]
    assert (free.finish_reason, free.content, free.completion_tokens) == ("length", "", 12)
    prompt = unstopped.tokenizer.apply_chat_template([CONVERSATION[0]], add_generation_prompt=True, tokenize=False)
    encoded = unstopped.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        generated = unstopped.model.generate(**encoded, max_new_tokens=12, do_sample=False)
    ids = generated[0, encoded["input_ids"].shape[1] :].tolist()
    assert free.reasoning == unstopped.tokenizer.decode(ids, skip_special_tokens=True)

    # A model whose end of turn is the third token it generates (for the random miniature, any token will do).
    stop_token = ids[2]
    stopping = tmp_path / "stopping"
    shutil.copytree(miniature, stopping)
    generation = json.loads((stopping / "generation_config.json").read_text())
    (stopping / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [stop_token]}))
    stopped = TransformersBackend(config, stopping, verifier, "float32").generate([request])[0]
    before = ids[: ids.index(stop_token)]
    assert stopped.finish_reason == "stop" and stopped.completion_tokens == len(before) + 1
    assert (stopped.content, stopped.reasoning) == ("", unstopped.tokenizer.decode(before, skip_special_tokens=True))
