"""DVC stage `train` (eagle3/stages/train.py): the same code path as `eagle3 train`.
Also the torchrun entry point: `torchrun --nproc-per-node N stages/train.py`."""

import sys

from eagle3.runner import main
from eagle3.stages import train

if __name__ == "__main__":
    sys.exit(main(train))
