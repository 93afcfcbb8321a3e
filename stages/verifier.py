"""DVC stage `verifier` (eagle3/stages/verifier.py): the same code path as `eagle3 verifier`."""

import sys

from eagle3.runner import main, report_missing_modules_in_one_line

report_missing_modules_in_one_line()
from eagle3.stages import verifier  # noqa: E402 (after the hook: a missing package is one line)

if __name__ == "__main__":
    sys.exit(main(verifier))
