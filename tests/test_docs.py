"""What the docs tell users to run agrees with what the project ships: every `vllm serve` command in README.md and
docs/ is one vLLM's own parser accepts, and every one that serves the hero run's verifier names the model, ports,
parallelism, parsers and speculation that the shipped hero configuration's stages ask for."""

import json
import re
import shlex
from functools import cache
from urllib.parse import urlparse

import pytest
import yaml

from eagle3.init.shipped import CONFIGS_DIR, render
from eagle3.params.loading import validate
from eagle3.params.params_file import Params

from conftest import REPO, committed

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
HERO = validate(yaml.safe_load(render("kimi-k2.5", "B")), Params, CONFIGS_DIR / "kimi-k2.5.yaml")
# How the docs name the hero verifier's directory: its configured path, or this machine's own location.
HERO_MODEL = {HERO.verifier.source.path, "$EAGLE3_VERIFIER_PATH"}


def serve_commands(text: str) -> list[list[str]]:
    """Each `vllm serve ...` in the fenced code blocks of a Markdown text, continuation lines joined, split as the
    shell would, environment assignments and comments dropped: [model, flag, value, ...]."""
    commands = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if "vllm serve" not in line:
                continue
            words = shlex.split(line, comments=True)
            if "vllm" not in words or words[words.index("vllm") + 1 : words.index("vllm") + 2] != ["serve"]:
                continue
            start = words.index("vllm")
            commands.append(words[start + 2 :])
    return commands


@cache
def _parser():
    from vllm.entrypoints.cli.serve import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # No abbreviations: vLLM would take `--served-model-nam` for `--served-model-name`; the docs spell flags out.
    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve", allow_abbrev=False))


def parse(words: list[str]):
    """vLLM's own `vllm serve` parser: an unknown flag or a bad value fails here as it would on the machine."""
    try:
        return _parser().parse_args(words)
    except SystemExit:
        raise AssertionError(f"vllm serve {' '.join(words)}: vLLM's parser refuses it") from None


def _documented() -> list[tuple[str, list[str]]]:
    return [(path.relative_to(REPO).as_posix(), words) for path in DOCS for words in serve_commands(path.read_text())]


def test_the_docs_hold_the_hero_run_s_servers():
    hero = [words for name, words in _documented() if name == "docs/hero-run.md"]
    # The verifier alone, here (generate) and there (the reference); the verifier with the draft, there.
    assert len(hero) == 3


@pytest.mark.parametrize(
    "where, words", _documented(), ids=[f"{where}-{n}" for n, (where, _) in enumerate(_documented())]
)
def test_every_documented_vllm_serve_agrees_with_the_shipped_configuration(where, words):
    args = parse(words)
    if args.model_tag not in HERO_MODEL:
        return
    endpoints = {urlparse(str(e.url)).port: e for e in HERO.evaluate.servers.endpoints}
    generate_port = urlparse(str(HERO.generate.openai.base_urls[0])).port
    names = {HERO.generate.openai.model} | {e.model for e in endpoints.values()}
    assert names == set(args.served_model_name or [None]), (where, args.served_model_name, names)
    assert args.tensor_parallel_size == HERO.extract.vllm.tensor_parallel_size, where
    assert args.trust_remote_code == HERO.verifier.trust_remote_code, where
    # Kimi-K2.5 is multimodal; generate's reasoning check refuses a server that drops the thinking text.
    assert args.language_model_only and args.reasoning_parser == "kimi_k2", where
    endpoint = endpoints.get(args.port)
    assert endpoint is not None, f"{where}: port {args.port} is none of evaluate.servers.endpoints' {sorted(endpoints)}"
    speculative = args.speculative_config or {}
    if endpoint.serves == "none":
        assert not speculative and args.port == generate_port, where
    else:
        assert speculative.get("method") == endpoint.serves and speculative.get("num_speculative_tokens") == endpoint.k
        assert speculative.get("model") == "models/draft", where
        # evaluate reads each request's own acceptance from the server.
        assert args.per_request_spec_decode_metrics == "detailed", where


def test_a_command_that_disagrees_is_caught():
    hero_run = (REPO / "docs/hero-run.md").read_text()
    renamed = hero_run.replace("--served-model-name moonshotai/Kimi-K2.5 \\\n", "--served-model-name kimi \\\n")
    assert renamed != hero_run
    with pytest.raises(AssertionError, match="kimi"):
        for words in serve_commands(renamed):
            test_every_documented_vllm_serve_agrees_with_the_shipped_configuration("docs/hero-run.md", words)
    with pytest.raises(AssertionError, match="vLLM's parser refuses it"):
        parse(["/models/Kimi-K2.5", "--served-model-nam", "kimi"])


def test_the_readme_quotes_the_committed_headline():
    """The README's sample of `metrics/eval.json` is the committed file's headline, so a re-run that moves a figure
    cannot leave the README behind; the committed one, since a `make repro` on another kind of CPU rewrites the
    workspace's with its own figures (a user who reproduces and then tests must not see a failure)."""
    readme = (REPO / "README.md").read_text()
    quoted = re.search(r"^## Your results$.*?```json\n(.*?)```", readme, flags=re.S | re.M)
    assert quoted, "README.md: no json block under '## Your results'"
    assert json.loads(quoted.group(1)) == json.loads(committed("metrics/eval.json"))["headline"]


def test_every_docs_page_is_linked_from_the_readme():
    readme = (REPO / "README.md").read_text()
    pages = [
        p.relative_to(REPO).as_posix() for p in [*sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks/README.md"]
    ]
    assert [page for page in pages if f"]({page})" not in readme] == []


def test_the_params_reference_lists_every_key_as_the_models_define_it():
    """docs/configuration.md's table is what eagle3/params/reference.py generates from the pydantic models: a key
    added, removed, re-defaulted or re-commented without `python -m eagle3.params.reference --write` fails here."""
    from eagle3.params import reference

    documented = reference.current(reference.DOC.read_text())
    assert documented is not None, f"{reference.DOC}: no generated params reference"
    assert documented == reference.render()
    keys = {row[0] for row in reference.rows(Params)}
    expected = {"train.ttt_steps", "extract.max_seq_len", "evaluate.servers", "prepare.sources[]{kind: hf}.revision"}
    assert expected <= keys


def test_the_readme_states_the_requirements_the_makefile_and_locks_enforce():
    """Python version, platform, the CPU torch's index and the CUDA lock's driver, as `make setup` applies them."""
    from eagle3 import locked_environment

    readme = (REPO / "README.md").read_text()
    requirements = readme[readme.index("## Requirements") : readme.index("\n## ", readme.index("## Requirements") + 3)]
    makefile = (REPO / "Makefile").read_text()
    python = re.search(r"^LOCK_PYTHON := (\S+)$", makefile, flags=re.M).group(1)
    platform = re.search(r"^LOCK_PLATFORM := (\S+)$", makefile, flags=re.M).group(1)
    links = re.search(r"^TORCH_CPU_LINKS \?= (\S+)$", makefile, flags=re.M).group(1)
    assert f"**Python {python}**" in requirements and f"`make setup PYTHON=python{python}`" in requirements
    assert f"`{platform}`" in requirements and f"`{links}`" in requirements
    assert f"a driver >= {locked_environment.CUDA_LOCK_DRIVER}" in requirements
    for lock in ("cpu", "cuda"):
        header = (REPO / "locks" / f"{lock}.txt").read_text().splitlines()[0]
        assert header == f"# eagle3 lock for Python {python} on {platform}"
