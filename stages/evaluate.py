"""DVC stage `evaluate` (eagle3/stages/evaluate.py): the same code path as `eagle3 evaluate`."""

import sys

from eagle3.runner import main
from eagle3.stages import evaluate

if __name__ == "__main__":
    sys.exit(main(evaluate))
