"""DVC stage `vocab`: the same code path as `eagle3 vocab`."""

import sys

from eagle3.cli import main

if __name__ == "__main__":
    sys.exit(main(["vocab"]))
