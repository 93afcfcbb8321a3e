"""`eagle3 plan` reads the configuration: every figure params.yaml decides comes from it (a flag still overrides),
equals the plan of the same values given as flags, and each input names its source."""

import copy
import json

import pytest
import yaml

from eagle3.init.shipped import render
from eagle3.plan.configured import CONFIGURED

from conftest import eagle3, write_params

# The training-memory estimate measured by the module's first plan, read by the later ones.
pytestmark = pytest.mark.usefixtures("train_memory_cache")

SEED = ("--mean-tokens", "16384", "--compression-ratio", "1.476")
# The hero configuration with a value other than every flag's built-in default.
CHANGED = {
    ("prepare", "max_rows"): 2000,
    ("extract", "max_seq_len"): 24576,
    ("extract", "aux_layer_ids"): [2, 30],
    ("extract", "storage"): "fp8-aux",
    ("train", "epochs"): 3,
    ("train", "ttt_steps"): 5,
    ("vocab", "draft_vocab_size"): 16000,
    ("train", "keep_checkpoints"): 4,
    ("train", "stream_buffer_gb"): 32.0,
    ("train", "sharding"): "fsdp",
    ("train", "activation_checkpointing"): "mlp",
    ("train", "launch"): {"processes_per_node": 4, "nodes": 1, "gpu": "h200"},
    ("train", "draft_layout"): {"norm_before_fc": True},
    # A process's part of the token budget is one longest sample, as the flags' plan (no batches) assumes.
    ("train", "max_tokens_per_batch"): 4 * 24576,
    ("train", "batch_size"): 32,
    ("train", "optimizer"): "adamw",  # muon refuses fsdp
}
# The same values as flags.
FLAGS = (
    "--samples", "2000", "--max-tokens", "24576", "--layers", "3", "--storage", "fp8-aux", "--epochs", "3",
    "--ttt-steps", "5", "--draft-vocab", "16000", "--keep-checkpoints", "4", "--stream-buffer-gb", "32",
    "--sharding", "fsdp", "--recompute", "mlp", "--gpus", "4", "--draft-layout", "norm_before_fc",
    "--gpu", "h200", "--batch-size", "32", "--max-tokens-per-batch", "98304", "--optimizer", "adamw",
)  # fmt: skip


def _hero(changes: dict) -> dict:
    params = yaml.safe_load(render("kimi-k2.5", "B"))
    for (section, key), value in changes.items():
        params[section][key] = copy.deepcopy(value)
    return params


def _plan(root, *args) -> dict:
    return json.loads(eagle3(root, "plan", *SEED, *args, "--json").stdout)


# What the params decide beyond the flags: the runbook's counted work (answers from prepare's rows, the evaluation
# of evaluate's configurations), so every figure priced from it.
PRICED_FROM_WORK = ("scenarios", "recommendation", "largest_runs", "break_even_a_vs_b", "storage_options", "answer")


def _figures(plan: dict) -> dict:
    """Everything the flags can also give: not where the inputs came from, nor the work only params count."""
    dropped = ("sources", "configuration", "configured_layout", "work")
    inputs = {k: v for k, v in plan["inputs"].items() if k not in dropped}
    return {**{k: v for k, v in plan.items() if k not in PRICED_FROM_WORK}, "inputs": inputs}


def test_the_params_decide_what_the_flags_would_and_each_input_names_its_source(tmp_path):
    configured = tmp_path / "configured"
    configured.mkdir()
    write_params(configured, _hero(CHANGED))
    by_hand = tmp_path / "by-hand"
    by_hand.mkdir()
    from_params, from_flags = _plan(configured), _plan(by_hand, *FLAGS)
    assert _figures(from_params) == _figures(from_flags)
    # The params also count the run's work: 2,000 + 128 held-out rows answered (no prepared data yet: one each),
    # and each evaluate server's turns; without them no evaluation is priced.
    work = from_params["inputs"]["work"]
    assert work["answers"] == 2128 and [run["configuration"] for run in work["evaluation"]] == ["none", "eagle3 k=3"]
    assert from_flags["inputs"]["work"]["evaluation"] == []
    steps = [step["name"] for step in from_params["scenarios"]["B"]["steps"]]
    assert steps[-3:] == ["evaluate none", "evaluate eagle3 k=3", "push_results"]
    assert len(FLAGS) == 2 * len(CONFIGURED)
    # Against a hand computation: 2000 x 16384 tokens, 3 captured layers of 7168 bf16 values; fp8-aux storage.
    tokens = 2000 * 16384
    assert from_params["tokens"] == tokens
    assert from_params["hidden_states"]["raw_bytes"] == tokens * 3 * 7168 * 2
    # The draft the trainer builds from these settings (eagle3/plan/memory.py draft_figures), its checkpoints
    # from the optimizer's state (AdamW: two moments and a step count per parameter), 4 kept.
    from eagle3.params.train import TrainParams, draft_settings
    from eagle3.plan.facts import KIMI_K2_5_TEXT_CONFIG
    from eagle3.plan.memory import draft_figures

    train = TrainParams.model_validate(
        {key: value for (section, key), value in CHANGED.items() if section == "train" and key != "launch"}
    )
    figures = draft_figures(KIMI_K2_5_TEXT_CONFIG, 16000, draft_settings(train), aux_layers=2)
    assert from_params["draft_params"] == figures.parameters
    assert from_params["checkpoints_bytes"] == figures.checkpoint_bytes * 4
    inputs = from_params["inputs"]
    assert inputs["storage"] == "fp8-aux" and inputs["max_tokens"] == 24576 and inputs["there"]["gpus"] == 4
    assert inputs["there"]["gpu"] == "h200" and inputs["configuration"]["gpu"] == "params.yaml train.launch.gpu"
    memory = from_params["train_memory"]
    assert (memory["ttt_steps"], memory["processes"], memory["sharding"]) == (5, 4, "fsdp")
    assert inputs["recompute"] == "mlp" and inputs["configured_layout"] == "A or B"
    assert inputs["configuration"] == {flag: f"params.yaml {key}" for flag, key in CONFIGURED.items()}
    assert from_flags["inputs"]["configuration"] == {flag: "--" + flag.replace("_", "-") for flag in CONFIGURED}
    assert inputs["sources"]["verifier"] == (
        "params.yaml verifier.source.name (moonshotai/Kimi-K2.5: preset kimi-k2.5)"
    )


def test_a_flag_overrides_the_params_and_says_so(tmp_path):
    write_params(tmp_path, _hero(CHANGED))
    plan = _plan(tmp_path, "--ttt-steps", "3")
    assert plan["train_memory"]["ttt_steps"] == 3
    assert plan["inputs"]["configuration"]["ttt_steps"] == "--ttt-steps"
    assert plan["inputs"]["configuration"]["epochs"] == "params.yaml train.epochs"


def test_without_params_the_shipped_configuration_answers_and_is_named(tmp_path):
    """No params file: every setting the shipped hero configuration decides is its value, named as its; what the
    run is (samples, length, storage) is asked for or measured, and the GPUs it leaves open fall back."""
    from eagle3.plan.configured import shipped_params

    shipped = shipped_params()
    plan = _plan(tmp_path, "--samples", "3000")
    configuration, inputs = plan["inputs"]["configuration"], plan["inputs"]
    assert configuration["ttt_steps"] == "the shipped kimi-k2.5 configuration's train.ttt_steps"
    assert plan["train_memory"]["ttt_steps"] == shipped.train.ttt_steps
    assert inputs["keep_checkpoints"] == shipped.train.keep_checkpoints == 2
    assert configuration["keep_checkpoints"] == "the shipped kimi-k2.5 configuration's train.keep_checkpoints"
    assert inputs["optimizer"] == shipped.train.optimizer == "muon"
    assert configuration["samples"] == "--samples" and configuration["storage"] == "default of --storage"
    assert configuration["gpu"] == "default of --gpu" and inputs["there"]["gpu"] == "b200"
    assert plan["inputs"]["configured_layout"] is None


def test_the_plan_says_when_the_params_are_set_for_another_layout(tmp_path):
    write_params(tmp_path, _hero({("prepare", "max_rows"): 3000}))
    plan = _plan(tmp_path, "--disk-tb", "1")
    assert plan["recommendation"] == "C"
    assert (
        "The params are set for layout A or B; for C set train.hidden_states: streamed, extract.splits: [heldout] "
        "(`eagle3 init NAME --layout C` rewrites a shipped configuration so)."
    ) in plan["answer"]


def test_the_plan_is_for_the_configured_verifier_or_refused(tmp_path, verifier_project):
    """Params of a verifier the plan cannot shape here are refused, naming --verifier (never planned as Kimi's);
    where the verifier stage has run, its recorded copy is what the plan shapes."""
    from conftest import copy_project, smoke_params

    write_params(tmp_path, smoke_params())
    result = eagle3(tmp_path, "plan", "--samples", "3000", "--mean-tokens", "512", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        "eagle3 plan: error: --verifier: params.yaml configures HuggingFaceTB/SmolLM2-135M-Instruct, whose shape "
        "the plan does not know here (not a preset, no directory, the verifier stage has not run here): pass "
        "--verifier with its config.json or model directory, or run `dvc repro verifier` first"
    )
    root = copy_project(verifier_project, tmp_path / "recorded", smoke_params())
    plan = json.loads(
        eagle3(
            root, "plan", "--samples", "3000", "--mean-tokens", "512", "--compression-ratio", "1.476", "--json"
        ).stdout
    )
    verifier = plan["inputs"]["verifier"]
    assert (verifier["name"], verifier["hidden_size"], verifier["num_layers"]) == (
        str(root / "models/verifier"),
        576,
        30,
    )
    assert plan["inputs"]["sources"]["verifier"].endswith("as the verifier stage recorded it in models/verifier)")
    assert plan["train_memory"]["ttt_steps"] == 3  # the params' own


def test_a_mean_longer_than_the_configured_sequences_is_one_line_naming_the_key(tmp_path):
    shorter = {"max_tokens": 4096, "temperature": 1.0, "top_p": 0.95, "seed": 0}
    write_params(tmp_path, _hero({("extract", "max_seq_len"): 8192, ("generate", "sampling"): shorter}))
    result = eagle3(tmp_path, "plan", *SEED, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "eagle3 plan: error: --mean-tokens (16384) cannot exceed the longest sample, 8192 tokens "
        "(params.yaml extract.max_seq_len)"
    )


def test_layout_c_whose_verifier_and_trainer_do_not_fit_a_gpu_is_ruled_out(tmp_path):
    """The share of each GPU the params give the verifier beside the trainers, held to the GPU kind: as shipped for
    stored states (0.9 of an H200) it leaves no room, as `eagle3 init --layout C --gpu h200` sizes it (0.64, phases)
    it fits."""
    from eagle3.init.shipped import render

    params = yaml.safe_load(render("kimi-k2.5", "C", "h200"))
    write_params(tmp_path, params)
    sized = _plan(tmp_path)["scenarios"]["C"]
    assert sized["problems"] == [] and sized["feasible"]
    params["extract"]["vllm"]["gpu_memory_utilization"] = 0.9
    write_params(tmp_path, params)
    (problem,) = _plan(tmp_path)["scenarios"]["C"]["problems"]
    assert problem.startswith(
        "streamed states do not fit a GPU there: in phases, the verifier's 0.9 of a NVIDIA H200 SXM (127 GB) awake"
    )


def test_the_training_memory_is_sized_at_what_one_process_holds_at_once(tmp_path):
    """The hero batch (163,840 tokens) on 4 GPUs: a process trains up to 40,960 padded tokens at once (its part of
    the budget), twice the one 20,480-token sample it holds on 8 GPUs; without a token budget, batch_size /
    processes longest samples."""
    memory = {}
    for name, changes in {
        "on 8": {},
        "on 4": {("train", "launch"): {"processes_per_node": 4, "nodes": 1, "gpu": "b200"}},
        "no budget": {("train", "max_tokens_per_batch"): None, ("train", "batch_size"): 16},
    }.items():
        (tmp_path / name).mkdir()
        write_params(tmp_path / name, _hero(changes))
        plan = _plan(tmp_path / name)
        assert plan["inputs"]["max_tokens"] == 20480
        memory[name] = (plan["inputs"]["process_tokens"], plan["train_memory"]["settings"]["off"])
    assert [tokens for tokens, _ in memory.values()] == [20480, 40960, 2 * 20480]
    # The estimate grows with those tokens: the same draft per GPU, twice the activations.
    resting, at_max = memory["on 8"][1]["resting_bytes"], memory["on 8"][1]["at_max_tokens_bytes"]
    assert memory["on 4"][1]["at_max_tokens_bytes"] > at_max + 0.9 * (at_max - resting)


def test_the_training_memory_is_the_draft_the_params_shape(tmp_path):
    """train.intermediate_size and train.attention shape the draft the plan sizes, as they shape the one the train
    stage trains: a narrower MLP and fewer heads take less memory at rest, by what their weights and optimizer
    state weigh (counted here from the draft itself, not the estimator)."""
    import torch

    from eagle3.modeling.draft import Eagle3Draft
    from eagle3.params.train import TrainParams
    from eagle3.plan.facts import KIMI_K2_5_TEXT_CONFIG
    from eagle3.training.memory import draft_config_for

    narrow = {"intermediate_size": 9216, "attention": {"num_attention_heads": 32, "num_key_value_heads": 8}}
    resting, parameters = {}, {}
    for name, train in {"derived": {}, "narrow": narrow}.items():
        params = _hero({})
        params["train"].update(train)
        (tmp_path / name).mkdir()
        write_params(tmp_path / name, params)
        plan = _plan(tmp_path / name)
        resting[name] = plan["train_memory"]["settings"]["off"]["resting_bytes"]
        shaped = TrainParams.model_validate(params["train"])
        vocab = params["vocab"]["draft_vocab_size"]
        with torch.device("meta"):
            draft = Eagle3Draft(draft_config_for(KIMI_K2_5_TEXT_CONFIG, vocab, shaped))
        parameters[name] = sum(p.numel() for p in draft.parameters() if p.requires_grad)
        if name == "narrow":
            source = plan["train_memory"]["source"]
            assert source.endswith("MLP width 9216, attention num_attention_heads 32, num_key_value_heads 8")
    saved = parameters["derived"] - parameters["narrow"]
    assert saved > 10**8  # the MLP alone: 3 x 7168 x (18432 - 9216)
    # Per trained parameter at rest: its fp32 weight and gradient, and the optimizer's state (one or two moments).
    assert 12 <= (resting["derived"] - resting["narrow"]) / saved <= 20


def test_the_first_plan_prices_the_benchmark_sets_from_their_declared_records(tmp_path):
    """Before prepare and benchmarks have run, evaluate's turns are the held-out rows, the long-context probes and
    every benchmark set's declared records times their turns (MT-bench 80 x 2, HumanEval 164, GSM8K 1,319): what
    each evaluate server is asked, per run."""
    write_params(tmp_path, _hero({("prepare", "max_rows"): 3000}))
    work = _plan(tmp_path)["inputs"]["work"]
    turns = 128 + 32 + 80 * 2 + 164 + 1319
    assert {run["turns"] for run in work["evaluation"]} == {turns} == {1803}
    assert work["evaluation_source"] == (
        "128 held-out, mt-bench 80 x 2, humaneval 164 x 1, gsm8k 1319 x 1, 32 long-context probes "
        "(benchmarks.sets[].records until they are made)"
    )


def test_the_link_reads_as_configured_with_its_efficiency(tmp_path):
    plan = _plan(tmp_path, "--samples", "3000")
    assert plan["inputs"]["sources"]["link"] == "--link-gbit 5 (default) x --link-efficiency 0.8 (default)"
    plan = _plan(tmp_path, "--samples", "3000", "--link-gbit", "10")
    assert plan["inputs"]["sources"]["link"] == "--link-gbit 10 x --link-efficiency 0.8 (default)"
    assert plan["rates"]["link_bytes_per_s"] == 10e9 * 0.8 / 8
    # The DVC remote's speeds follow the link until given, and then price A's pull of the states.
    assert plan["inputs"]["sources"]["remote_down"] == "assumed: the link (--remote-down-gbit)"
    given = _plan(tmp_path, "--samples", "3000", "--remote-down-gbit", "20")
    assert given["rates"]["remote_down_bytes_per_s"] == 20e9 / 8
    stored = given["hidden_states"]["stored_bytes"]
    assert given["scenarios"]["A"]["rented_steps_s"]["ship_hidden_states"] == pytest.approx(stored / (20e9 / 8))


def test_a_block_draft_is_planned_with_its_own_memory_and_training_rate(tmp_path):
    """train.draft_method dflash in the hero configuration: the plan sizes the block draft the trainer builds, its
    training memory from its own step, its training rate from the measured chain draft's scaled by the two steps'
    matmul FLOPs (said so), so its training takes less time than the chain draft's on the same data."""
    plans = {}
    for name in ("chain", "block"):
        params = _hero({})
        if name == "block":
            params["train"] |= {"draft_method": "dflash", "dflash": {"layers": 6, "block_size": 16}}
            params["export"]["num_speculative_tokens"] = params["evaluate"]["headline_k"] = 15
            params["evaluate"]["servers"]["endpoints"][1] |= {"serves": "dflash", "k": 15}
        (tmp_path / name).mkdir()
        write_params(tmp_path / name, params)
        plans[name] = _plan(tmp_path / name)
    block, chain = plans["block"], plans["chain"]
    assert "a DFlash draft of 6 layers, blocks of 16 at 64 anchors per sample" in block["train_memory"]["source"]
    assert list(block["train_memory"]["settings"]) == ["off"]
    assert "a block draft: the chain draft's measured rate x" in block["inputs"]["sources"]["train"]
    assert "block draft" not in chain["inputs"]["sources"]["train"]
    assert block["draft_params"] > chain["draft_params"]
    train = {
        name: next(s for s in plan["scenarios"]["B"]["steps"] if s["name"] == "train") for name, plan in plans.items()
    }
    assert train["block"]["seconds"] < train["chain"]["seconds"]
