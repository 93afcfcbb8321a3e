"""speculators' EAGLE-3 trainer (the peer users compare this project with) run on this project's data, for
peer_trainer.py. Nothing here enters the pipeline: the peer lives in its own virtual environment.

- `peer_python`: a venv of its own under .eagle3/benchmarks/ with speculators and hs-connectors at the pinned
  versions (by hash, no dependencies); everything else it imports (torch, transformers, datasets, ...) is this
  project's, through a .pth file, so both trainers run the same torch.
- `CPU_PATCH`: speculators' trainer hard-codes CUDA (the autocast device, `.to(local_rank)`, accelerator
  synchronize), and the project's states already carry the verifier's final norm, which the peer applies itself.
  Each patch replaces one exact line and fails loudly where a line is not there (another version).
- `write_peer_data`: the project's training shards as the peer reads them (an HF datasets directory with
  input_ids, loss_mask and seq_len; hidden_states/hs_<row>.safetensors with token_ids and the captured layers, the
  final one last), and d2t/t2d as .npy.
- `matching_budget`: the packing budget (--total-seq-len) at which the peer's own sampler makes as many optimizer
  steps as this project's trainer takes.
- `import_peer_draft`: the peer's checkpoint as this project's draft (same layout, same tensors), so it is exported
  and evaluated by this project's own stages.
"""

import json
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from eagle3.formats.shards import ShardReader, split_shards
from eagle3.modeling.draft import DraftConfig, Eagle3Draft
from eagle3.params.train import DraftLayout

VERSION = "0.9.0"
# pip --require-hashes lines: the wheels on PyPI.
REQUIREMENTS = (
    "speculators==0.9.0 --hash=sha256:f0de7571274ce996d769ce81240379728dcb38701f77d2d34cfd0d670d1b4481\n"
    "hs-connectors==0.9.0 --hash=sha256:122f2c323397793c70c5bfc8c0adb1b4dd69995a2507b163509142d61fa3b920\n"
)
# speculators' EAGLE-3 defaults on the command line: its layout, its output head frozen at the verifier's rows.
PEER_LAYOUT = DraftLayout(norm_before_fc=True, norm_output=True, norm_before_residual=True)
# (file in the package, the exact line, what replaces it)
CPU_PATCH = (
    (
        "train/trainer.py",
        '        self.device_type = acc.type if acc is not None else "cuda"',
        '        self.device_type = acc.type if acc is not None else "cpu"\n'
        '        self.device = torch.device(acc.type, self.local_rank) if acc is not None else torch.device("cpu")',
    ),
    (
        "train/trainer.py",
        "            self.model.to(self.local_rank)  # type: ignore[arg-type]",
        "            self.model.to(self.device)",
    ),
    (
        "train/trainer.py",
        "        self.model.to(self.local_rank)  # type: ignore[arg-type]",
        "        self.model.to(self.device)",
    ),
    (
        "train/trainer.py",
        "                k: v.to(self.local_rank, non_blocking=True)",
        "                k: v.to(self.device, non_blocking=True)",
    ),
    (
        "train/trainer.py",
        "            torch.accelerator.synchronize()\n            self._marks[name] = time.perf_counter()",
        "            if torch.accelerator.is_available():\n                torch.accelerator.synchronize()\n"
        "            self._marks[name] = time.perf_counter()",
    ),
    (
        "train/trainer.py",
        "        torch.accelerator.synchronize()\n        return time.perf_counter()",
        "        if torch.accelerator.is_available():\n            torch.accelerator.synchronize()\n"
        "        return time.perf_counter()",
    ),
    # This project stores the verifier's last layer after its final norm (the extract stage applies it).
    (
        "models/eagle3/core.py",
        "                    self.verifier_norm(verifier_last_hidden_states)",
        "                    verifier_last_hidden_states",
    ),
)


def peer_python(root: Path) -> Path:
    """The peer's interpreter, its venv made and patched on first use."""
    home = root / ".eagle3" / "benchmarks" / f"speculators-{VERSION}"
    python = home / "bin" / "python"
    if (home / "patched").is_file():
        return python
    venv.create(home, with_pip=True, clear=True)
    site = next((home / "lib").glob("python*/site-packages"))
    project_site = next(p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "torch").is_dir())
    (site / "eagle3_project.pth").write_text(f"{project_site}\n")
    (home / "requirements.txt").write_text(REQUIREMENTS)
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--require-hashes", "-r", home / "requirements.txt"],
        check=True,
    )
    package = site / "speculators"
    for relative, line, replacement in CPU_PATCH:
        path = package / relative
        text = path.read_text()
        if line not in text:
            raise SystemExit(f"{path}: the line to patch is not there (not speculators {VERSION}?): {line.strip()}")
        path.write_text(text.replace(line, replacement))
    (home / "patched").write_text("\n".join(f"{r}: {line.strip()}" for r, line, _ in CPU_PATCH) + "\n")
    return python


def write_peer_data(root: Path, out: Path, d2t: torch.Tensor, t2d: torch.Tensor) -> tuple[Path, Path, list[int]]:
    """The training split as the peer reads it (module docstring); returns d2t and t2d's paths, and the training
    sequences' lengths."""
    from datasets import Dataset

    states = out / "hidden_states"
    states.mkdir(parents=True)
    rows: dict[str, list] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    for path in split_shards(root, "train"):
        reader = ShardReader(path)
        for position in range(len(reader)):
            sample = reader.read(position)
            index = len(rows["seq_len"])
            rows["input_ids"].append(sample.input_ids.tolist())
            rows["loss_mask"].append(sample.loss_mask.long().tolist())
            rows["seq_len"].append(len(sample.input_ids))
            # [layers, tokens, hidden] -> [tokens, layers, hidden]: the aux layers, then the final one.
            hidden = sample.hidden.permute(1, 0, 2).contiguous()
            save_file({"token_ids": sample.input_ids, "hidden_states": hidden}, str(states / f"hs_{index}.safetensors"))
    # Its trainer holds out a fraction in (0, 1) for validation: one copy of the last row, the training split is
    # then every sequence (train_data_ratio).
    for values in rows.values():
        values.append(values[-1])
    (states / f"hs_{len(rows['seq_len']) - 1}.safetensors").write_bytes(
        (states / f"hs_{index}.safetensors").read_bytes()
    )
    dataset = Dataset.from_dict(rows)
    dataset.set_format(type="torch")
    dataset.save_to_disk(str(out))
    np.save(out / f"d2t-{len(d2t)}.npy", d2t.numpy())
    np.save(out / f"t2d-{len(d2t)}.npy", t2d.numpy())
    return out / f"d2t-{len(d2t)}.npy", out / f"t2d-{len(d2t)}.npy", rows["seq_len"][:-1]


def train_data_ratio(sequences: int) -> float:
    """--train-data-ratio giving the peer's training split every one of `sequences` (its first int(ratio * rows)
    rows), the copy write_peer_data adds being its validation split."""
    return (sequences + 0.5) / (sequences + 1)


_SAMPLER = """
import json, sys
from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2 as Sampler
lengths, budget, seed = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sampler = Sampler(batch_max_length=budget, lengths=lengths, num_replicas=1, rank=0, seed=seed)
print(len(sampler))
"""


def peer_batches(python: Path, lengths: list[int], budget: int, seed: int) -> int:
    """Packed batches (optimizer steps) per epoch the peer's own sampler makes at `budget` tokens."""
    result = subprocess.run(
        [python, "-c", _SAMPLER, json.dumps(lengths), str(budget), str(seed)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(result.stdout.strip().splitlines()[-1])


def matching_budget(python: Path, lengths: list[int], steps_per_epoch: int, seed: int) -> int:
    """The smallest --total-seq-len at which the peer's sampler makes at most `steps_per_epoch` batches an epoch."""
    low, high = max(lengths), sum(lengths)
    while low < high:
        middle = (low + high) // 2
        if peer_batches(python, lengths, middle, seed) > steps_per_epoch:
            low = middle + 1
        else:
            high = middle
    return low


def import_peer_draft(checkpoint: Path, verifier_config: dict, aux_layer_ids: tuple[int, ...]) -> Eagle3Draft:
    """The peer's trained draft as this project's (its layout), every tensor of the shape the project's draft has."""
    tensors = load_file(str(checkpoint / "model.safetensors"))
    config = json.loads((checkpoint / "config.json").read_text())
    draft_vocab = int(config["draft_vocab_size"])
    shape = DraftConfig.from_verifier(verifier_config, aux_layer_ids, draft_vocab, layout=PEER_LAYOUT)
    draft = Eagle3Draft(shape)
    expected = draft.state_dict()
    renamed = {name.replace("layers.0.", "midlayer.", 1): tensor.float() for name, tensor in tensors.items()}
    loaded = {name: renamed[name] for name in expected if name != "aux_scale"}
    for name, tensor in loaded.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise SystemExit(
                f"{checkpoint}: {name} is {list(tensor.shape)}, the project's draft has {list(expected[name].shape)}"
            )
    draft.load_state_dict({**loaded, "aux_scale": torch.ones_like(draft.aux_scale)})
    return draft.eval()
