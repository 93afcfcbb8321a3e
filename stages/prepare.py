"""DVC stage `prepare` (eagle3/stages/prepare.py): the same code path as `eagle3 prepare`."""

import sys

from eagle3.runner import main
from eagle3.stages import prepare

if __name__ == "__main__":
    sys.exit(main(prepare))
