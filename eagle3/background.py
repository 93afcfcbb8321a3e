"""Work beside the caller's own on one background thread: `one_ahead` computes an iterator's next item while the
caller handles this one; `Background` does the items the caller hands over while the caller goes on. Both keep
the thread a fixed number of items away at most, so memory stays bounded, and raise the thread's error in the
caller. (zstd, file writes, tokenizers and an engine's forward pass release the GIL, so the two overlap.)
"""

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def one_ahead(items: Iterator[T]) -> Iterator[T]:
    """`items`, computed by a background thread one item ahead of the consumer (tokenization overlaps the
    consumer's work; at most two items exist at a time). An exception in the thread is raised in the consumer."""
    ahead: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    finished = object()

    def offer(item: object) -> bool:
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not offer(item):
                    return
            offer(finished)
        except BaseException as exc:  # handed to the consumer, which raises it where the stage can report it
            offer(exc)

    worker = threading.Thread(target=produce, name="sequence-planner", daemon=True)
    worker.start()
    try:
        while (item := ahead.get()) is not finished:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        worker.join()


class Background:
    """`work(*item)` for each item handed over with `put`, in order, on one thread; `depth` items queued at most.
    After the thread's first error the rest are skipped and the error is raised at the next `put` or `finish`."""

    def __init__(self, work: Callable[..., None], depth: int):
        # Each item's arguments, then None: the end.
        self._work = work
        self._queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._abandoned = False
        self._thread = threading.Thread(target=self._run, name="eagle3-background", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is None and not self._abandoned:
                try:
                    self._work(*item)
                except BaseException as exc:  # handed to the caller, which decides
                    self._error = exc

    def put(self, *item: Any) -> None:
        """Hand over one item; waits while `depth` items are queued. Raises the worker's error, if any."""
        self._raise()
        self._queue.put(item)

    def finish(self) -> None:
        """Wait until every item is done; raises the worker's error, if any."""
        self._queue.put(None)
        self._thread.join()
        self._raise()

    def abandon(self) -> None:
        """The caller failed: skip what is still queued, and wait for the item in hand to end."""
        self._abandoned = True
        self._queue.put(None)
        self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error
