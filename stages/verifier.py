"""DVC stage `verifier` (eagle3/stages/verifier.py): the same code path as `eagle3 verifier`."""

import sys

from eagle3.runner import main
from eagle3.stages import verifier

if __name__ == "__main__":
    sys.exit(main(verifier))
