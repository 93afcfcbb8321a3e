"""DVC stage `export`: the same code path as `eagle3 export`."""

import sys

from eagle3.cli import main

if __name__ == "__main__":
    sys.exit(main(["export"]))
