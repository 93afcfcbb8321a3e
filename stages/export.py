"""DVC stage `export` (eagle3/stages/export.py): the same code path as `eagle3 export`."""

import sys

from eagle3.runner import main
from eagle3.stages import export

if __name__ == "__main__":
    sys.exit(main(export))
