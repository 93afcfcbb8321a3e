"""vLLM's hidden-state connector on its CUDA path, run on a CPU: the protocol as CUDA runs it (each file's lock
taken when the request is scheduled, the save handed over one engine step after the request finishes, the copy
and the write on a writer thread that releases the lock), with only the device copy made a CPU one.

vLLM-CPU never takes that path: the project's connector (eagle3/engines/hidden_states/vllm_capture.py) writes
synchronously where there is no CUDA, and vLLM's pinned host buffers and CUDA streams do not exist on a CPU. Here
the connector is told it runs on CUDA, and the module that holds vLLM's connector sees a `torch` whose CUDA stream,
event and pinned allocation are their synchronous CPU equivalents; everything else in it is vLLM's own code.

    force_cuda_connector_path()   # in the process that runs the engine core, before the engine starts
    force_cuda_connector_path(writers_stall=True)   # and every writer thread blocks before writing (a stuck disk)
"""

import threading
from contextlib import contextmanager
from typing import Any

import torch

# Counted by the writer threads: a test checks the asynchronous path really ran.
WRITES = {"submitted": 0, "written": 0}


class _CopyDone:
    """torch.cuda.Event for a copy that completed when it was issued (a CPU copy is synchronous)."""

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _CopyStream:
    def wait_event(self, event: _CopyDone) -> None:
        pass


@contextmanager
def _on_stream(stream: _CopyStream):
    yield


class _TorchWithCpuCopies:
    """The connector module's `torch`: torch itself, but for the CUDA stream and event and pinned allocation."""

    cuda = type("cuda", (), {"Stream": _CopyStream, "Event": _CopyDone, "stream": staticmethod(_on_stream)})

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def empty_like(tensor: torch.Tensor, *, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        return torch.empty_like(tensor, **kwargs)


def force_cuda_connector_path(writers_stall: bool = False) -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as connector

    from eagle3.engines.hidden_states.vllm_capture import Eagle3HiddenStatesConnector

    connector.torch = _TorchWithCpuCopies()
    initialise = Eagle3HiddenStatesConnector.__init__

    def on_cuda(self, *args: Any, **kwargs: Any) -> None:
        initialise(self, *args, **kwargs)
        self._synchronous = False

    Eagle3HiddenStatesConnector.__init__ = on_cuda
    submit, write = (
        connector.ExampleHiddenStatesConnector._submit_async_write,
        connector.ExampleHiddenStatesConnector._write_tensors,
    )

    def counted_submit(self, pending: Any) -> None:
        WRITES["submitted"] += 1
        submit(self, pending)

    def counted_write(*args: Any) -> None:
        if writers_stall:
            threading.Event().wait()
        write(*args)
        WRITES["written"] += 1

    connector.ExampleHiddenStatesConnector._submit_async_write = counted_submit
    connector.ExampleHiddenStatesConnector._write_tensors = staticmethod(counted_write)
