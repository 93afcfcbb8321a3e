"""DVC stage `vocab` (eagle3/stages/vocab.py): the same code path as `eagle3 vocab`."""

import sys

from eagle3.runner import main
from eagle3.stages import vocab

if __name__ == "__main__":
    sys.exit(main(vocab))
