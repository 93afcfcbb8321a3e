"""DVC stage `evaluate`: the same code path as `eagle3 evaluate`."""

import sys

from eagle3.cli import main

if __name__ == "__main__":
    sys.exit(main(["evaluate"]))
