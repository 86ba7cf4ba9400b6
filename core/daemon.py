"""What the daemons share (``hfai-agent``, ``hfai-controller``, ``hfai-web``, ``hfai-storage``
through :func:`run_daemon`, the agent fleet through :func:`serve`): logging setup, signal-driven
two-phase shutdown, supervision of their long-lived tasks (:class:`Supervisor`), and
cancellation that cannot hang.

Python 3.11's ``asyncio.wait_for`` returns the inner result instead of raising when it is
cancelled just as that result becomes ready (bpo-42130, fixed in 3.12). nats-py uses it inside
``fetch``, ``request`` and ``next_msg``, so any task of ours can swallow a cancellation and keep
looping (the leader's event consumer doing so keeps the leader waiting for it for ever while the
lease is renewed). Hence: long-lived loops test
:func:`raise_if_cancelled` every iteration, bounded waits use :func:`bounded` (built on
``asyncio.wait``, which does not swallow), :func:`cancel_and_wait` gives up after a bound, and a
daemon whose tasks will not stop exits non-zero for systemd to restart it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

from hfai.core.clock import SYSTEM, Clock

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How long :func:`cancel_and_wait` waits for cancelled tasks, and :func:`serve` for ``close``.
CANCEL_TIMEOUT_S = 10.0
SHUTDOWN_TIMEOUT_S = 30.0
#: Exit statuses: the daemon stopped itself because it failed (systemd restarts it), or its tasks
#: would not stop and it left without cleaning up.
EXIT_FAILED = 1
EXIT_WEDGED = 70


class StuckTasksError(RuntimeError):
    """Owned tasks did not finish within the bound after being cancelled (they swallow it)."""


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # nats-py logs every reconnect attempt at ERROR; they are expected during failovers.
    logging.getLogger("nats").setLevel(logging.CRITICAL)


def raise_if_cancelled() -> None:
    """Raise CancelledError if someone cancelled the current task and an await swallowed it
    (``Task.cancelling()`` keeps counting requests that nothing acknowledged)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def repeat(step: Callable[[], Awaitable[object]], every_s: float, what: str) -> None:
    """``await step()`` every ``every_s`` until cancelled (a daemon's supervised periodic check):
    a step that raises is logged as ``what`` crashing, and the next one runs all the same."""
    while True:
        raise_if_cancelled()
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception:  # a check must never stop checking; the next one tells
            log.exception("%s crashed", what)
        await asyncio.sleep(every_s)


async def bounded(aw: Awaitable[T], timeout_s: float) -> T:
    """``await aw`` for at most ``timeout_s`` (then asyncio.TimeoutError). Unlike 3.11's
    ``wait_for``, a cancellation always propagates, even when ``aw`` has just finished; ``aw`` is
    then cancelled and left to finish on its own (its result, if any, is dropped)."""
    inner = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({inner}, timeout=timeout_s)
    except asyncio.CancelledError:
        abandon(inner)
        raise
    if not done:
        abandon(inner)
        raise TimeoutError
    return inner.result()


async def wait_event(event: asyncio.Event, timeout_s: float, clock: Clock = SYSTEM) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` passed on ``clock``; whether it was set. Both
    waits are this call's own tasks, finished before it returns or raises (a cancellation
    propagates, as in :func:`bounded`)."""
    if event.is_set():
        return True
    woken = asyncio.ensure_future(event.wait())
    timer = asyncio.ensure_future(clock.sleep(timeout_s))
    try:
        await asyncio.wait({woken, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (woken, timer):
            t.cancel()
        await asyncio.gather(woken, timer, return_exceptions=True)
    return event.is_set()


def abandon(task: asyncio.Future) -> None:
    """Cancel a task that its owner will not wait for (it may be stuck inside a library that holds
    on to the cancellation) and retrieve its outcome whenever it comes."""
    task.cancel()
    # Retrieve its outcome whenever it comes, so asyncio never reports it as unretrieved.
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


async def cancel_and_wait(tasks, timeout_s: float | None = CANCEL_TIMEOUT_S) -> None:
    """Cancel owned tasks and wait until each has really finished (errors were theirs to log).

    A task that swallows the cancellation is cancelled again every second; if some are still
    running after ``timeout_s`` (None: no bound), raise StuckTasksError naming them."""
    tasks = [t for t in tasks if t is not None]
    for t in tasks:
        t.cancel()
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    pending = {t for t in tasks if not t.done()}
    while pending:
        step = 1.0 if deadline is None else min(1.0, deadline - loop.time())
        if step <= 0:
            names = ", ".join(sorted(t.get_name() for t in pending))
            raise StuckTasksError(f"tasks still running {timeout_s:g}s after being cancelled: {names}")
        _, pending = await asyncio.wait(pending, timeout=step)
        for t in pending:
            t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)  # collect their outcomes


class FailureStreak:
    """Counts failures in a row of a loop that retries; :meth:`failed` says when the streak has
    reached ``limit`` (0: never): an error that retrying does not cure (a full or read-only disk)
    should stop the daemon for systemd to restart, not be logged for ever."""

    def __init__(self, limit: int):
        self.limit = limit
        self.count = 0

    def succeeded(self) -> None:
        self.count = 0

    def failed(self) -> bool:
        self.count += 1
        return 0 < self.limit <= self.count


class Supervisor:
    """A daemon's long-lived tasks, watched: each is meant to run until the daemon stops it, so one
    that ends first (an error, a return, a cancellation nobody asked for) has stopped doing its
    part while the process goes on looking healthy (an agent whose assignment watch
    died would keep heartbeating and never run new work). It then fails the daemon: :meth:`failed`
    returns the reason, :func:`serve` closes the daemon and the process exits EXIT_FAILED, for
    systemd to restart it. The first reason wins."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task] = []  # owned: cancelled by stop()
        self.reason = ""
        self._failed = asyncio.Event()
        self._stopping = False

    def spawn(self, coro: Coroutine[object, object, object], name: str) -> asyncio.Task:
        """Start an owned task, watched."""
        task = asyncio.create_task(coro, name=name)
        self.tasks.append(task)
        return self.watch(task)

    def watch(self, task: asyncio.Task) -> asyncio.Task:
        """Watch a task owned elsewhere (stopped by its owner, after :meth:`stop`)."""
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task) -> None:
        if self._stopping:
            return
        if task.cancelled():
            self.fail(f"task {task.get_name()} was cancelled")
            return
        error = task.exception()
        if error is None:
            self.fail(f"task {task.get_name()} ended")
        else:
            log.error("task %s failed", task.get_name(), exc_info=error)
            self.fail(f"task {task.get_name()} failed: {type(error).__name__}: {error}")

    def fail(self, reason: str) -> None:
        """The daemon must stop (for ``reason``)."""
        if not self._failed.is_set():
            self.reason = reason
            self._failed.set()

    @property
    def has_failed(self) -> bool:
        return self._failed.is_set()

    async def failed(self) -> str:
        """Returns, with the reason, once the daemon must stop (the ``failed`` of :func:`serve`)."""
        await self._failed.wait()
        return self.reason

    async def stop(self, timeout_s: float | None = CANCEL_TIMEOUT_S) -> None:
        """Stop watching, then cancel the owned tasks and wait for them (see :func:`cancel_and_wait`)."""
        self._stopping = True
        await cancel_and_wait(self.tasks, timeout_s)


async def serve(start: Callable[[], Awaitable[None]], close: Callable[[], Awaitable[None]],
                failed: Callable[[], Awaitable[str]] | None = None, shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S,
                hard_exit: Callable[[int], object] = os._exit) -> int:
    """Start, then wait for SIGTERM/SIGINT (systemd stops us with SIGTERM) or until ``failed()``
    returns (the daemon's own verdict that it must go, with the reason), then close. Returns 0
    after a signal, EXIT_FAILED after a failure. If ``close`` does not finish within
    ``shutdown_timeout_s`` or leaves tasks that will not stop, calls ``hard_exit(EXIT_WEDGED)``
    at once: ``asyncio.run`` would wait for those tasks forever."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    code = 0
    await start()
    watched: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait())]
    if failed is not None:
        watched.append(asyncio.ensure_future(failed()))
    try:
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        if len(watched) > 1 and watched[1].done() and not stop.is_set():
            log.critical("stopping: %s", watched[1].exception() or watched[1].result())
            code = EXIT_FAILED
    finally:
        for w in watched:
            w.cancel()
        await asyncio.gather(*watched, return_exceptions=True)
        wedged = await _close_within(close, shutdown_timeout_s, hard_exit)
    return EXIT_WEDGED if wedged else code


async def _close_within(close: Callable[[], Awaitable[None]], timeout_s: float,
                        hard_exit: Callable[[int], object]) -> bool:
    """Run ``close``; if it takes over ``timeout_s`` or leaves stuck tasks, ``hard_exit`` (and
    return True, for a test's stand-in of it). Other errors of ``close`` propagate."""
    closing = asyncio.ensure_future(close())
    done, _ = await asyncio.wait({closing}, timeout=timeout_s)
    error = closing.exception() if done else None
    if done and not isinstance(error, StuckTasksError):
        if error is not None:
            raise error
        return False
    # ``closing`` is left running: the process ends now.
    log.critical("could not shut down cleanly (%s); exiting now", error or f"close took over {timeout_s:g}s")
    for h in logging.getLogger().handlers:
        h.flush()
    hard_exit(EXIT_WEDGED)
    return True


class Daemon(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...


#: The daemons' two flags, documented alike by each ``hfai-*`` daemon and by ``hfai agent`` /
#: ``hfai controller``.
CONFIG_HELP = ("TOML config file (default: $HFAI_CONFIG, else /etc/hfai/hfai.toml; systemd/hfai.toml.example "
               "documents every field); any field can be overridden with HFAI_<SECTION>_<FIELD>, e.g. "
               "HFAI_NATS_URL.")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_LEVEL_HELP = ("Least severe messages logged to stderr: " + ", ".join(LOG_LEVELS) +
                  " (any case; default INFO: state changes, elections, nodes lost).")


def run_daemon(prog: str, description: str, make: Callable[[object], Daemon], argv: list[str] | None = None) -> int:
    """The shared ``main`` of the ``hfai-*`` daemons: parse flags, load the config,
    build the daemon with ``make(config)``, serve until SIGTERM. Config errors and a missing
    platform extra (hfai._extras) exit 2 with one line, no traceback.

    A daemon may have ``async failed() -> str`` (returns, with the reason, when the daemon must
    stop: the process then exits EXIT_FAILED) and ``shutdown_timeout_s``."""
    from hfai._extras import require_platform
    from hfai.core.config import load_config
    from hfai.protocol.errors import HfaiError

    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--config", metavar="PATH", help=CONFIG_HELP)
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS, metavar="LEVEL",
                   help=LOG_LEVEL_HELP)
    args = p.parse_args(argv)
    setup_logging(args.log_level)
    try:
        require_platform()
        daemon = make(load_config(args.config))
        return asyncio.run(_serve_daemon(daemon))
    except HfaiError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2


async def _serve_daemon(daemon: Daemon) -> int:
    return await serve(daemon.start, daemon.close, getattr(daemon, "failed", None),
                       getattr(daemon, "shutdown_timeout_s", SHUTDOWN_TIMEOUT_S))
