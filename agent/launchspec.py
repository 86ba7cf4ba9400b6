"""The launch spec: everything a run's launcher needs, typed on both sides of the run directory.

The agent (runs.py) builds a :class:`LaunchSpec` and writes it as JSON to ``RUN_DIR/launch``; the
launcher (launcher.py), a separate process that may outlive the agent, reads it back with
:meth:`LaunchSpec.from_json`. A field renamed or mistyped on one side fails there, at once, with
the field's name, instead of reading back as a silent default.

The run directory is the agent's alone (0700): the spec is trusted input, but checked all the
same, since a launcher that misreads its spec would run the wrong thing as the wrong user.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from hfai.agent.cgroup import CgroupKind
from hfai.agent.sandbox import CONTAINER_BWRAP, CONTAINER_NONE

__all__ = ["CgroupPlace", "Fencing", "LaunchSpec", "Limits", "SwitchTo", "WatchSpec"]


@dataclass(frozen=True)
class CgroupPlace:
    """Where the run's cgroup goes: one folder per hierarchy (cgroup.py)."""

    kind: CgroupKind
    dirs: tuple[str, ...]


@dataclass(frozen=True)
class Limits:
    """The run's container and resource limits (0: none)."""

    container: str = CONTAINER_NONE
    memory_bytes: int = 0
    pids_max: int = 0
    cgroup: CgroupPlace | None = None

    @property
    def contained(self) -> bool:
        return self.container == CONTAINER_BWRAP


@dataclass(frozen=True)
class Fencing:
    """Self-fencing (launcher.py's module doc): ``alive`` is the agent's liveness stamp; past
    ``fence_s`` without a fresh one the job is stopped, past ``kill_s`` killed."""

    alive: str
    fence_s: float
    kill_s: float
    poll_s: float


@dataclass(frozen=True)
class WatchSpec:
    """The log watchdog (watchdog.py): silence past ``watchdog_s`` is a hang; ``control`` is the
    run's control directory, where the job may change the time."""

    watchdog_s: float
    control: str
    poll_s: float
    dump_s: float
    kill_s: float


@dataclass(frozen=True)
class SwitchTo:
    """The account the job runs as, when the launcher (root) must switch to it."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class LaunchSpec:
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    log: str  # the rank's log file, which the launcher appends the job's output to
    log_cap: int  # bytes the log may hold (logcap.py; 0: no cap)
    limits: Limits = field(default_factory=Limits)
    fence: Fencing | None = None
    watchdog: WatchSpec | None = None
    switch: SwitchTo | None = None

    def to_json(self) -> bytes:
        lim = self.limits
        raw: dict[str, Any] = {
            "argv": list(self.argv), "env": self.env, "cwd": self.cwd, "log": self.log, "log_cap": self.log_cap,
            "limits": {"container": lim.container, "memory_bytes": lim.memory_bytes, "pids_max": lim.pids_max,
                       "cgroup": None if lim.cgroup is None else {"kind": lim.cgroup.kind.value,
                                                                    "dirs": list(lim.cgroup.dirs)}},
            "fence": None if self.fence is None else vars(self.fence),
            "watchdog": None if self.watchdog is None else vars(self.watchdog),
            "switch": None if self.switch is None else {**vars(self.switch), "groups": list(self.switch.groups)},
        }
        return json.dumps(raw).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> LaunchSpec:
        """The spec ``data`` holds; ValueError naming the first field that is missing or wrong."""
        try:
            raw = json.loads(data)
        except ValueError as e:
            raise ValueError(f"launch spec: not JSON ({e})") from None
        r = _Reader(raw, "launch spec")
        lim = r.obj("limits")
        cg = lim.optional_obj("cgroup")
        limits = Limits(container=lim.choice("container", (CONTAINER_NONE, CONTAINER_BWRAP)),
                        memory_bytes=lim.count("memory_bytes"), pids_max=lim.count("pids_max"),
                        cgroup=None if cg is None else CgroupPlace(CgroupKind(cg.choice("kind", ("v1", "v2"))),
                                                                   cg.strings("dirs")))
        fence = r.optional_obj("fence")
        watch = r.optional_obj("watchdog")
        switch = r.optional_obj("switch")
        return cls(
            argv=r.strings("argv", nonempty=True), env=r.string_map("env"), cwd=r.string("cwd"), log=r.string("log"),
            log_cap=r.count("log_cap"), limits=limits,
            fence=None if fence is None else Fencing(
                alive=fence.string("alive"), fence_s=fence.seconds("fence_s"), kill_s=fence.seconds("kill_s"),
                poll_s=fence.seconds("poll_s")),
            watchdog=None if watch is None else WatchSpec(
                watchdog_s=watch.seconds("watchdog_s"), control=watch.string("control"),
                poll_s=watch.seconds("poll_s"), dump_s=watch.seconds("dump_s"), kill_s=watch.seconds("kill_s")),
            switch=None if switch is None else SwitchTo(
                uid=switch.count("uid"), gid=switch.count("gid"),
                groups=tuple(switch.counts("groups"))),
        )


class _Reader:
    """Typed reads of one JSON object, each failing with the field's path."""

    def __init__(self, raw: object, where: str):
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: not an object")
        self.raw = raw
        self.where = where

    def _get(self, key: str) -> object:
        if key not in self.raw:
            raise ValueError(f"{self.where}: no {key!r}")
        return self.raw[key]

    def _bad(self, key: str, what: str) -> ValueError:
        return ValueError(f"{self.where}: {key!r} is not {what}")

    def string(self, key: str) -> str:
        v = self._get(key)
        if not isinstance(v, str) or not v:
            raise self._bad(key, "a non-empty string")
        return v

    def choice(self, key: str, allowed: tuple[str, ...]) -> str:
        v = self._get(key)
        if v not in allowed:
            raise self._bad(key, f"one of {', '.join(allowed)}")
        return str(v)

    def strings(self, key: str, nonempty: bool = False) -> tuple[str, ...]:
        v = self._get(key)
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v) or (nonempty and not v):
            raise self._bad(key, "a list of strings" + (" (not empty)" if nonempty else ""))
        return tuple(v)

    def string_map(self, key: str) -> dict[str, str]:
        v = self._get(key)
        if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
            raise self._bad(key, "a map of strings")
        return dict(v)

    def count(self, key: str) -> int:
        v = self._get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise self._bad(key, "a whole number >= 0")
        return v

    def counts(self, key: str) -> list[int]:
        v = self._get(key)
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
            raise self._bad(key, "a list of whole numbers >= 0")
        return list(v)

    def seconds(self, key: str) -> float:
        v = self._get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise self._bad(key, "a finite number of seconds >= 0")
        return float(v)

    def obj(self, key: str) -> _Reader:
        return _Reader(self._get(key), f"{self.where}.{key}")

    def optional_obj(self, key: str) -> _Reader | None:
        return None if self.raw.get(key) is None else self.obj(key)
