"""DVC stage `report` (eagle3/stages/report.py): the same code path as `eagle3 report`."""

import sys

from eagle3.runner import main
from eagle3.stages import report

if __name__ == "__main__":
    sys.exit(main(report))
