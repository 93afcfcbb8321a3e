"""How the vllm capture backend tells where a request's states file stands, without ever waiting on its lock
(eagle3/engines/hidden_states/vllm_capture.py, file_state): real files and real flocks, held the way vLLM's
connector holds them (an exclusive lock on `<file>.lock`, taken through another open file description)."""

import fcntl
import os

from eagle3.engines.hidden_states.vllm_capture import file_state


def test_file_state_follows_the_connector_s_lock(tmp_path):
    path = tmp_path / "0-req.safetensors"
    lock = tmp_path / "0-req.safetensors.lock"
    assert file_state(path) == "pending"  # the synchronous CPU path: nothing until its step writes the file
    path.write_bytes(b"x")
    assert file_state(path) == "written"
    path.unlink()
    # vLLM's wait_for_save: the lock created and held from the step that schedules the request.
    writer = os.open(lock, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    fcntl.flock(writer, fcntl.LOCK_EX)
    assert file_state(path) == "locked"
    path.write_bytes(b"partial")  # a writer thread still writing
    assert file_state(path) == "locked"
    os.close(writer)  # the writer thread's release once the file is written
    assert file_state(path) == "written"
    # Probing took and dropped a shared lock: the writer's next exclusive lock is not blocked by it.
    again = os.open(lock, os.O_WRONLY)
    fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(again)
    path.unlink()
    assert file_state(path) == "unwritten"  # released without a file: the writer failed
