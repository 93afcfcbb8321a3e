"""extract.backend `hf`: the verifier's forward pass in transformers, in padded batches (one process)."""

from pathlib import Path

import torch

from eagle3.chat.token_layout import Sequence


class HfHiddenStates:
    def __init__(self, model_dir: Path, trust_remote_code: bool, layers: tuple[int, ...]):
        from transformers import AutoModel

        # The base model without lm_head: the vocabulary projection would cost ~3/4 of the time for logits nobody uses.
        self.model = AutoModel.from_pretrained(
            model_dir, dtype=torch.bfloat16, trust_remote_code=trust_remote_code
        ).eval()
        self.layers = layers

    @torch.no_grad()
    def forward(self, batch: list[Sequence]) -> list[torch.Tensor]:
        """One padded forward pass; returns each sequence's [layers, tokens, hidden] bf16 states, padding removed."""
        longest = max(len(s.input_ids) for s in batch)
        input_ids = torch.zeros(len(batch), longest, dtype=torch.int64)
        attention = torch.zeros(len(batch), longest, dtype=torch.int64)
        for row, sequence in enumerate(batch):
            input_ids[row, : len(sequence.input_ids)] = sequence.input_ids
            attention[row, : len(sequence.input_ids)] = 1
        states = self.model(input_ids=input_ids, attention_mask=attention, output_hidden_states=True).hidden_states
        stacked = torch.stack([states[k] for k in self.layers], dim=1).to(
            torch.bfloat16
        )  # [batch, layers, tokens, hidden]
        return [stacked[row, :, : len(s.input_ids)].contiguous() for row, s in enumerate(batch)]

    def close(self) -> None:
        del self.model
