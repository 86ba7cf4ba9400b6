"""The communication thread of DistributedDataParallel.

Buckets become ready in whatever order autograd finishes them; every rank must reduce them in the
same order, so this thread reduces bucket 0, 1, 2, ... each as soon as it (and all before it) is
ready. Summing runs in numpy with the GIL released, so it overlaps the rest of the backward pass.
The thread is owned: :meth:`close` stops and joins it, and is safe to call twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from hfai.reduce.errors import GroupAbortedError, PeerTimeoutError

logger = logging.getLogger(__name__)


class BucketReducer:
    """Reduce ``len(reducers)`` buckets per step, in index order, on a background thread.

    ``reducers[b]()`` performs the collective of bucket ``b`` (its result is ignored); ``wait_before[b]`` (optional) is
    called first, e.g. to wait for a CUDA copy into the bucket.
    """

    def __init__(self, reducers: Sequence[Callable[[], object]], name: str = "hfai-reduce") -> None:
        self._reducers = list(reducers)
        self._cond = threading.Condition()
        self._ready = [False] * len(self._reducers)
        self._before: list[Callable[[], None] | None] = [None] * len(self._reducers)
        self._next = 0
        self._done = 0
        self._error: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def start_step(self) -> None:
        with self._cond:
            if self._error is not None:
                raise GroupAbortedError(f"gradient reduction failed earlier: {self._error}")
            self._ready = [False] * len(self._reducers)
            self._before = [None] * len(self._reducers)
            self._next = 0
            self._done = 0

    def submit(self, bucket: int, before: Callable[[], None] | None = None) -> None:
        with self._cond:
            self._ready[bucket] = True
            self._before[bucket] = before
            self._cond.notify_all()

    def wait_all(self, timeout_s: float) -> None:
        """Block until every bucket of this step is reduced; re-raise a reduction error."""
        with self._cond:
            finished = self._cond.wait_for(
                lambda: self._error is not None or self._done == len(self._reducers), timeout_s
            )
            if self._error is not None:
                raise self._error
            if not finished:
                raise PeerTimeoutError(f"gradient buckets not reduced within {timeout_s:g} s")

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: self._stopping
                    or (self._next < len(self._reducers) and self._ready[self._next])
                )
                if self._stopping:
                    return
                b = self._next
                before = self._before[b]
            try:
                if before is not None:
                    before()
                self._reducers[b]()
            except BaseException as e:  # handed to the autograd thread via wait_all
                with self._cond:
                    self._error = e
                    self._cond.notify_all()
                return
            with self._cond:
                self._next += 1
                self._done += 1
                self._cond.notify_all()
