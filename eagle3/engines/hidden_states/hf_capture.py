"""extract.backend `hf`: the verifier's forward pass in transformers, in padded batches (one process).

On a machine with GPUs the model goes onto them (`device_map="auto"`: one GPU when it fits, else spread layer by
layer over every visible GPU), inputs go to the embedding's device from pinned host memory, and each layer's
states are copied back into one pinned host buffer without blocking, with a single synchronisation per batch.
"""

from pathlib import Path

import torch

from eagle3.chat.token_layout import Sequence


class HfHiddenStates:
    pads_batches = True

    def __init__(self, model_dir: Path, trust_remote_code: bool, layers: tuple[int, ...], dtype: str):
        from transformers import AutoModel

        self.on_gpu = torch.cuda.is_available()
        # The base model without lm_head: the vocabulary projection would cost ~3/4 of the time for logits nobody uses.
        self.model = AutoModel.from_pretrained(
            model_dir,
            dtype=getattr(torch, dtype),
            trust_remote_code=trust_remote_code,
            **({"device_map": "auto"} if self.on_gpu else {}),
        ).eval()
        self.device = self.model.get_input_embeddings().weight.device
        self.layers = layers

    @torch.no_grad()
    def forward(self, batch: list[Sequence]) -> list[torch.Tensor]:
        """One padded forward pass; returns each sequence's [layers, tokens, hidden] states in bf16, padding
        removed."""
        longest = max(len(s.input_ids) for s in batch)
        input_ids = torch.zeros(len(batch), longest, dtype=torch.int64, pin_memory=self.on_gpu)
        attention = torch.zeros(len(batch), longest, dtype=torch.int64, pin_memory=self.on_gpu)
        for row, sequence in enumerate(batch):
            input_ids[row, : len(sequence.input_ids)] = sequence.input_ids
            attention[row, : len(sequence.input_ids)] = 1
        states = self.model(
            input_ids=input_ids.to(self.device, non_blocking=True),
            attention_mask=attention.to(self.device, non_blocking=True),
            output_hidden_states=True,
        ).hidden_states
        hidden_size = states[0].shape[-1]
        # [layers, batch, tokens, hidden]: each layer's copy lands in one contiguous block of pinned memory, so it is
        # a direct asynchronous transfer. With device_map the layers live on different GPUs: each is waited for.
        host = torch.empty(
            len(self.layers), len(batch), longest, hidden_size, dtype=torch.bfloat16, pin_memory=self.on_gpu
        )
        for position, layer in enumerate(self.layers):
            host[position].copy_(states[layer], non_blocking=True)
        for device in {states[layer].device for layer in self.layers if states[layer].is_cuda}:
            torch.cuda.synchronize(device)
        return [host[:, row, : len(s.input_ids)].contiguous() for row, s in enumerate(batch)]

    def sleep(self) -> None:
        """On GPUs, every weight moves to host memory (each remembers its device, so a model spread over several
        GPUs comes back as it was); on CPU there is nothing to free."""
        if not self.on_gpu:
            return
        self._homes = {}
        for tensor in [*self.model.parameters(), *self.model.buffers()]:
            self._homes[id(tensor)] = tensor.device
            # Pinned, so waking copies back asynchronously at the link's full rate.
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            tensor.data = host.copy_(tensor.data)
        torch.cuda.empty_cache()

    def wake_up(self) -> None:
        if not self.on_gpu:
            return
        for tensor in [*self.model.parameters(), *self.model.buffers()]:
            tensor.data = tensor.data.to(self._homes[id(tensor)], non_blocking=True)
        for device in {home for home in self._homes.values() if home.type == "cuda"}:
            torch.cuda.synchronize(device)

    def close(self) -> None:
        del self.model
