"""`eagle3 plan`: the printed plan (the answer in words, then tables; or JSON). Inputs
are resolved in eagle3/plan/inputs.py, the formulas are eagle3/plan/model.py's."""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from eagle3.gpu_kinds import GPUS
from eagle3.init.files import shipped_for
from eagle3.init.shipped import LAYOUT_KEYS
from eagle3.plan.facts import Budget, dollars, duration, size, to_json
from eagle3.plan.inputs import inputs_from_args
from eagle3.plan.model import (
    NEWTON_SCHULZ_MFU,
    TEXT_BYTES_PER_TOKEN,
    DiskNeed,
    Plan,
    compute,
)


def _disk_words(disk: DiskNeed) -> str:
    text = size(disk.bytes)
    if disk.budget_tb is not None:
        text += f" of {disk.budget_tb:g} TB" + ("" if disk.fits else " (does not fit)")
    return text


def _budget_words(budget: Budget, unit: str) -> str:
    if budget.low is None:
        return f"the budget of {unit}{budget.high:g}"
    return f"{unit}{budget.low:g}-{budget.high:g}"


def _largest_words(plan: Plan) -> str | None:
    """Per scenario, the largest run the given budgets and disks allow and what bounds it; None where none is given."""
    parts = []
    for key, _ in plan.scenarios.items():
        run = getattr(plan.largest_runs, key)
        if run.samples is None:
            continue
        text = f"{key} {run.samples:,} ({run.bounded_by}"
        if "disk there" not in run.limits:
            text += f"; the rented machine's disk then needs {size(run.disk_there_bytes)}"
        parts.append(text + ")")
    if not parts:
        return None
    return "Largest run within the given budgets and disks, in samples of this length: " + ", ".join(parts) + "."


def answer(plan: Plan) -> list[str]:
    """The plan in words: the decision, then the largest run each layout allows where a budget or disk is given."""
    largest = _largest_words(plan)
    return _decision(plan) + ([largest] if largest else [])


def _decision(plan: Plan) -> list[str]:
    """The two questions answered in words (disk; ship states, extract there or stream there), then the budget check
    where one is given."""
    inputs, scenarios = plan.inputs, dict(plan.scenarios.items())
    a, b, c = scenarios["A"], scenarios["B"], scenarios["C"]
    down = plan.rates.remote_down_bytes_per_s * 8 / 1e9
    lines = _recommendation(plan) + [
        f"Disk: the rented machine needs {_disk_words(b.disk.there)} to extract there (B), "
        f"{_disk_words(a.disk.there)} to receive shipped hidden states (A), or {_disk_words(c.disk.there)} to "
        f"stream them (C, {inputs.stream_buffer_gb:g} GB of buffer); here A needs {_disk_words(a.disk.here)} "
        f"(DVC cache link {inputs.cache_link}, +{inputs.headroom:.0%} headroom)."
    ]
    best, even = plan.recommendation, plan.break_even_a_vs_b
    if even.samples is not None:
        trade = (
            f"between A and B, shipping is cheaper below {even.samples:,.0f} samples of this length "
            f"({size(even.stored_bytes)} stored), extracting there above"
        )
    else:
        cheaper = "shipping" if even.meaning.startswith("A") else "extracting there"
        trade = f"between A and B, {cheaper} is cheaper at any size"
    ship = f"ship {size(plan.sizes.hidden_states.stored_bytes)} through the DVC remote at {down:.2f} Gbit/s"
    if best is None:
        limits = "; ".join(
            f"{key}: {', '.join(s.problems)}"
            + "".join(
                f" (at most {need.largest_samples:,} samples of this length fit {side})"
                for side, need in s.disk.sides()
                if not need.fits
            )
            for key, s in scenarios.items()
        )
        lines.append(f"No layout works with these inputs: {limits}.")
        return lines
    verbs = {
        "A": f"Extract here and {ship} (A)",
        "B": "Extract on the rented machine (B)",
        "C": "Stream the hidden states on the rented machine, storing none (C, train.hidden_states: streamed)",
    }
    others = {"A": f"{ship} (A)", "B": "extract there (B)", "C": "stream there (C)"}
    chosen = scenarios[best]
    versus = "; ".join(
        f"{others[key]}: {duration(s.rented_s)}, {dollars(s.cost_usd)}"
        if s.feasible
        else f"{others[key]} is ruled out: {', '.join(s.problems)}"
        for key, s in scenarios.items()
        if key != best
    )
    lines.append(f"{verbs[best]}: {duration(chosen.rented_s)} rented, {dollars(chosen.cost_usd)} ({versus}); {trade}.")
    lines += _layout_words(inputs, best)
    usd, hours = inputs.budget_usd, inputs.budget_hours
    if usd is not None or hours is not None:
        verdicts = []
        if usd is not None:
            verdicts.append(f"{dollars(chosen.cost_usd)} is {chosen.budget.usd} {_budget_words(usd, '$')}")
        if hours is not None:
            used = f"{chosen.rented_s / 3600:.2g} h"
            verdicts.append(f"{used} is {chosen.budget.hours} {_budget_words(hours, '')} h")
        lines.append(f"Budget ({best}, training included): " + "; ".join(verdicts) + ".")
    return lines


WHAT_LAYOUTS_DO = {
    "A": "extract here and ship the hidden states",
    "B": "extract on the rented machine",
    "C": "stream the hidden states on the rented machine, storing none",
}


def _recommendation(plan: Plan) -> list[str]:
    """The answer first: the layout to use, its time and cost, and whether the params are set for it."""
    best = plan.recommendation
    if best is None:
        return ["Recommended: no layout: none works with these inputs (below)."]
    chosen, configured = getattr(plan.scenarios, best), plan.inputs.configured_layout
    if configured is not None and best in configured:
        how = "the params are set for it"
    else:
        gpu, name = plan.inputs.there.gpu, shipped_for(plan.inputs.verifier.name) or "NAME"
        how = f"`eagle3 init {name} --layout {best} --gpu {gpu}` sets a shipped configuration for it"
    return [
        f"Recommended: layout {best} ({WHAT_LAYOUTS_DO[best]}): {duration(chosen.rented_s)} rented, "
        f"{dollars(chosen.cost_usd)}; {how}."
    ]


def _layout_words(inputs, best: str) -> list[str]:
    """Where the params are set for another layout than the recommended one: the keys that switch them."""
    configured = inputs.configured_layout
    if configured is None or best in configured:
        return []
    keys = LAYOUT_KEYS["C"] if best == "C" else {key: "stored" for key in LAYOUT_KEYS["C"] if key[0] == "train"}
    settings = ", ".join(
        f"{section}.{key}: " + (f"[{', '.join(value)}]" if isinstance(value, list) else str(value))
        for (section, key), value in keys.items()
    )
    if best != "C":
        settings += ", extract.splits: [train, heldout]"
    return [
        f"The params are set for layout {configured}; for {best} set {settings} (`eagle3 init NAME --layout {best}` "
        "rewrites a shipped configuration so)."
    ]


def _configuration_values(plan: Plan) -> dict[str, Any]:
    """The value the plan used for each input the configuration decides."""
    inputs, memory = plan.inputs, plan.train_memory
    return {
        "samples": f"{inputs.samples:,}",
        "max_tokens": f"{inputs.max_tokens:,} tokens",
        "layers": inputs.captured_layers,
        "storage": inputs.storage,
        "epochs": inputs.epochs,
        "ttt_steps": memory.ttt_steps,
        "draft_vocab": f"{inputs.draft_vocab:,}",
        "keep_checkpoints": inputs.keep_checkpoints,
        "stream_buffer_gb": f"{inputs.stream_buffer_gb:g} GB",
        "sharding": memory.sharding,
        "draft_layout": ", ".join(memory.draft_layout) or "none",
        "recompute": inputs.recompute,
        "gpus": inputs.there.gpus,
        "gpu": GPUS[inputs.there.gpu].name,
    }


def plan_json(plan: Plan) -> dict[str, Any]:
    """The plan's JSON: every figure, then the answer in words."""
    return to_json(plan) | {"answer": answer(plan)}


def _optimizer_step_source(inputs) -> str:
    if inputs.sources.get("optimizer_step"):
        return inputs.sources["optimizer_step"]
    if not inputs.optimizer_step_flops:
        return f"{inputs.optimizer}: its step is in the training rate"
    return (
        f"{inputs.optimizer}: {inputs.optimizer_step_flops:.3g} Newton-Schulz FLOPs on each GPU at "
        f"{NEWTON_SCHULZ_MFU:g} of {inputs.there.tflops:g} TFLOP/s (assumption)"
    )


def _disk_cell(disk: DiskNeed) -> str:
    text = size(disk.bytes)
    if disk.budget_tb is None:
        return text
    verdict = "fits" if disk.fits else "does not fit"
    most = disk.largest_samples
    return f"{text}: {verdict} {disk.budget_tb:g} TB" + (f" (max {most:,} samples)" if most is not None else "")


def render(plan: Plan) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # A pipe gets 80 columns by default, which folds the scenario table into unreadable cells.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
    for line in answer(plan):
        console.print(f"[bold]{escape(line)}[/bold]")
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    inputs, v, sizes = plan.inputs, plan.inputs.verifier, plan.sizes
    console.print(
        f"\n{v.name}: hidden {v.hidden_size}, {v.num_layers} layers, vocab {v.vocab_size}; "
        f"{inputs.samples:,} samples x {inputs.mean_tokens:,.0f} tokens = {sizes.tokens:,.0f} tokens"
    )
    table = Table(title="Sizes", title_justify="left")
    table.add_column("item")
    table.add_column("size", justify="right")
    table.add_column("how")
    hidden = sizes.hidden_states
    table.add_row(
        "bytes per token",
        f"{sizes.bytes_per_token:,} B",
        f"{inputs.captured_layers} layers x {v.hidden_size} x {inputs.bytes_per_element} B",
    )
    table.add_row("hidden states, raw", size(hidden.raw_bytes), "tokens x bytes per token")
    table.add_row(
        "hidden states, stored",
        size(hidden.stored_bytes),
        f"raw / {inputs.compression_ratio:g} ({inputs.sources['compression_ratio']})",
    )
    table.add_row("largest sample", size(hidden.largest_sample_bytes), f"{inputs.max_tokens:,} tokens")
    table.add_row(
        "verifier weights", size(sizes.verifier_weights_bytes), "fetched there in every layout; never copied by DVC"
    )
    table.add_row("prompts + answers (text)", size(sizes.text_bytes), f"~{TEXT_BYTES_PER_TOKEN} B per token")
    table.add_row(
        "draft checkpoints",
        size(sizes.checkpoints_bytes),
        f"{size(inputs.draft.checkpoint_bytes)} each ({sizes.draft_params:,} parameters in fp32 and "
        f"{inputs.optimizer}'s state) x {inputs.keep_checkpoints} kept",
    )
    console.print(table)

    table = Table(title="Configuration (each input from its source; a flag overrides the params)", title_justify="left")
    for column in ("input", "value", "source"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for flag, value in _configuration_values(plan).items():
        table.add_row(flag.replace("_", " "), str(value), inputs.configuration[flag])
    console.print(table)

    rates, sources = plan.rates, inputs.sources
    rows = [
        ("link (here -> there)", f"{rates.link_bytes_per_s * 8 / 1e9:.2f} Gbit/s", sources["link"]),
        ("here -> DVC remote", f"{rates.remote_up_bytes_per_s * 8 / 1e9:.2f} Gbit/s", sources["remote_up"]),
        ("DVC remote <-> there", f"{rates.remote_down_bytes_per_s * 8 / 1e9:.2f} Gbit/s", sources["remote_down"]),
        ("rented machine", f"${rates.machine_usd_per_hour:,.2f}/h", sources["there"]),
        ("here", "", sources["here"]),
        ("extraction there", f"{rates.extract_there_tokens_per_s:,.0f} tokens/s", sources["extract_there"]),
        ("extraction here", f"{rates.extract_here_tokens_per_s:,.0f} tokens/s", sources["extract_here"]),
        ("training there", f"{rates.train_tokens_per_s:,.0f} tokens/s", sources["train"]),
        ("an optimizer step", f"{rates.optimizer_step_s:.2f} s", _optimizer_step_source(inputs)),
        ("serving here (generate)", f"{rates.serve_here_tokens_per_s:,.0f} tokens/s", sources["serve"]),
        ("serving there (evaluate)", f"{rates.serve_there_tokens_per_s:,.0f} tokens/s", sources["serve_there"]),
        ("a start of the verifier", duration(rates.server_start_s), sources["server_start"]),
        ("hashing the weights", f"{rates.hash_bytes_per_s / 1e9:.2f} GB/s", sources["hash"]),
        ("DVC cache link", inputs.cache_link, sources["cache_link"]),
    ]
    table = Table(title="Rates and machines", title_justify="left")
    for column in ("", "value", "source"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for row in rows:
        table.add_row(*row)
    console.print(table)

    _render_train_memory(console, plan)

    _render_run(console, plan)

    table = Table(title="Scenarios (rented time includes training)", title_justify="left")
    for column in ("", "scenario", "rented steps", "rented", "cost", "disk there", "disk here"):
        table.add_column(column, justify="right" if column in ("rented", "cost") else "left")
    for key, s in plan.scenarios.items():
        steps = [f"{name.replace('_', ' ')} {duration(sec)}" for name, sec in s.rented_steps_s.items()]
        steps += [f"(before renting: {name.replace('_', ' ')} {duration(sec)})" for name, sec in s.here_steps_s.items()]
        table.add_row(
            ("* " if key == plan.recommendation else "") + key,
            s.name,
            ", ".join(steps),
            duration(s.rented_s),
            f"${s.cost_usd:,.0f}",
            _disk_cell(s.disk.there),
            _disk_cell(s.disk.here),
        )
    console.print(table)
    table = Table(title="Hidden-state storage (extract.storage)", title_justify="left")
    for column in ("storage", "x raw", "stored", "ship (A)", "disk there A / B", "A", "B", "best"):
        table.add_column(column, justify="left" if column in ("storage", "best") else "right")
    for option in plan.storage_options:
        a, b = option.scenarios.A, option.scenarios.B
        table.add_row(
            ("* " if option.storage == inputs.storage else "") + option.storage,
            f"{option.compression_ratio:.2f}",
            size(option.stored_bytes),
            duration(option.ship_hidden_states_s),
            f"{size(a.there_disk_bytes)} / {size(b.there_disk_bytes)}",
            f"{duration(a.rented_s)}, ${a.cost_usd:,.0f}",
            f"{duration(b.rented_s)}, ${b.cost_usd:,.0f}",
            option.recommendation or "none fits",
        )
    console.print(table)
    even = plan.break_even_a_vs_b
    if even.tokens is None:
        console.print(f"break-even A vs B: none; {even.meaning}")
    else:
        console.print(
            f"break-even A vs B: {even.tokens:,.0f} tokens = {even.samples:,.0f} samples of this length "
            f"({size(even.raw_bytes)} raw, {size(even.stored_bytes)} stored); {even.meaning}"
        )


def _render_run(console, plan: Plan) -> None:
    """The recommended layout (else B) step by step, as docs/hero-run.md takes the steps, with the work each
    counts and where its rate comes from; the rented total against the budget."""
    from rich.markup import escape
    from rich.table import Table

    key = plan.recommendation or "B"
    scenario = getattr(plan.scenarios, key)
    table = Table(
        title=f"The run in layout {key}, step by step (docs/hero-run.md): {duration(scenario.rented_s)} rented, "
        f"{dollars(scenario.cost_usd)}",
        title_justify="left",
    )
    for column in ("where", "step", "time", "work", "rate from"):
        table.add_column(column, justify="right" if column == "time" else "left")
    for step in scenario.steps:
        where = "here, before renting" if step.machine == "here" else "there"
        table.add_row(
            where, step.name.replace("_", " "), duration(step.seconds), escape(step.work), escape(step.source)
        )
    console.print(table)


def _render_train_memory(console, plan: Plan) -> None:
    from rich.table import Table

    memory, tokens = plan.train_memory, plan.inputs.process_tokens
    gpu = GPUS[memory.gpu]
    if memory.settings is None:
        console.print(f"training memory per GPU: {memory.source}")
        return
    table = Table(
        title=f"Training memory per {gpu.name} ({gpu.memory_gb:g} GB; {memory.source})",
        title_justify="left",
    )
    for column in ("train.activation_checkpointing", f"at {tokens:,} tokens", "fits", "longest sample"):
        table.add_column(column, justify="left" if column.startswith("train") else "right")
    for name, setting in memory.settings.items():
        fits = "yes" if setting.fits else "no"
        marked = ("* " if name == plan.inputs.recompute else "") + name
        table.add_row(marked, size(setting.at_max_tokens_bytes), fits, f"{setting.longest_tokens:,} tokens")
    console.print(table)


def main(args: argparse.Namespace, root: Path) -> None:
    plan = compute(inputs_from_args(args, root))
    if args.json:
        print(json.dumps(plan_json(plan), indent=2))
    else:
        render(plan)
