"""docs/single-machine.md's rehearsal: tiny random verifiers of the families in tests/verifiers/ (a dense Qwen3, a
Qwen3-MoE), and the CPU sizes of tests/verifiers/rehearsal.yaml over the params.yaml `eagle3 init --verifier` writes.

    python tests/single_machine.py overrides PARAMS     (the page's rehearsal table runs it right after init)
"""

import json
import shutil
import sys
from pathlib import Path

import yaml

VERIFIERS = Path(__file__).resolve().parent / "verifiers"
OVERRIDES = VERIFIERS / "rehearsal.yaml"
# Qwen3's chat template in what matters here: thinking switched by `enable_thinking`, the last assistant turn
# rendered with its (possibly empty) thinking block, so that a turn extends its generation prompt.
QWEN3_TEMPLATE = (
    r"{%- for m in messages %}{%- if m['role'] == 'assistant' and loop.last %}"
    r"{{ '<|im_start|>assistant\n<think>\n' + (m.get('reasoning_content') or '') + '\n</think>\n\n' + m['content']"
    r" + '<|im_end|>\n' }}"
    r"{%- else %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{%- endif %}{%- endfor %}"
    r"{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    r"{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{%- endif %}"
    r"{%- endif %}"
)


def build(
    family: str, directory: Path, tokenizer_dir: Path | None = None, license_id: str | None = "apache-2.0"
) -> Path:
    """A random model of `family` (tests/verifiers/FAMILY.json) saved as a Hugging Face directory with the tokenizer
    in `tokenizer_dir` (ChatML tokens: the embedded SmolLM2's; None: no tokenizer), Qwen3's template, a recommended
    sampling and a card stating `license_id`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = json.loads((VERIFIERS / f"{family}.json").read_text())
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), dtype=torch.bfloat16)
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json") if tokenizer_dir else ():
        shutil.copy(tokenizer_dir / name, directory / name)
    (directory / "chat_template.jinja").write_text(QWEN3_TEMPLATE)
    if license_id:
        (directory / "README.md").write_text(f"---\nlicense: {license_id}\nlibrary_name: transformers\n---\n# tiny\n")
    generation = {"do_sample": True, "temperature": 0.6, "top_p": 0.95}
    (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


def merge(base, override):
    if isinstance(base, dict) and isinstance(override, dict):
        return {**base, **{key: merge(base.get(key), value) for key, value in override.items()}}
    return override


if __name__ == "__main__" and sys.argv[1:2] == ["overrides"]:
    path = Path(sys.argv[2])
    params = merge(yaml.safe_load(path.read_text()), yaml.safe_load(OVERRIDES.read_text()))
    path.write_text(yaml.safe_dump(params, sort_keys=False))
