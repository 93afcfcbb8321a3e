"""DVC stage `train`: the same code path as `eagle3 train`; also the torchrun entry point
(`torchrun --nproc-per-node N stages/train.py`)."""

import sys

from eagle3.cli import main

if __name__ == "__main__":
    sys.exit(main(["train"]))
