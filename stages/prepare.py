"""DVC stage `prepare` (eagle3/stages/prepare.py): the same code path as `eagle3 prepare`."""

import sys

from eagle3.runner import main, report_missing_modules_in_one_line

report_missing_modules_in_one_line()
from eagle3.stages import prepare  # noqa: E402 (after the hook: a missing package is one line)

if __name__ == "__main__":
    sys.exit(main(prepare))
