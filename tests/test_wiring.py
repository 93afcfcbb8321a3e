"""The DVC wiring, proven from the code: each stage's deps name exactly the project modules its command imports,
its params cover every params.yaml section its code can read, and its outputs are the paths eagle3/paths.py owns.

Imports are read statically (every `import` statement in a module, function-level ones included, followed
transitively), so a module that only some code path imports still counts. Package `__init__.py` files are
executed by every import below them; they hold only a docstring (checked here), so they cannot change a
stage's output and are not listed as deps.
"""

import ast
import importlib
import shutil
from pathlib import Path

import pytest

from eagle3 import paths
from eagle3.params.loading import read_yaml
from eagle3.publish.dvc_graph import REPORT_STAGE, covers, entry_paths, param_keys

from conftest import REPO

PACKAGE = "eagle3"


def module_file(root: Path, name: str) -> Path | None:
    """The project file of module `name` (a .py file or a package's __init__.py), or None outside the project."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path) -> set[str]:
    """Every module an `import` statement anywhere in the file names, as absolute dotted names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            # `from package import name` imports a submodule when `name` is one.
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def import_closure(root: Path, entry: Path) -> set[Path]:
    """Project files that running `entry` imports, transitively (relative to root), the entry itself included."""
    seen: set[Path] = set()
    todo = [entry]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path):
            parts = name.split(".")
            # Importing a.b.c runs a/__init__.py and a/b/__init__.py first.
            for depth in range(1, len(parts) + 1):
                found = module_file(root, ".".join(parts[:depth]))
                if found is not None and found not in seen:
                    todo.append(found)
    return {path.relative_to(root) for path in seen}


def is_docstring_only(path: Path) -> bool:
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def stage_entry(definition: dict) -> Path:
    scripts = [word for word in definition["cmd"].split() if word.startswith("stages/") and word.endswith(".py")]
    assert len(scripts) == 1, f"cmd {definition['cmd']!r} should run one stages/<name>.py"
    return Path(scripts[0])


def wiring_problems(root: Path) -> list[str]:
    """Everything in root/dvc.yaml that disagrees with the code under root, one line each."""
    definitions = read_yaml(root / "dvc.yaml")["stages"]
    problems = []
    for init in sorted((root / PACKAGE).rglob("__init__.py")):
        if not is_docstring_only(init):
            problems.append(f"{init.relative_to(root)}: holds code; keep package inits to a docstring (see module doc)")
    for name, definition in definitions.items():
        deps = entry_paths(definition.get("deps"))
        code = {
            path
            for path in import_closure(root, root / stage_entry(definition))
            if path.name != "__init__.py" or not is_docstring_only(root / path)
        }
        for path in sorted(code):
            if not any(covers(dep, path.as_posix()) for dep in deps):
                problems.append(f"stage {name}: imports {path.as_posix()}, which is not among its deps")
        if name == REPORT_STAGE:
            continue  # the report records the lineage of all code: it depends on the whole of eagle3/ and stages/
        listed = {
            path.relative_to(root)
            for dep in deps
            if dep.split("/")[0] in (PACKAGE, "stages")
            for path in ([root / dep] if (root / dep).is_file() else sorted((root / dep).rglob("*.py")))
        }
        for path in sorted(listed - code):
            problems.append(f"stage {name}: lists {path.as_posix()} as a dep but never imports it (a needless rerun)")
    return problems


def test_every_stage_depends_on_exactly_the_code_it_imports():
    assert wiring_problems(REPO) == []


def test_the_check_catches_an_unlisted_import_and_a_stale_dep(tmp_path):
    """A stage whose module grows an import of an unlisted module (what export once did with the trainer) fails."""
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages/export.py").write_text("from eagle3.stages import export\n")
    package = tmp_path / PACKAGE
    (package / "stages").mkdir(parents=True)
    for init in (package / "__init__.py", package / "stages/__init__.py"):
        init.write_text('"""A package."""\n')
    (package / "stages/export.py").write_text("def run():\n    from eagle3.stages.train import latest_checkpoint\n")
    (package / "stages/train.py").write_text("import torch\nfrom eagle3 import shards\n")
    (package / "shards.py").write_text("")
    (package / "unused.py").write_text("")
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  export:\n    cmd: python stages/export.py\n"
        "    deps: [stages/export.py, eagle3/stages/export.py, eagle3/unused.py]\n"
    )
    assert wiring_problems(tmp_path) == [
        "stage export: imports eagle3/shards.py, which is not among its deps",
        "stage export: imports eagle3/stages/train.py, which is not among its deps",
        "stage export: lists eagle3/unused.py as a dep but never imports it (a needless rerun)",
    ]
    (package / "__init__.py").write_text("import os\n")
    assert "eagle3/__init__.py: holds code" in wiring_problems(tmp_path)[0]


def import_cycles(root: Path) -> list[list[str]]:
    """Every cycle among the project's modules (function-level imports included), each as the files around it."""
    graph = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        targets = {module_file(root, name) for name in imported_modules(path)}
        graph[path] = sorted(t for t in targets if t is not None and t != path and t.name != "__init__.py")
    cycles, state = [], {}

    def visit(path: Path, trail: list[Path]) -> None:
        state[path] = "open"
        for target in graph.get(path, []):
            if state.get(target) == "open":
                cycle = trail[trail.index(target) :] + [target]
                cycles.append([c.relative_to(root).as_posix() for c in cycle])
            elif target not in state:
                visit(target, [*trail, target])
        state[path] = "done"

    for path in graph:
        if path not in state:
            visit(path, [path])
    return cycles


def test_no_module_imports_itself_through_others():
    assert import_cycles(REPO) == []


# The layers below the stages: what several stages share lives here, so editing one stage's orchestration never
# makes another stage stale.
LOWER_LAYERS = ("training", "modeling", "formats", "engines", "chat", "publish", "plan", "preflight", "init", "remotes")


def stage_imports_below_the_stages(root: Path) -> list[str]:
    """`file: module` for each import of eagle3.stages (function-level ones included) in the lower layers."""
    return [
        f"{path.relative_to(root)}: {name}"
        for layer in LOWER_LAYERS
        for path in sorted((root / PACKAGE / layer).rglob("*.py"))
        for name in sorted(imported_modules(path))
        if name == "eagle3.stages" or name.startswith("eagle3.stages.")
    ]


def test_no_lower_layer_imports_a_stage():
    assert stage_imports_below_the_stages(REPO) == []
    train_deps = read_yaml(REPO / "dvc.yaml")["stages"]["train"]["deps"]
    assert "eagle3/stages/train.py" in train_deps and "eagle3/stages/extract.py" not in train_deps


def test_the_layer_check_finds_a_function_level_stage_import(tmp_path):
    training = tmp_path / PACKAGE / "training"
    training.mkdir(parents=True)
    (training / "loop.py").write_text("def go():\n    from eagle3.stages.extract import layer_ids\n")
    assert stage_imports_below_the_stages(tmp_path) == [
        "eagle3/training/loop.py: eagle3.stages.extract",
        "eagle3/training/loop.py: eagle3.stages.extract.layer_ids",
    ]


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import(tmp_path):
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text('"""A package."""\n')
    (package / "base.py").write_text("def open_backend():\n    from eagle3.backend import Backend\n")
    (package / "backend.py").write_text("from eagle3.base import open_backend\n")
    assert import_cycles(tmp_path) == [["eagle3/backend.py", "eagle3/base.py", "eagle3/backend.py"]]


def _stage_module(definition: dict):
    """The eagle3.stages module a stage's entry point runs."""
    names = [name for name in imported_modules(REPO / stage_entry(definition)) if name.startswith("eagle3.stages.")]
    assert len(names) == 1, names
    return importlib.import_module(names[0])


@pytest.mark.parametrize("stage", list(read_yaml(REPO / "dvc.yaml")["stages"]))
def test_params_cover_every_section_the_stage_can_read(stage):
    """A stage sees only the sections its `Params` declares (the runner validates nothing else into it), so
    covering those sections covers every key its code can read."""
    definition = read_yaml(REPO / "dvc.yaml")["stages"][stage]
    sections = list(_stage_module(definition).Params.model_fields)
    assert sections, f"stage {stage} reads no params section"
    tracked = param_keys(definition.get("params")).get("params.yaml", [])
    for section in sections:
        assert tracked is None or section in tracked, f"stage {stage} reads params section {section!r}: add it"


@pytest.mark.parametrize("stage", list(read_yaml(REPO / "dvc.yaml")["stages"]))
def test_a_stage_reads_its_sections_as_the_whole_file_does(stage):
    """Same section types and the same optional sections, so a params file valid for `eagle3 check` runs every stage."""
    from eagle3.params.params_file import Params

    for name, field in _stage_module(read_yaml(REPO / "dvc.yaml")["stages"][stage]).Params.model_fields.items():
        whole = Params.model_fields[name]
        assert (field.annotation, field.is_required()) == (whole.annotation, whole.is_required()), (stage, name)


def test_outputs_are_the_paths_eagle3_paths_owns():
    owned = {value.as_posix() for value in vars(paths).values() if isinstance(value, Path)}
    for name, definition in read_yaml(REPO / "dvc.yaml")["stages"].items():
        for field in ("outs", "metrics", "plots"):
            for out in entry_paths(definition.get(field)):
                where = f"{out} ({field[:-1]} of {name})"
                assert any(covers(path, out) for path in owned), f"{where} is not in eagle3/paths.py"


def test_stage_names_agree_everywhere():
    """dvc.yaml's stages, eagle3/stages/ modules, stages/ entry points and `eagle3 <command>` are one list."""
    from eagle3.cli import STAGES

    stages = list(read_yaml(REPO / "dvc.yaml")["stages"])
    assert list(STAGES) == stages
    assert sorted(p.stem for p in (REPO / "eagle3/stages").glob("*.py") if p.stem != "__init__") == sorted(stages)
    assert sorted(p.stem for p in (REPO / "stages").glob("*.py")) == sorted(stages)
    for name, definition in read_yaml(REPO / "dvc.yaml")["stages"].items():
        assert stage_entry(definition) == Path(f"stages/{name}.py")


def test_a_stage_entry_point_runs_outside_the_cli(tmp_path):
    """`python stages/<name>.py` is what DVC runs: it must parse its own options and report errors in one line."""
    import subprocess
    import sys

    shutil.copytree(REPO / "stages", tmp_path / "stages")
    (tmp_path / "params.yaml").write_text("verifier: [unclosed\n")
    result = subprocess.run([sys.executable, "stages/prepare.py"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"eagle3 prepare: error: {Path('params.yaml')}:2: invalid YAML: expected ',' or ']', but got '<stream end>'"
    ]
