"""DVC stage `generate` (eagle3/stages/generate.py): the same code path as `eagle3 generate`."""

import sys

from eagle3.runner import main
from eagle3.stages import generate

if __name__ == "__main__":
    sys.exit(main(generate))
