"""DVC stage `benchmarks` (eagle3/stages/benchmarks.py): the same code path as `eagle3 benchmarks`."""

import sys

from eagle3.runner import main, report_missing_modules_in_one_line

report_missing_modules_in_one_line()
from eagle3.stages import benchmarks  # noqa: E402 (after the hook: a missing package is one line)

if __name__ == "__main__":
    sys.exit(main(benchmarks))
