"""A Kimi-K2.5-shaped miniature verifier, made here from a seed (no download): the hero run's verifier in every
respect the pipeline touches, at a size a 2-core CPU runs.

- Text backbone: DeepSeek-V3 (MLA attention with kv_lora_rank 512 + qk_rope_head_dim 64, the one head size vLLM's
  CPU MLA backend supports; MoE with 8 routed experts top-2, 1 shared, the first layer dense, sigmoid scoring,
  noaux_tc routing with a nonzero e_score_correction_bias; YaRN rope with mscale = mscale_all_dim = 1), random
  weights, saved in several safetensors files with an index.
- Tokenizer: a tiktoken-based *slow* Python tokenizer of our own (`tokenization_kimi_miniature.py`, loaded through
  `auto_map` with trust_remote_code, as Kimi's is): byte-level BPE ranks learned on the shipped prompts, `[BOS]`
  and `[EOS]`, an end-of-turn token `<|im_end|>` distinct from `[EOS]`, `<think>`/`</think>`, and Kimi's
  role markers. No offset mapping, like Kimi's.
- Chat template: Kimi-style; the last assistant turn renders its reasoning in `<think>...</think>`, earlier turns'
  reasoning is dropped (`<think></think>`); the generation prompt opens `<think>` (or closes it at once with
  `thinking=False`).
- `wrapper=True`: wrapped as Kimi-K2.5's multimodal checkpoint (`KimiK25ForConditionalGeneration`, the text
  model's config in `text_config`, its weights under `language_model.`, a MoonViT `vision_config` and an image
  preprocessor config, no vision weights), for the stages that read configs and weights.

Deterministic: the same seed gives the same bytes.
"""

import json
from pathlib import Path

SPECIAL_TOKENS = [
    "[BOS]",
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<think>",
    "</think>",
    "<|media_pad|>",
]
# Kimi's pre-tokenizer split (letters, numbers in groups of up to 3, punctuation, whitespace), simplified.
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
BPE_MERGES = 500  # ranks = 256 bytes + merges; with the special tokens a ~768-token vocabulary

CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}<|im_system|>system<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- elif m['role'] == 'user' -%}<|im_user|>user<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- else -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if loop.index0 > ns.last_user and m.get('reasoning_content') -%}<think>{{ m['reasoning_content'] }}</think>"
    "{%- else -%}<think></think>{%- endif -%}"
    "{{ m['content'] }}<|im_end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking is defined and not thinking -%}<think></think>{%- else -%}<think>{%- endif -%}"
    "{%- endif -%}"
)

TOKENIZER_SOURCE = '''"""The miniature verifier's tokenizer: tiktoken byte-level BPE behind transformers' slow (Python)
tokenizer API, the way Kimi-K2.5's is built (written for the eagle3 tests, not copied from Kimi's)."""

import base64
import json
import os

import tiktoken
from transformers import PreTrainedTokenizer


def _byte_symbols():
    """A printable character per byte, so tokens are strings (GPT-2's byte-level convention)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\\xa1"), ord("\\xac") + 1))
    printable += list(range(ord("\\xae"), ord("\\xff") + 1))
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return symbols


class KimiMiniatureTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "tiktoken.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, **kwargs):
        with open(vocab_file, encoding="utf-8") as handle:
            data = json.load(handle)
        ranks = {base64.b64decode(token): rank for token, rank in data["ranks"].items()}
        specials = {token: len(ranks) + number for number, token in enumerate(data["special_tokens"])}
        self.vocab_file = vocab_file
        self.encoding = tiktoken.Encoding(
            name="kimi-miniature", pat_str=data["pattern"], mergeable_ranks=ranks, special_tokens=specials
        )
        self.symbols = _byte_symbols()
        self.bytes_of = {symbol: byte for byte, symbol in self.symbols.items()}
        self.id_to_token = {rank: self._as_text(token) for token, rank in ranks.items()}
        self.id_to_token.update({rank: token for token, rank in specials.items()})
        self.token_to_id = {token: rank for rank, token in self.id_to_token.items()}
        super().__init__(**kwargs)

    def _as_text(self, token):
        return "".join(self.symbols[byte] for byte in token)

    @property
    def vocab_size(self):
        return self.encoding.n_vocab

    def get_vocab(self):
        return dict(self.token_to_id)

    def _tokenize(self, text, **kwargs):
        return [self.id_to_token[rank] for rank in self.encoding.encode_ordinary(text)]

    def _convert_token_to_id(self, token):
        return self.token_to_id[token]

    def _convert_id_to_token(self, index):
        return self.id_to_token[index]

    def convert_tokens_to_string(self, tokens):
        pieces = bytearray()
        for token in tokens:
            if token in self.all_special_tokens or token in self.added_tokens_encoder:
                pieces += token.encode("utf-8")
            else:
                pieces += bytes(self.bytes_of[symbol] for symbol in token)
        return pieces.decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory, filename_prefix=None):
        target = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + "tiktoken.model")
        if os.path.abspath(target) != os.path.abspath(self.vocab_file):
            with open(self.vocab_file, encoding="utf-8") as source, open(target, "w", encoding="utf-8") as out:
                out.write(source.read())
        return (target,)
'''


def learn_ranks(texts: list[str], merges: int) -> dict[bytes, int]:
    """Byte-level BPE ranks (the 256 bytes, then `merges` merges in order) learned on `texts` with the same split
    pattern the tokenizer applies, so tiktoken's merge-by-rank reproduces the learned segmentation."""
    from collections import Counter

    import regex

    words = Counter(piece.encode("utf-8") for text in texts for piece in regex.findall(SPLIT_PATTERN, text))
    ranks = {bytes([byte]): byte for byte in range(256)}
    split = {word: [bytes([byte]) for byte in word] for word in words}
    for _ in range(merges):
        pairs: Counter = Counter()
        for word, parts in split.items():
            for left, right in zip(parts, parts[1:], strict=False):
                pairs[left, right] += words[word]
        if not pairs:
            break
        # Ties broken by the bytes themselves, so the ranks never depend on dict or Counter order.
        (left, right), _ = max(pairs.items(), key=lambda item: (item[1], item[0]))
        merged = left + right
        ranks[merged] = len(ranks)
        for word, parts in split.items():
            joined, position = [], 0
            while position < len(parts):
                if position + 1 < len(parts) and parts[position] == left and parts[position + 1] == right:
                    joined.append(merged)
                    position += 2
                else:
                    joined.append(parts[position])
                    position += 1
            split[word] = joined
    return ranks


def shipped_texts(repo: Path) -> list[str]:
    rows = (json.loads(line) for line in (repo / "data/prompts/eagle3-prompts.jsonl").read_text().splitlines())
    return [turn["value"] for row in rows for turn in row["conversations"]]


def build(out: Path, repo: Path, seed: int = 0, wrapper: bool = False, context: int = 8192) -> Path:
    """The miniature verifier as an HF directory in `out` (created), from `seed`; `repo` has the shipped prompts.
    `context`: its context length, YaRN-extended from 1,024 positions as Kimi-K2.5's is from 4,096."""
    import base64

    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    out.mkdir(parents=True)
    ranks = learn_ranks(shipped_texts(repo), BPE_MERGES)
    vocab_size = len(ranks) + len(SPECIAL_TOKENS)
    special_id = {token: len(ranks) + number for number, token in enumerate(SPECIAL_TOKENS)}
    (out / "tiktoken.model").write_text(
        json.dumps(
            {
                "pattern": SPLIT_PATTERN,
                "ranks": {base64.b64encode(token).decode(): rank for token, rank in ranks.items()},
                "special_tokens": SPECIAL_TOKENS,
            }
        )
    )
    (out / "tokenization_kimi_miniature.py").write_text(TOKENIZER_SOURCE)
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "KimiMiniatureTokenizer",
                "auto_map": {"AutoTokenizer": ["tokenization_kimi_miniature.KimiMiniatureTokenizer", None]},
                "bos_token": "[BOS]",
                "eos_token": "[EOS]",
                "pad_token": "[EOS]",
                "additional_special_tokens": SPECIAL_TOKENS[2:],
                "model_max_length": context,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    text = DeepseekV3Config(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=64,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        max_position_embeddings=context,
        rope_theta=50000.0,
        rope_scaling={
            "type": "yarn",
            "factor": context / 1024,
            "original_max_position_embeddings": 1024,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        bos_token_id=special_id["[BOS]"],
        eos_token_id=special_id["[EOS]"],
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(text).to(torch.bfloat16)
    with torch.no_grad():
        for name, tensor in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                tensor.copy_(torch.randn(tensor.shape, generator=torch.Generator().manual_seed(seed)) * 0.01)
    model.save_pretrained(out, max_shard_size="3MB")
    (out / "generation_config.json").write_text(
        json.dumps(
            {"bos_token_id": special_id["[BOS]"], "eos_token_id": [special_id["[EOS]"], special_id["<|im_end|>"]]}
        )
    )
    if wrapper:
        _wrap_as_kimi_k25(out, special_id["<|media_pad|>"])
    return out


def _wrap_as_kimi_k25(out: Path, media_pad_id: int) -> None:
    """What Kimi-K2.5's checkpoint has around its language model: the multimodal config (`text_config`, a MoonViT
    `vision_config`, the media placeholder token), an image preprocessor config, and the language model's weights
    under `language_model.` (no vision weights: every stage here is text-only)."""
    from safetensors.torch import load_file, save_file

    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for file in sorted(set(index["weight_map"].values())):
        tensors = load_file(out / file)
        save_file({f"language_model.{name}": t for name, t in tensors.items()}, out / file, metadata={"format": "pt"})
    index["weight_map"] = {f"language_model.{name}": file for name, file in index["weight_map"].items()}
    index_path.write_text(json.dumps(index, indent=2))
    text = json.loads((out / "config.json").read_text())
    wrapped = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
        "vision_config": {
            "model_type": "moonvit",
            "patch_size": 14,
            "init_pos_emb_height": 8,
            "init_pos_emb_width": 8,
            "num_attention_heads": 2,
            "num_hidden_layers": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "merge_kernel_size": [2, 2],
            "mm_hidden_size": 32,
            "text_hidden_size": text["hidden_size"],
        },
        "image_token_id": media_pad_id,
        "torch_dtype": "bfloat16",
    }
    (out / "config.json").write_text(json.dumps(wrapped, indent=2))
    processor = {
        "merge_kernel_size": [2, 2],
        "temporal_merge_kernel_size": 4,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "patch_size": 14,
        "in_patch_limit": 1024,
        "in_patch_limit_each_frame": 1024,
        "in_patch_limit_video": 1024,
        "patch_limit_on_one_side": 64,
        "fixed_output_tokens": None,
    }
    (out / "preprocessor_config.json").write_text(json.dumps({"media_proc_cfg": processor}, indent=2))
