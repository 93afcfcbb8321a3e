"""A verifier stage's record (models/verifier/provenance.json) of a verifier's shape, without the verifier: for the
checks that read only the record."""

from pathlib import Path

from eagle3.formats.provenance import LocalOrigin, Provenance, write_provenance

# The embedded verifier's shape (SmolLM2-135M-Instruct), with hashes that stand for files nobody reads.
SMOLLM2 = {
    "name": "org/x",
    "license": "apache-2.0",
    "source": LocalOrigin(kind="local"),
    "dtype": "bfloat16",
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "vocab_size": 49152,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "chat_template_sha256": "0" * 64,
    "tokenizer_sha256": "0" * 64,
    "config_sha256": "0" * 64,
    "trust_remote_code": False,
    "num_weight_files": 1,
    "weight_bytes": 1,
    "weight_files": {"model.safetensors": {"bytes": 1, "sha256": "0" * 64}},
    "weights_sha256": "0" * 64,
}


def write_fake_provenance(root: Path, **fields) -> Provenance:
    """The record of SMOLLM2 with `fields` in place of its own, written under `root` as the verifier stage does."""
    record = {**SMOLLM2, **fields}
    layers = record["num_hidden_layers"]
    record.setdefault("default_aux_layer_ids", [2, layers // 2, layers - 3])
    provenance = Provenance(**record)
    (root / "models/verifier").mkdir(parents=True, exist_ok=True)
    write_provenance(root / "models/verifier", provenance)
    return provenance
