"""What `eagle3 init --verifier` reads from a verifier's Hugging Face directory (`Verifier`, read_verifier):
config.json (its `text_config` where it nests one: architecture, hidden size, layers, vocabulary, context length,
heads, stored dtype, whether it needs its own code), the *.safetensors sizes (the weights), the chat template
(whether it has a thinking switch), generation_config.json (the sampling the model recommends) and README.md's front
matter (the license). What its files do not say is refused with the flag that sets it, never guessed.

Apart from eagle3/init/from_verifier.py, which sizes the params file from what is read here, so that reading a
model's files and deciding a run from them change separately.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error

# vLLM 0.32's verifiers that capture EAGLE-3 states (classes implementing SupportsEagle3 in
# vllm/model_executor/models/), by the architecture name config.json gives.
EAGLE3_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "KimiK25ForConditionalGeneration",
    "GptOssForCausalLM",
    "Gemma4ForCausalLM",
    "GraniteForCausalLM",
    "MiniCPMForCausalLM",
    "MiniMaxM2ForCausalLM",
)
# Variables chat templates switch thinking with: Qwen3's, and Kimi's / DeepSeek-V3.1's.
THINKING_SWITCHES = ("enable_thinking", "thinking")
# A switch is tested as a template variable (`if not thinking`, `enable_thinking is defined`); gpt-oss's template
# names a message's `thinking` field (message.thinking, 'thinking' in its error texts), which switches nothing.
_SWITCH_USE = (
    r"(?<![.\w'\"]){name}\s+is\s+(?:not\s+)?(?:defined|true|false|sameas)\b|\bif\s+(?:not\s+)?{name}\b(?![.\w])"
)


@dataclass(frozen=True)
class Verifier:
    """What the model directory says of the verifier."""

    directory: Path
    name: str
    license: str
    architecture: str
    text: dict[str, Any]
    dtype: str | None  # what its config says the weights are stored in; None: it does not say
    quantization: str | None  # its config's quantization_config.quant_method
    weights_bytes: float
    thinking_switch: str | None
    sampling: dict[str, float]
    remote_code: bool

    @property
    def layers(self) -> int:
        return int(self.text["num_hidden_layers"])

    @property
    def context(self) -> int:
        return int(self.text.get("max_position_embeddings") or 0)


def read_verifier(directory: Path, name: str | None, license_id: str | None) -> Verifier:
    """The verifier in `directory`; Eagle3Error naming the flag for what its files do not say."""
    from eagle3.formats.hf_config import read_config, stored_dtype, text_config
    from eagle3.plan.verifier import weights_bytes

    directory = directory.resolve()
    config = read_config(directory, "--verifier must be a Hugging Face model directory (config.json, weights)")
    text = text_config(config)
    architecture = (config.get("architectures") or ["?"])[0]
    if architecture not in EAGLE3_ARCHITECTURES:
        raise Eagle3Error(
            f"--verifier: {architecture} ({directory / 'config.json'}) is not among vLLM's verifiers that capture "
            f"EAGLE-3 states: {', '.join(EAGLE3_ARCHITECTURES)}"
        )
    weights = weights_bytes(directory)
    if not weights:
        raise Eagle3Error(
            f"--verifier: {directory} has no *.safetensors (nor model.safetensors.index.json): the weights size the "
            "GPUs they need"
        )
    card = _front_matter(directory / "README.md")
    name = name or (config.get("_name_or_path") if "/" in str(config.get("_name_or_path", "")) else None)
    if not name:
        raise Eagle3Error("--name: the verifier's Hub id (ORG/MODEL; verifier.source.name): its config does not say")
    license_id = license_id or card.get("license")
    if not license_id:
        raise Eagle3Error(
            f"--license: {directory / 'README.md'} states no license (verifier.source.license): give the model's"
        )
    return Verifier(
        directory=directory,
        name=name,
        license=str(license_id).lower(),
        architecture=architecture,
        text=text,
        dtype=stored_dtype(text) or stored_dtype(config),
        quantization=(config.get("quantization_config") or {}).get("quant_method"),
        weights_bytes=weights,
        thinking_switch=_thinking_switch(directory),
        sampling=_recommended_sampling(directory),
        remote_code="auto_map" in config,
    )


def _front_matter(readme: Path) -> dict[str, Any]:
    import yaml

    if not readme.is_file():
        return {}
    match = re.match(r"^---\n(.*?)\n---", readme.read_text(encoding="utf-8", errors="replace"), re.DOTALL)
    try:
        meta = yaml.safe_load(match[1]) if match else None
    except yaml.YAMLError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _thinking_switch(directory: Path) -> str | None:
    sources = [directory / "chat_template.jinja"]
    template = "".join(path.read_text(encoding="utf-8") for path in sources if path.is_file())
    tokenizer_config = directory / "tokenizer_config.json"
    if not template and tokenizer_config.is_file():
        value = json.loads(tokenizer_config.read_text(encoding="utf-8")).get("chat_template") or ""
        template = json.dumps(value) if not isinstance(value, str) else value
    return template_switch(template)


def template_switch(template: str) -> str | None:
    """The variable a chat template switches thinking with (THINKING_SWITCHES), or None."""
    return next((name for name in THINKING_SWITCHES if re.search(_SWITCH_USE.format(name=name), template)), None)


def _recommended_sampling(directory: Path) -> dict[str, float]:
    path = directory / "generation_config.json"
    if not path.is_file():
        return {}
    generation = json.loads(path.read_text(encoding="utf-8"))
    if not generation.get("do_sample", "temperature" in generation):
        return {}
    return {key: float(generation[key]) for key in ("temperature", "top_p") if generation.get(key) is not None}
