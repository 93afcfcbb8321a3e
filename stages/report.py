"""DVC stage `report`: the same code path as `eagle3 lineage`."""

import sys

from eagle3.cli import main

if __name__ == "__main__":
    sys.exit(main(["lineage"]))
