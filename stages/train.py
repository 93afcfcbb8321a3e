"""DVC stage `train` (eagle3/stages/train.py): the same code path as `eagle3 train`.
Also the torchrun entry point: `torchrun --nproc-per-node N stages/train.py`."""

import sys

from eagle3.runner import main, report_missing_modules_in_one_line

report_missing_modules_in_one_line()
from eagle3.stages import train  # noqa: E402 (after the hook: a missing package is one line)

if __name__ == "__main__":
    sys.exit(main(train))
