"""How `make gpu-check` runs a step (eagle3/preflight/gpu_check.py): a step over its time box is stopped with every
Python process of it printing its stacks, and the summary shows where the step's own process hung."""

import sys

from eagle3.preflight.gpu_check import Step, run_step, steps, total_limit_s

HANGS = """
import threading, time

def wait_for_the_lock_forever():
    threading.Event().wait()

wait_for_the_lock_forever()
"""


def test_a_step_over_its_box_is_stopped_and_shows_where_it_hung(tmp_path):
    step = Step("hang", "nothing", [[sys.executable, "-c", HANGS]], limit_s=3, needs_cuda=False, cwd=tmp_path)
    outcome = run_step(step, cuda=False, out=tmp_path)
    assert outcome["result"] == "failed (over its 3 s)"
    assert outcome["seconds"] < 3 + 10 + 5  # the box, the stacks' grace, and a margin
    # Innermost first: the wait inside the hanging function, then its caller.
    frames = outcome["stack"]
    assert "in wait" in frames[0] and any("in wait_for_the_lock_forever" in frame for frame in frames), frames
    assert frames[-1].startswith('File "<string>", line 7'), frames


def test_a_step_that_exits_has_no_stack(tmp_path):
    step = Step("fails", "nothing", [[sys.executable, "-c", "raise SystemExit(3)"]], 30, needs_cuda=False, cwd=tmp_path)
    outcome = run_step(step, cuda=False, out=tmp_path)
    assert outcome["result"] == "failed (exit 3: -c raise SystemExit(3))" and "stack" not in outcome


def test_the_boxes_add_up_to_the_command_s_limit():
    assert total_limit_s() == sum(step.limit_s for step in steps())
    assert [step.name for step in steps()] == [
        "kernels",
        "training at scale",
        "extraction",
        "proposals",
        "evaluate engine",
        "preflight",
    ]
