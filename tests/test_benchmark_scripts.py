"""Every script in benchmarks/ imports what it uses from the project as the project stands: a module moved or
renamed breaks a benchmark here rather than on the day someone runs it."""

import importlib.util
import sys
from pathlib import Path

import pytest

from conftest import REPO

SCRIPTS = sorted(path for path in (REPO / "benchmarks").glob("*.py") if "__main__" in path.read_text())


@pytest.mark.parametrize("script", SCRIPTS, ids=[path.name for path in SCRIPTS])
def test_the_benchmark_imports(script: Path, monkeypatch):
    monkeypatch.syspath_prepend(str(script.parent))
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert callable(module.main)
