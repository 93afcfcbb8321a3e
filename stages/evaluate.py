"""DVC stage `evaluate` (eagle3/stages/evaluate.py): the same code path as `eagle3 evaluate`."""

import sys

from eagle3.runner import main, report_missing_modules_in_one_line

report_missing_modules_in_one_line()
from eagle3.stages import evaluate  # noqa: E402 (after the hook: a missing package is one line)

if __name__ == "__main__":
    sys.exit(main(evaluate))
