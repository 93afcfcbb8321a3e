"""Stage `report` (last): the license gate, the lineage record and the model card (eagle3/publish/lineage.py).

`eagle3 report` writes reports/lineage.{json,md} and models/draft/README.md; `eagle3 report --check` writes
nothing and verifies a published record against the workspace.
"""

import argparse
from pathlib import Path

from eagle3.params.base import StageParams
from eagle3.params.export import ExportParams
from eagle3.params.report import ReportParams
from eagle3.publish.lineage import check, publish


class Params(StageParams):
    report: ReportParams = ReportParams()
    # The serve command on the card uses the k the draft was exported for.
    export: ExportParams = ExportParams()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help="verify the workspace against dvc.lock and reports/lineage.json; write nothing",
    )


def run(params: Params, root: Path, options: argparse.Namespace | None = None) -> None:
    if getattr(options, "check", False):
        check(root)
    else:
        publish(params.report, params.export, root)
