"""DVC stage `prepare`: the same code path as `eagle3 prepare`."""

import sys

from eagle3.cli import main

if __name__ == "__main__":
    sys.exit(main(["prepare"]))
