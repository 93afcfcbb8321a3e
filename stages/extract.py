"""DVC stage `extract` (eagle3/stages/extract.py): the same code path as `eagle3 extract`."""

import sys

from eagle3.runner import main
from eagle3.stages import extract

if __name__ == "__main__":
    sys.exit(main(extract))
