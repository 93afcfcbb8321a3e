"""train.hidden_states `streamed`: the verifier computes each batch's states just before the trainer needs them.

Nothing of the training split's states is stored: the disk holds its token layout (`TokenStore`: token ids, loss
masks and sample ids, ~5 bytes per token where the states are ~57 KB at Kimi-K2.5's size), and the spool
(eagle3/training/state_spool.py) at most `train.stream_buffer_gb` of states computed ahead of the step.

The sequences are the ones extract would store, in its order (eagle3/chat/sequence_plan.py), so the same
BatchPlan gives the same batches, windows and TTT targets as a stored run over the same data. Rank 0 runs the
capture engine extract uses, with extract's settings, on each global batch's sequences, shortest first, cut at
extract.batch_tokens padded tokens per forward pass. Those passes group sequences differently from extract's (a
training batch, not a shard part), and a padded batch changes bf16 states by rounding only, so a streamed run
equals a stored one within bf16 noise, not bit for bit. Given the data and params the grouping is fixed and
independent of the number of processes, so a resumed streamed run (which produces from its checkpoint's step on)
ends at the same weights as an uninterrupted one, and N processes train what one trains.
"""

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from eagle3.chat.sequence_plan import Part, load_tokenizer, split_sequences, synthetic_parts
from eagle3.chat.token_layout import Sequence
from eagle3.engines.hidden_states.backends import open_capture
from eagle3.engines.hidden_states.base import (
    EXTRACTION_VERSION,
    CaptureRequest,
    HiddenStateCapture,
    compute_dtype,
    layer_ids,
)
from eagle3.engines.hidden_states.batching import length_sorted_batches
from eagle3.errors import Eagle3Error
from eagle3.files import read_json, staged_dir, write_json
from eagle3.formats.provenance import Provenance, checked_verifier_dir
from eagle3.hashing import sha256_file
from eagle3.params.extract import ExtractParams
from eagle3.params.train import TrainParams
from eagle3.paths import STREAM_DIR, SYNTHETIC_MANIFEST
from eagle3.precision import engine_device_type
from eagle3.progress import progress
from eagle3.training.data import SCALE_SAMPLES, BatchPlan, Collate, TrainingData, measure_aux_scale
from eagle3.training.distributed import Dist
from eagle3.training.state_spool import ENGINE_SCRATCH, Producer, StateSpool, share_bytes

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Bump when the same inputs give other store files, so an old store is rebuilt instead of read.
STORE_VERSION = 1
_FILES = ("input_ids.bin", "loss_mask.bin", "offsets.bin", "sample_ids.txt")


class TokenStore:
    """A split's training sequences by global position, memory-mapped: what the producer feeds the verifier and
    every rank pairs with the states it receives."""

    def __init__(self, directory: Path):
        self.offsets = np.fromfile(directory / "offsets.bin", dtype=np.int64)
        self.input_ids = np.memmap(directory / "input_ids.bin", dtype=np.int32, mode="r")
        self.loss_mask = np.memmap(directory / "loss_mask.bin", dtype=np.uint8, mode="r")
        # split, not splitlines: an id may hold characters splitlines also breaks at (\x85, \u2028).
        self.sample_ids = (directory / "sample_ids.txt").read_text(encoding="utf-8").split("\n")[:-1]
        # Tokens per sequence, by global position: what BatchPlan batches by.
        self.lengths = torch.from_numpy(np.diff(self.offsets))

    def __len__(self) -> int:
        return len(self.lengths)

    def sequence(self, position: int) -> Sequence:
        first, end = int(self.offsets[position]), int(self.offsets[position + 1])
        return Sequence(
            self.sample_ids[position],
            torch.from_numpy(self.input_ids[first:end].astype(np.int64)),
            torch.from_numpy(self.loss_mask[first:end].astype(np.bool_)),
            False,
        )

    @staticmethod
    def is_built(directory: Path, key: dict[str, Any]) -> bool:
        made = directory / "store.json"
        return (
            made.is_file() and read_json(made, "").get("key") == key and all((directory / n).is_file() for n in _FILES)
        )

    @staticmethod
    def build(
        directory: Path, key: dict[str, Any], parts: list[Part], tokenizer: "PreTrainedTokenizerBase", max_seq_len: int
    ) -> None:
        """Lay the parts out into `directory` for `key` (what the layout depends on). Built in a scratch
        directory and renamed into place: a killed build leaves nothing to trust."""
        with staged_dir(directory) as staging:
            handles = [open(staging / name, "wb") for name in _FILES]
            ids, masks, offsets, names = handles
            tokens, count = 0, 0
            try:
                offsets.write(np.zeros(1, dtype=np.int64).tobytes())
                with progress() as bar:
                    task = bar.add_task("train: token layout (parts)", total=len(parts))
                    for sequences in split_sequences(parts, tokenizer, max_seq_len):
                        for sequence in sequences:
                            ids.write(sequence.input_ids.numpy().astype(np.int32).tobytes())
                            masks.write(sequence.loss_mask.numpy().astype(np.uint8).tobytes())
                            tokens += len(sequence.input_ids)
                            offsets.write(np.array([tokens], dtype=np.int64).tobytes())
                            names.write(f"{sequence.sample_id}\n".encode())
                            count += 1
                        bar.advance(task)
            finally:
                for handle in handles:
                    handle.close()
            write_json(staging / "store.json", {"key": key, "sequences": count, "tokens": tokens})


def capture_states(capture: HiddenStateCapture, sequences: list[Sequence], batch_tokens: int) -> list[torch.Tensor]:
    """Each sequence's [layers, tokens, hidden] bf16 states, in the given order, from forward passes over the
    sequences shortest first in batches of up to `batch_tokens` padded tokens."""
    states: list[torch.Tensor | None] = [None] * len(sequences)
    for batch in length_sorted_batches(sequences, batch_tokens):
        for position, hidden in zip(batch, capture.forward([sequences[i] for i in batch]), strict=True):
            states[position] = hidden
    return states  # type: ignore[return-value]


def check_streamable(extract: ExtractParams) -> None:
    """One line when this machine cannot compute states beside training with extract's backend."""
    if extract.backend == "vllm" and engine_device_type() == "cpu":
        raise Eagle3Error(
            "train.hidden_states: streamed with extract.backend vllm needs GPUs: vLLM's CPU engine pins the cores "
            "the trainer computes on; on this machine set extract.backend: hf"
        )


class StreamedData(TrainingData):
    """The training split of a streamed run: its token layout, what its states are computed with, and (rank 0)
    the capture engine, opened on first use so a rerun that finds training finished never loads the verifier."""

    def __init__(self, root: Path, store: TokenStore, request: CaptureRequest, settings: dict[str, Any], world: Dist):
        self.root, self.store, self.request, self.settings, self.world = root, store, request, settings, world
        self.layer_ids = request.layer_ids
        self.lengths = store.lengths
        self._capture: HiddenStateCapture | None = None
        self.producer: Producer | None = None
        self.phases = False
        self._finished = False

    def __len__(self) -> int:
        return len(self.store)

    @classmethod
    def open(
        cls, root: Path, extract: ExtractParams, config: TrainParams, provenance: Provenance, world: Dist
    ) -> "StreamedData":
        check_streamable(extract)
        if config.launch.nodes > 1 and config.stream_dir is None:
            raise Eagle3Error(
                f"train.stream_dir: train.launch.nodes is {config.launch.nodes}, so the states rank 0 computes must "
                "reach every machine: set it to one directory on storage they all share"
            )
        model_dir = checked_verifier_dir(root)
        manifest = root / SYNTHETIC_MANIFEST
        parts = synthetic_parts(root, ["train"])
        layers = layer_ids(extract, provenance)
        layout_key = {
            "store": STORE_VERSION,
            "extraction": EXTRACTION_VERSION,
            "synthetic_manifest_sha256": sha256_file(manifest),
            "tokenizer_sha256": provenance.tokenizer_sha256,
            "max_seq_len": extract.max_seq_len,
        }
        directory = root / STREAM_DIR / "train"
        # One process per machine lays the data out; the others wait for it without a collective, which would time
        # out on a long layout. Machines sharing one project directory race to build the same layout: a build that
        # loses the final rename to another machine's finds that one built.
        if world.rank % world.local_size == 0 and not TokenStore.is_built(directory, layout_key):
            try:
                TokenStore.build(directory, layout_key, parts, load_tokenizer(root, provenance), extract.max_seq_len)
            except OSError:
                if not TokenStore.is_built(directory, layout_key):
                    raise
        while not TokenStore.is_built(directory, layout_key):
            time.sleep(0.2)
        store = TokenStore(directory)
        if not len(store):
            raise Eagle3Error(f"{manifest}: the training split has no sequence with a loss token; check generate")
        dtype = compute_dtype(extract)
        settings = {
            **layout_key,
            "layer_ids": list(layers),
            "compute_dtype": dtype,
            "backend": extract.backend,
            "batch_tokens": extract.batch_tokens,
        }
        spool = spool_dir(root, config)
        request = CaptureRequest(
            model_dir,
            provenance,
            layers,
            extract,
            spool / ENGINE_SCRATCH,
            dtype,
            sleep_mode=config.stream_phase_steps is not None,
            step_tokens=extract.max_seq_len + 1,
        )
        return cls(root, store, request, settings, world)

    @property
    def capture(self) -> HiddenStateCapture:
        if self._capture is None:
            with _outside_torchrun():
                self._capture = open_capture(self.request)
        return self._capture

    def states(self, positions: list[int]) -> list[torch.Tensor]:
        sequences = [self.store.sequence(position) for position in positions]
        return capture_states(self.capture, sequences, self.request.config.batch_tokens)

    def check_buffer(self, plan: BatchPlan, layers: int, hidden: int, config: TrainParams) -> None:
        """Before any state is computed: the buffer must hold the largest step (or phase) of the run."""
        budget = int(config.stream_buffer_gb * 1e9)
        window = config.stream_phase_steps or 1
        sizes = [
            sum(share_bytes(self.lengths[s].tolist(), layers, hidden) for s in shares) for _, shares in _steps(plan)
        ]
        largest = max((sum(sizes[i : i + window]) for i in range(0, len(sizes), window)), default=0)
        if largest > budget:
            what = f"{window} steps' (train.stream_phase_steps)" if window > 1 else "one step's"
            raise Eagle3Error(
                f"train.stream_buffer_gb: {config.stream_buffer_gb:g} GB holds less than {what} states (the largest "
                f"needs {largest / 1e9:.3f} GB: tokens x {layers} layers x {hidden} x 2 bytes); raise it to at least "
                f"{largest / 1e9:.3f}"
                + (", or lower train.stream_phase_steps" if window > 1 else ", or lower train.batch_size")
            )

    def identity(self) -> dict[str, Any]:
        return {"streamed_states": self.settings}

    def begin(self, plan: BatchPlan, config: TrainParams, collate: Collate, fresh: bool) -> torch.Tensor | None:
        """From the resumed step, as the producer counts its phases, and before any state is computed: the buffer
        is checked; then rank 0 empties the spool and starts producing from plan.start; every rank returns fc's
        input scale when `fresh` (measured by rank 0 on the first samples, as the stored mode does), else None."""
        layers, hidden = collate.layers, collate.hidden
        self.check_buffer(plan, layers, hidden, config)
        spool = self.spool = StateSpool(spool_dir(self.root, config))
        self.phases = config.stream_phase_steps is not None
        if self.world.main:
            spool.reset()
        # Quick, so no collective waits on the verifier's start: after it, nothing of a killed run is left to read.
        self.world.barrier()
        if self.world.main:
            try:
                if fresh:
                    spool.publish_scale(measure_aux_scale(self._scale_states(config.batch_size), layers - 1))
                capture = self.capture
            except BaseException as exc:
                message = str(exc) if isinstance(exc, Eagle3Error) else f"train: starting the verifier failed: {exc!r}"
                spool.fail(message)
                raise
            self.producer = Producer(
                spool,
                _steps(plan),
                self.states,
                lambda share: share_bytes(self.lengths[share].tolist(), layers, hidden),
                int(config.stream_buffer_gb * 1e9),
                config.stream_phase_steps,
                sleep=capture.sleep,
                wake=capture.wake_up,
            ).start()
        return spool.take_scale(self._healthy) if fresh else None

    def _scale_states(self, group: int) -> Iterator[torch.Tensor]:
        """The first samples' states, computed `group` sequences at a time: at 16K tokens all SCALE_SAMPLES at
        once would be ~60 GB of host memory."""
        count = min(SCALE_SAMPLES, len(self))
        for first in range(0, count, group):
            yield from self.states(list(range(first, min(first + group, count))))

    def _idle(self) -> None:
        # Between phases the verifier wakes into the memory the trainer's allocator still holds: give it back.
        if self.phases and self.world.device.type == "cuda":
            torch.cuda.empty_cache()

    def _healthy(self) -> None:
        # Other ranks learn of a failure from the spool itself (StateSpool._await).
        if self.producer is not None:
            self.producer.healthy()

    def batches(self, plan: BatchPlan, config: TrainParams, collate: Collate) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's collated micro-batches from plan.start on; a step's file stays in the spool (and counts
        against the buffer) until the trainer asks for the next step's first micro-batch."""
        previous, rank = None, self.world.rank
        # Page-locked batches let the copy to the GPU run asynchronously, overlapping the previous step.
        pinned = self.world.device.type == "cuda"
        self._finished = False
        try:
            for step, batch in enumerate(plan.global_batches(), start=plan.start):
                # Asked for this batch, the trainer is done with the last one: its file leaves the buffer, which is
                # also what tells a producer in phases that the phase has been trained on, so a rank about to wait
                # for the next phase first hands its cached GPU memory back to the verifier that then wakes.
                if not self.spool.ready(step, rank):
                    self._idle()
                if previous is not None:
                    self.spool.release(previous, rank)
                share = plan.shares(batch)[rank]
                states = dict(zip(share, self.spool.take(step, rank, self._healthy), strict=True))
                previous = step
                for micro in plan.rank_micro_batches(batch):
                    sequences = [self.store.sequence(p) for p in micro]
                    collated = collate(
                        [
                            {"id": s.sample_id, "input_ids": s.input_ids, "loss_mask": s.loss_mask, "hidden": states[p]}
                            for p, s in zip(micro, sequences, strict=True)
                        ]
                    )
                    yield {k: v.pin_memory() for k, v in collated.items()} if pinned else collated
            if previous is not None:
                self.spool.release(previous, rank)
            if self.world.main:  # every rank took its first step, so every rank has read the scale
                self.spool.drop_scale()
            self._finished = True
        finally:
            self.close()

    def summary(self) -> dict[str, Any]:
        """What the metrics record of the stream (rank 0)."""
        if self.producer is None:
            return {}
        return {"stream_peak_buffer_bytes": self.producer.peak, "stream_phases": self.producer.phases}

    def close(self) -> None:
        if self.producer is not None:
            self.producer.stop()
            # Rank 0's training stopped early: the other ranks must not wait for its states (a producer's own
            # failure is already there, and says more).
            if not self._finished and self.spool.failure() is None:
                self.spool.fail("train: rank 0 stopped before the last step (its error says why)")
        if self._capture is not None:
            self._capture.close()
            self._capture = None


# What torchrun tells its processes; a capture engine started inside one (rank 0) must not take them for its own:
# vLLM's tensor-parallel workers are processes of their own that meet through vLLM's own rendezvous.
_TORCHRUN_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


@contextmanager
def _outside_torchrun() -> Iterator[None]:
    saved = {name: os.environ.pop(name) for name in _TORCHRUN_ENV if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def spool_dir(root: Path, config: TrainParams) -> Path:
    return Path(config.stream_dir) if config.stream_dir else root / STREAM_DIR / "spool"


def _steps(plan: BatchPlan) -> Iterator[tuple[int, list[list[int]]]]:
    """The global plan's steps from plan.start on, each as every rank's share of its batch."""
    for step, batch in enumerate(plan.global_batches(), start=plan.start):
        yield step, plan.shares(batch)
