"""DVC stage `extract` (eagle3/stages/extract.py): the same code path as `eagle3 extract`."""

import sys

from eagle3.runner import main, report_missing_modules_in_one_line

report_missing_modules_in_one_line()
from eagle3.stages import extract  # noqa: E402 (after the hook: a missing package is one line)

if __name__ == "__main__":
    sys.exit(main(extract))
