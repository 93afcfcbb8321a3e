"""Checks before the costly run: `eagle3 preflight` (run.py: the items, their verdicts and the report; items.py their
shared vocabulary and budgets; machine.py the machine, precision, collectives, disk and decoding; models.py the
verifier, training, extraction and serving), and `make gpu-check` (gpu_check.py: what only a GPU shows, in
time-boxed steps).

In: params.yaml and the verifier stage's output. Out: a verdict per item on the console, `reports/preflight*.json`
(read by `eagle3 plan --preflight`), and gpu-check's summary in `.eagle3/gpu-check/`.
"""
