"""Training curves through DVCLive into metrics/train/ (`dvc plots show`, `dvc metrics show`)."""

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from eagle3.paths import TRAIN_LOG_DIR

if TYPE_CHECKING:
    from dvclive import Live

    from eagle3.training.distributed import Dist


def open_log(root: Path, resume_step: int | None) -> "Live":
    """DVCLive over metrics/train; on resume, rows logged after the checkpoint are dropped first, so a resumed run's
    curves equal an uninterrupted run's."""
    from dvclive import Live

    log_dir = root / TRAIN_LOG_DIR
    if resume_step is None:
        shutil.rmtree(log_dir, ignore_errors=True)
    else:
        for tsv in (log_dir / "plots" / "metrics").rglob("*.tsv"):
            lines = tsv.read_text(encoding="utf-8").splitlines(keepends=True)
            tsv.write_text("".join(lines[:1] + [line for line in lines[1:] if int(line.split("\t")[0]) <= resume_step]))
    # DVC runs this stage, so DVCLive's own DVC/git integration (experiments, dvc.yaml) stays off. It would still
    # open the repository from the working directory, and that fails in a git repository without commits
    # (scmrepo: "Empty git repo"); built from a neutral directory with an absolute `dir`, it only writes its files.
    previous = Path.cwd()
    with tempfile.TemporaryDirectory() as neutral:
        os.chdir(neutral)
        try:
            return Live(
                dir=str(log_dir.resolve()),
                resume=resume_step is not None,
                save_dvc_exp=False,
                dvcyaml=None,
                report=None,
            )
        finally:
            os.chdir(previous)


class Window:
    """Sums over the optimizer steps since the last log line, per TTT step.

    Each optimizer step's figures stay on the device until the window closes, then every process reduces them in one
    collective (NCCL reduces only device tensors) and one copy to the host: no synchronisation per step."""

    def __init__(self, ttt_steps: int):
        self.ttt_steps = ttt_steps
        self.loss, self.correct, self.counts = torch.zeros(ttt_steps), torch.zeros(ttt_steps), torch.zeros(ttt_steps)
        self.objective, self.optimizer_steps, self.tokens = 0.0, 0, 0
        self.pending: list[torch.Tensor] = []
        self.pending_counts: list[torch.Tensor] = []
        self.pending_tokens: list[int] = []

    def add(self, sums: torch.Tensor, correct: torch.Tensor, counts: torch.Tensor, loss: torch.Tensor, tokens: int):
        """One optimizer step: this process's loss sums, top-1 agreements, backpropagated loss and padded tokens;
        `counts` already global."""
        self.pending.append(torch.cat([sums.float(), correct.float(), loss.detach().float().reshape(1)]))
        self.pending_counts.append(counts.float())
        self.pending_tokens.append(tokens)

    def reduce(self, world: "Dist") -> None:
        """Every process calls this at the same optimizer steps: the pending figures summed over processes."""
        if not self.pending:
            return
        # float64: a window's padded-token total can pass float32's 2**24 exact integers.
        on_device = torch.stack(self.pending).double()
        tokens = torch.tensor(self.pending_tokens, dtype=on_device.dtype, device=on_device.device)
        rows = world.all_sum(torch.cat([on_device, tokens[:, None]], dim=1)).cpu()
        counts = torch.stack(self.pending_counts).cpu()
        ttt = self.ttt_steps
        for row, count in zip(rows, counts, strict=True):
            self.loss += row[:ttt]
            self.correct += row[ttt : 2 * ttt]
            self.counts += count
            self.objective += float(row[2 * ttt] / world.size)
            self.tokens += int(row[2 * ttt + 1])
            self.optimizer_steps += 1
        self.pending, self.pending_counts, self.pending_tokens = [], [], []

    def log(self, live: "Live", done: int, lr: float) -> None:
        live.step = done
        live.log_metric("train/loss", round(self.objective / max(self.optimizer_steps, 1), 6))
        live.log_metric("train/lr", lr)
        for i in range(len(self.counts)):
            count = float(self.counts[i])
            if count:
                live.log_metric(f"train/acc_{i}", round(float(self.correct[i]) / count, 6))
                live.log_metric(f"train/ce_{i}", round(float(self.loss[i]) / count, 6))
        live.make_summary()
        for tensor in (self.loss, self.correct, self.counts):
            tensor.zero_()
        self.objective, self.optimizer_steps = 0.0, 0
