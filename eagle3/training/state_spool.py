"""The hand-over of streamed hidden states from the verifier to the training processes (train.hidden_states
`streamed`): a spool directory of one file per (step, rank), written by a producer thread in rank 0 and read,
then deleted, by each rank's training loop.

Files, not queues, because the verifier runs in rank 0 (with tensor parallelism it needs every GPU of the
machine) while every rank trains on its own share of each batch: a file each process can open is the one channel
that works the same for 1 and N processes, on one node (local disk or /dev/shm) or several (shared storage).
A file holds one rank's share of one step: its sequences' states concatenated along the tokens, and their
lengths. Token ids and loss masks are not in it; every rank reads them from the token layout.

The producer computes each global batch's states (all ranks' sequences together, so the states do not depend on
the number of processes), writes each rank's share, and keeps the bytes in the spool within the budget: it
waits while the next step would not fit. With `phase_steps` it works in phases instead, for machines where the
verifier and the trainer cannot hold their working memory at once: it produces that many steps into a staging
directory, puts the verifier to sleep, publishes the phase, waits until every rank has trained on it, wakes the
verifier and goes on. A failure in the producer is written to the spool, so every rank stops with its line.
"""

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eagle3.errors import Eagle3Error
from eagle3.files import atomic_path

# Upper bound of a state file's bytes beyond its states (the safetensors header of two tensors).
HEADER_ALLOWANCE = 4096
_FAILED = "FAILED"
_SCALE = "aux_scale.safetensors"
_STAGING = "staging"
_STEP_FILES = "step-*.safetensors"
# The capture engine's own scratch files (vLLM's connector writes each request's states there).
ENGINE_SCRATCH = "engine"


def share_bytes(lengths: Iterable[int], layers: int, hidden: int) -> int:
    """The bytes of the file holding sequences of these lengths: bf16 states of every layer, plus its header."""
    return sum(lengths) * layers * hidden * 2 + HEADER_ALLOWANCE


class StateSpool:
    def __init__(self, directory: Path):
        self.directory = directory

    def path(self, step: int, rank: int) -> Path:
        return self.directory / f"step-{step:09d}.rank-{rank:04d}.safetensors"

    def reset(self) -> None:
        """Empty the spool (rank 0, before any rank reads): files of a killed run are not this run's, half-written
        ones (`.*.partial`) and the engine's scratch included, which the budget does not count."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for folder in (self.directory, self.directory / _STAGING):
            for stale in [*folder.glob(_STEP_FILES), *folder.glob(".*.partial")]:
                stale.unlink(missing_ok=True)
        shutil.rmtree(self.directory / ENGINE_SCRATCH, ignore_errors=True)
        (self.directory / _FAILED).unlink(missing_ok=True)
        self.drop_scale()

    def ready(self, step: int, rank: int) -> bool:
        return self.path(step, rank).is_file()

    def publish_scale(self, scale: torch.Tensor) -> None:
        """fc's input scale, measured by rank 0 on a fresh run, for every rank."""
        with atomic_path(self.directory / _SCALE) as partial:
            save_file({"aux_scale": scale}, str(partial))

    def take_scale(self, healthy: Callable[[], None]) -> torch.Tensor:
        return load_file(self._await(self.directory / _SCALE, healthy))["aux_scale"]

    def drop_scale(self) -> None:
        (self.directory / _SCALE).unlink(missing_ok=True)

    def write(self, path: Path, states: list[torch.Tensor]) -> int:
        """One rank's share ([layers, tokens, hidden] bf16 each) as one file, renamed into place when complete."""
        lengths = torch.tensor([s.shape[1] for s in states], dtype=torch.int64)
        joined = torch.cat(states, dim=1) if states else torch.zeros(0, 0, 0, dtype=torch.bfloat16)
        with atomic_path(path) as partial:
            save_file({"states": joined.contiguous(), "lengths": lengths}, str(partial))
        return path.stat().st_size

    def used_bytes(self) -> int:
        """Bytes of the state files present (published and staged): what the buffer holds now."""
        total = 0
        for folder in (self.directory, self.directory / _STAGING):
            try:
                entries = list(os.scandir(folder))
            except FileNotFoundError:
                continue
            for entry in entries:
                if entry.name.startswith("step-") and entry.name.endswith(".safetensors"):
                    try:
                        total += entry.stat().st_size
                    except FileNotFoundError:  # a rank released it meanwhile
                        pass
        return total

    def fail(self, message: str) -> None:
        with atomic_path(self.directory / _FAILED) as partial:
            partial.write_text(message, encoding="utf-8")

    def failure(self) -> str | None:
        try:
            return (self.directory / _FAILED).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def take(self, step: int, rank: int, healthy: Callable[[], None]) -> list[torch.Tensor]:
        """This rank's states for `step`, waiting until they are there; `healthy` raises if they never will be."""
        tensors = load_file(self._await(self.path(step, rank), healthy))
        states, lengths = tensors["states"], tensors["lengths"].tolist()
        return list(states.split(lengths, dim=1)) if lengths else []

    def release(self, step: int, rank: int) -> None:
        self.path(step, rank).unlink(missing_ok=True)

    def _await(self, path: Path, healthy: Callable[[], None]) -> Path:
        """`path` once it is there; the failure line written to the spool (any rank sees it) or `healthy` (rank 0
        also asks its producer) raises if it never will be."""
        pause = 0.005
        while not _arrived(path, healthy):
            if (message := self.failure()) is not None:
                raise Eagle3Error(message)
            time.sleep(pause)
            pause = min(pause * 2, 0.2)
        return path


def _arrived(path: Path, healthy: Callable[[], None]) -> bool:
    """Whether `path` is there; if not, `healthy` raises when it never will be. A producer that wrote it and
    ended between the two looks is not a failure: the file is looked for once more before giving up."""
    if path.is_file():
        return True
    try:
        healthy()
    except Eagle3Error:
        if path.is_file():
            return True
        raise
    return False


class Producer:
    """Rank 0's thread computing the states of the global plan's steps into the spool.

    `steps` yields (step, each rank's share of its global batch); `compute(positions)` returns those sequences'
    [layers, tokens, hidden] states in order; `size(share)` is the bytes of a share's file (share_bytes);
    `sleep` and `wake` put the verifier to sleep and back (phases only). `peak` is the most bytes the spool held
    (measured from its files), `phases` how many phases were published."""

    def __init__(
        self,
        spool: StateSpool,
        steps: Iterable[tuple[int, list[list[int]]]],
        compute: Callable[[list[int]], list[torch.Tensor]],
        size: Callable[[list[int]], int],
        budget: int,
        phase_steps: int | None = None,
        sleep: Callable[[], None] = lambda: None,
        wake: Callable[[], None] = lambda: None,
    ):
        self.spool, self.steps, self.compute, self.size, self.budget = spool, steps, compute, size, budget
        self.phase_steps, self.sleep, self.wake = phase_steps, sleep, wake
        self.peak = 0
        self.phases = 0
        self._error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="train-states-producer", daemon=True)

    def start(self) -> "Producer":
        self._thread.start()
        return self

    def healthy(self) -> None:
        """Raises the producer's error, or says it ended early; returns while it may still write."""
        alive = self._thread.is_alive()  # first: a producer that fails after this look has written its line
        if (message := self.spool.failure() or self._error) is not None:
            raise Eagle3Error(message)
        if not alive:
            raise Eagle3Error("train: the hidden-state producer stopped before the last step; rerun `eagle3 train`")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            if self.phase_steps is None:
                self._stream()
            else:
                self._in_phases()
        except BaseException as exc:  # every rank stops with this line (StateSpool.take)
            message = str(exc) if isinstance(exc, Eagle3Error) else f"train: computing hidden states failed: {exc!r}"
            self._error = message  # rank 0 reports it even when the spool cannot take it (a full disk)
            try:
                self.spool.fail(message)
            except OSError:
                pass

    def _wait(self, ready: Callable[[], bool]) -> bool:
        """Wait until `ready()`; False when told to stop."""
        while not ready():
            if self._stop.wait(0.05):
                return False
        return not self._stop.is_set()

    def _produce(self, step: int, shares: list[list[int]], folder: Path) -> None:
        states = self.compute([position for share in shares for position in share])
        first = 0
        for rank, share in enumerate(shares):
            self.spool.write(folder / self.spool.path(step, rank).name, states[first : first + len(share)])
            first += len(share)
        self.peak = max(self.peak, self.spool.used_bytes())

    def _fits(self, needed: int) -> bool:
        return self.spool.used_bytes() + needed <= self.budget

    def _stream(self) -> None:
        for step, shares in self.steps:
            needed = sum(self.size(share) for share in shares)
            if not self._wait(partial(self._fits, needed)):
                return
            self._produce(step, shares, self.spool.directory)

    def _in_phases(self) -> None:
        """Produce `phase_steps` steps with the verifier awake, then publish them with it asleep; the verifier
        wakes again only when every rank has trained on the phase and there is a next one to produce."""
        staging = self.spool.directory / _STAGING
        staging.mkdir(parents=True, exist_ok=True)
        asleep, staged = False, 0
        for step, shares in self.steps:
            if asleep:
                if not self._wait(lambda: not any(self.spool.directory.glob(_STEP_FILES))):
                    return
                self.wake()
                asleep = False
            self._produce(step, shares, staging)
            staged += 1
            if staged == self.phase_steps:
                self._publish(staging)
                asleep, staged = True, 0
        if staged:
            self._publish(staging)

    def _publish(self, staging: Path) -> None:
        self.sleep()
        for staged in sorted(staging.glob(_STEP_FILES)):
            staged.rename(self.spool.directory / staged.name)
        self.phases += 1
