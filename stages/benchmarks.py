"""DVC stage `benchmarks` (eagle3/stages/benchmarks.py): the same code path as `eagle3 benchmarks`."""

import sys

from eagle3.runner import main
from eagle3.stages import benchmarks

if __name__ == "__main__":
    sys.exit(main(benchmarks))
