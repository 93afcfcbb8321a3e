"""The command line's conventions: --params before or after the command, the params file's directory as the project
root for every command, --version, and a description on every command's help."""

import json
from importlib.metadata import version

import pytest
from test_plan import _metrics

from eagle3.cli import STAGES, TOOLS, build_parser, main, resolve

from conftest import eagle3, smoke_params, write_params


def test_version_is_the_installed_package_s():
    assert eagle3(".", "--version").stdout.strip() == f"eagle3 {version('eagle3')}"


@pytest.mark.parametrize("command", [*STAGES, *TOOLS])
def test_every_command_s_help_says_what_it_does(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    usage, _, rest = capsys.readouterr().out.partition("\n\n")
    description = rest.split("\n\n")[0].replace("\n", " ")
    assert usage.startswith(f"usage: eagle3 {command}")
    # A sentence of its own, not the option list that follows it.
    assert len(description) > 30 and not description.startswith(("options:", "positional arguments:")), description


def test_every_tool_names_functions_that_exist_and_the_parser_offers_exactly_the_stages_and_tools():
    for name, tool in TOOLS.items():
        for target in filter(None, (tool.arguments, tool.run)):
            assert callable(resolve(target)), f"{name}: {target}"
    commands = next(action for action in build_parser()._actions if action.dest == "command").choices
    assert list(commands) == [*STAGES, *TOOLS]


def test_no_command_left_for_an_earlier_name():
    commands = next(action for action in build_parser()._actions if action.dest == "command").choices
    assert "lineage" not in commands


def test_params_after_the_command_and_its_directory_is_the_root(tmp_path):
    """From another directory, `--params project/params.yaml` before or after the command reads that project."""
    project = tmp_path / "project"
    project.mkdir()
    params = smoke_params()
    params.setdefault("train", {})["ttt_steps"] = 5
    write_params(project, params)
    for args in (("--params", "project/params.yaml", "check"), ("check", "--params", "project/params.yaml")):
        resolved = json.loads(eagle3(tmp_path, *args).stdout)
        assert resolved["train"]["ttt_steps"] == 5
    # A stage: vocab reads the project's answers, which this project does not have: the error names them there.
    for args in (("--params", "project/params.yaml", "vocab"), ("vocab", "--params", "project/params.yaml")):
        failed = eagle3(tmp_path, *args, check=False)
        assert failed.returncode == 2 and f"{project}/" in failed.stderr.strip().splitlines()[-1], failed.stderr
    # A tool: the plan reads the project's measured metrics, not the current directory's (there are none).
    _metrics(project, ratio=1.9)
    run = ("--samples", "3000", "--mean-tokens", "1024")
    plan = json.loads(
        eagle3(tmp_path, "plan", "--params", "project/params.yaml", "--verifier", "kimi-k2.5", *run, "--json").stdout
    )
    assert plan["inputs"]["compression_ratio"] == 1.9 and plan["train_memory"]["ttt_steps"] == 5
    assert "metrics/extract.json not found" in eagle3(tmp_path, "plan", *run, check=False).stderr
