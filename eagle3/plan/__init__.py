"""`eagle3 plan`: disk, time and cost of the hero run before any money is spent.

In: flags (flags.py), the params file and, without one, the shipped configuration (configured.py), the project's
measurements (measured.py: the extract stage's metrics; work.py: the counted work; preflight_reports.py: preflight's
reports), the verifier's shape (verifier.py), the links and this machine's hashing speed (links.py). inputs.py
gathers them, each with its source, into one `Inputs` (facts.py: the fixed facts, presets and the input types, and
the one JSON conversion).
Model: model.py, pure, the plan's specification in its docstring: sizes, rates, disk, every runbook step per layout,
the recommendation; memory.py the training memory and the draft's figures (the draft the trainer builds, on the
meta device); gpu_fit.py the verifier's share of a GPU beside the trainer (layout C) and `eagle3 check`'s
GPU-memory checks.
Out: render.py, the answer in words first, then the tables, or the JSON.
"""
