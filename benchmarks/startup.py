"""Process start with the venv's bytecode compiled at install (`make setup`) vs compiled from source on every start.

    python benchmarks/startup.py [--rounds 3]

Every stage, CLI call, torchrun rank and test subprocess starts a Python process that imports torch, transformers
and often vLLM. Where PYTHONDONTWRITEBYTECODE is set (CI images, containers) and the installer wrote no bytecode,
each of those processes compiles those packages from source again. Both arms run with PYTHONDONTWRITEBYTECODE=1, in
alternation, in subprocesses of this one: `compiled` reads the venv's __pycache__; `from source` points
PYTHONPYCACHEPREFIX at an empty folder, so no bytecode is found and none is written. Prints the median seconds of
each import and the ratio (above 1: compiled bytecode is faster), and how many vLLM modules have bytecode.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IMPORTS = {
    "torch": "import torch",
    "transformers tokenizer": "from transformers import AutoTokenizer",
    "vllm": "import vllm",
}


def seconds(statement: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import vllm

    package = Path(vllm.__file__).parent
    sources = list(package.rglob("*.py"))
    compiled = sum(1 for source in sources if any((source.parent / "__pycache__").glob(f"{source.stem}.*.pyc")))
    print(f"vLLM modules with bytecode in the venv: {compiled}/{len(sources)}")
    base = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    base.pop("PYTHONPYCACHEPREFIX", None)
    with tempfile.TemporaryDirectory() as empty:
        arms = {"compiled": base, "from source": {**base, "PYTHONPYCACHEPREFIX": empty}}
        print(f"{'import':<24}{'compiled s':>12}{'from source s':>15}{'ratio':>8}")
        for name, statement in IMPORTS.items():
            times: dict[str, list[float]] = {arm: [] for arm in arms}
            for _ in range(args.rounds):
                for arm, env in arms.items():
                    times[arm].append(seconds(statement, env))
            fast, slow = (statistics.median(times[arm]) for arm in arms)
            print(f"{name:<24}{fast:>12.2f}{slow:>15.2f}{slow / fast:>8.2f}")


if __name__ == "__main__":
    main()
