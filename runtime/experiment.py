"""Submit and follow jobs from Python, like the original client's ``hfai.client.create_experiment``.

::

    from hfai.client import create_experiment, get_experiment, list_experiments

    exp = create_experiment("train.py", ["--lr", "0.1"], nodes=2, name="mnist", priority="HIGH")
    exp.wait()                       # -> ChainState.SUCCEEDED (or FAILED, STOPPED)
    print(exp.logs(tail=20))         # the last 20 lines of rank 0's output
    get_experiment("old-run").stop()

It talks to the cluster exactly as the ``hfai`` command does: the same configuration
(``HFAI_CONFIG``, ``/etc/hfai/hfai.toml`` or a running ``hfai local`` cluster) and the same
credentials file (``$HFAI_HOME/creds/<HFAI_USER or login>.creds``); :class:`Client` takes others.
Each call opens one connection and closes it, so the functions are plain (not ``async``) and may
be called from a notebook whose event loop is running. Every failure raises a typed error from
:mod:`hfai.protocol.errors` (``NotFound``, ``Forbidden``, ``InvalidRequest``, ``Unavailable``,
``Timeout``, ...); nothing is printed.

nats is imported only when a call is made, so ``import hfai.client`` stays light for jobs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from hfai.protocol.errors import InvalidRequest, Timeout
from hfai.protocol.reasons import describe
from hfai.protocol.types import ChainState, JobRecord, JobSpec, Priority

if TYPE_CHECKING:
    from hfai.api.client import ApiClient
    from hfai.core.config import Config

T = TypeVar("T")

__all__ = ["Client", "Experiment", "create_experiment", "get_experiment", "list_experiments", "submit"]


def _run(coro: Callable[[], Awaitable[T]]) -> T:
    """Run ``coro()`` to the end from plain code, also when this thread already runs a loop
    (a notebook): then in a thread of its own, since a loop cannot wait for itself."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro())  # type: ignore[arg-type]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(coro())).result()  # type: ignore[arg-type]


def parse_nodes(nodes: int | str) -> tuple[int, int, int]:
    """(nodes, min_nodes, max_nodes) from N or "MIN:MAX" (an elastic job); InvalidRequest else."""
    lo, sep, hi = str(nodes).partition(":")
    try:
        low, high = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise InvalidRequest(f"nodes must be N or 'MIN:MAX', not {str(nodes)[:40]!r}") from None
    if low < 1 or high < low:
        raise InvalidRequest(f"nodes must be at least 1 (MIN <= MAX), not {str(nodes)[:40]!r}")
    return (high, low, high) if sep and high > low else (high, 0, 0)


def _default_workdir() -> str:
    """Where the job runs: the cluster's copy of a pushed workspace, else this directory (as the CLI)."""
    from pathlib import Path

    from hfai.api.workspace import remote_workdir

    cwd = os.getcwd()
    return remote_workdir(Path(cwd)) or cwd


class Client:
    """A user's handle on the cluster. ``config``: a :class:`hfai.core.config.Config` (default: the
    CLI's); ``user``: whose credentials file to present (default ``HFAI_USER`` or the login name;
    who you then are is what that file proves)."""

    def __init__(self, config: Config | None = None, user: str | None = None):
        self._config = config
        self._user = user

    def _api(self) -> ApiClient:
        from hfai.api.client import ApiClient
        from hfai.api.config import cli_config

        return ApiClient(self._config or cli_config(), user=self._user)

    def call(self, fn: Callable[[ApiClient], Awaitable[T]]) -> T:
        """Run ``fn(api)`` over a fresh connection (the building block of everything below)."""

        async def go() -> T:
            async with self._api() as api:
                return await fn(api)

        return _run(go)

    def submit(self, command: Sequence[str] | str, *, name: str | None = None, nodes: int | str = 1,
               priority: int | str = "NORMAL", group: str = "default", env: dict[str, str] | None = None,
               env_name: str = "", workdir: str | os.PathLike | None = None, force: bool = False,
               **fields: Any) -> Experiment:
        """Submit ``command`` (an argv list, or one string run by ``bash -c``) as a job and return
        it. ``nodes``: N or "MIN:MAX"; ``priority``: a level's name or number, or "AUTO";
        ``workdir``: where it runs (default: here, as ``hfai submit``); ``force``: even if a job
        of that name is active. Other JobSpec fields (``after``, ``time_limit_s``, ``retries``)
        pass through as keywords."""
        argv = ("bash", "-c", command) if isinstance(command, str) else tuple(str(a) for a in command)
        if not argv:
            raise InvalidRequest("the command is empty")
        count, low, high = parse_nodes(nodes)
        fields = {k: tuple(v) if isinstance(v, list | set) else v for k, v in fields.items()}  # wire tuples
        try:
            spec = JobSpec(name=name or _job_name(argv), entrypoint=argv,
                           workdir=str(workdir) if workdir is not None else _default_workdir(), nodes=count,
                           priority=Priority.parse(priority), group=group, env_name=env_name, env=dict(env or {}),
                           min_nodes=low, max_nodes=high, **fields)
        except TypeError as e:
            raise InvalidRequest(f"not a job option: {e}") from None
        record = self.call(lambda api: api.submit(spec, force=force))
        return Experiment(record, self)

    def create_experiment(self, script: str | os.PathLike, args: Iterable[str] = (), **options: Any) -> Experiment:
        """Run ``python SCRIPT ARGS`` as a job (``hfai python SCRIPT ARGS -- ...``), named after
        the script unless ``name`` is given; ``options`` as for :meth:`submit`. The script must
        exist (relative to ``workdir`` when given)."""
        base = os.fspath(options.get("workdir") or os.getcwd())
        if not os.path.isfile(os.path.join(base, os.fspath(script))):
            raise InvalidRequest(f"file {os.fspath(script)!r} does not exist (relative to {base})")
        options.setdefault("name", os.path.splitext(os.path.basename(os.fspath(script)))[0])
        return self.submit(["python", os.fspath(script), *map(str, args)], **options)

    def get_experiment(self, name_or_id: str) -> Experiment:
        """A job by id, or by name (your active one, else your newest; NotFound if none)."""
        return Experiment(self.call(lambda api: api.status(name_or_id)), self)

    def list_experiments(self, *, states: Iterable[str] = (), names: Iterable[str] = (), all_users: bool = False,
                         users: Iterable[str] = (), finished: bool = False) -> list[Experiment]:
        """Your jobs (``all_users``: everyone's; ``users``: these users'), oldest first: the active
        ones, or also ended ones with ``finished``; ``states`` (ChainState values or "active")
        and ``names`` (glob patterns) narrow them as ``hfai ps --state/--name`` do."""
        from hfai.api.client import JobFilter

        async def go(api: ApiClient) -> tuple[JobRecord, ...]:
            who = tuple(users) or (() if all_users else (api.user,))
            return await api.jobs(JobFilter.of(users=who, states=states, names=names, finished=finished))

        return [Experiment(r, self) for r in self.call(go)]


def _job_name(argv: tuple[str, ...]) -> str:
    """The name ``hfai submit`` would give this command (its script, or its program)."""
    from hfai.api.spec import entry_script

    return entry_script(argv)[1]


class Experiment:
    """A submitted job. Attributes read the record as last fetched (by :meth:`refresh`,
    :meth:`status`, :meth:`wait` or :meth:`stop`); the methods ask the cluster."""

    def __init__(self, record: JobRecord, client: Client | None = None):
        self.record = record
        self._client = client or Client()

    def __repr__(self) -> str:
        return f"<Experiment {self.record.id} {self.record.spec.name!r} {self.record.state.value}>"

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def name(self) -> str:
        return self.record.spec.name

    @property
    def state(self) -> ChainState:
        return self.record.state

    @property
    def reason(self) -> str:
        return describe(self.record)

    @property
    def suspend_count(self) -> int:
        return self.record.suspend_count

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes it holds now (or held last)."""
        return self.record.nodes or self.record.last_nodes

    def refresh(self) -> JobRecord:
        """Fetch the job's record anew."""
        self.record = self._client.call(lambda api: api.status(self.record.id))
        return self.record

    def status(self) -> ChainState:
        """The job's state now (``.reason`` says why)."""
        return self.refresh().state

    def wait(self, timeout: float | None = None, poll_s: float = 1.0) -> ChainState:
        """Wait until the job ended and return its final state (SUCCEEDED, FAILED or STOPPED; a
        job that is interrupted and requeued keeps going). Raises :class:`Timeout` after
        ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout

        async def go(api: ApiClient) -> JobRecord:
            while True:
                record = await api.status(self.record.id)
                if record.state.final:
                    return record
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self.record = record
                    raise Timeout(f"job {record.id} is still {record.state.value} after {timeout:g}s")
                await asyncio.sleep(poll_s if left is None else min(poll_s, left))

        self.record = self._client.call(go)
        return self.record.state

    def stop(self) -> ChainState:
        """Stop the job (a waiting one at once, a running one through its nodes); returns the
        state that leaves it in (``stopping`` until its processes are gone). Wait with :meth:`wait`."""
        self.record = self._client.call(lambda api: api.stop(self.record.id))
        return self.record.state

    def logs(self, rank: int = 0, tail: int | None = None) -> str:
        """One rank's output so far (all its runs), or its last ``tail`` lines; "" if it has not
        run. Bytes that are not UTF-8 are replaced."""

        async def go(api: ApiClient) -> bytes:
            record = await api.status(self.record.id)
            if not (record.nodes or record.last_nodes):
                return b""
            offset = 0 if tail is None else await api.tail_offset(record.id, rank, tail)
            return b"".join([data async for data in api.read_log(record.id, rank, offset)])

        return self._client.call(go).decode("utf-8", errors="replace")


_default: Client | None = None


def _client() -> Client:
    global _default
    if _default is None:
        _default = Client()
    return _default


def submit(command: Sequence[str] | str, **options: Any) -> Experiment:
    """:meth:`Client.submit` as the CLI's user."""
    return _client().submit(command, **options)


def create_experiment(script: str | os.PathLike, args: Iterable[str] = (), **options: Any) -> Experiment:
    """:meth:`Client.create_experiment` as the CLI's user."""
    return _client().create_experiment(script, args, **options)


def get_experiment(name_or_id: str) -> Experiment:
    """:meth:`Client.get_experiment` as the CLI's user."""
    return _client().get_experiment(name_or_id)


def list_experiments(**filters: Any) -> list[Experiment]:
    """:meth:`Client.list_experiments` as the CLI's user."""
    return _client().list_experiments(**filters)
