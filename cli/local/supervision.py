"""What the local cluster's supervisor decides, as pure functions of what it saw and a clock.

One restart policy covers every daemon and every reason to restart one (:func:`restart_step`): a daemon
found dead, and the NATS server whose store refuses writes while its disk has room again (see
hfai.controller.store_health: nats-server keeps a stream broken after a write error until it
restarts). A restart goes after a delay that doubles from ``first_delay_s`` up to
``max_delay_s`` (systemd's ``RestartSec`` with a backoff); a daemon that stayed up ``steady_s``
starts from the first delay again. A daemon restarted ``burst`` times within ``window_s``, for
whatever reasons, is given up on (systemd's ``StartLimitBurst``/``StartLimitIntervalSec``): it
stays as it is, and `hfai local status` says so, rather than restart forever. Each restart keeps
its true reason (:attr:`Track.last_exit`): how the daemon ended, or the store's fault.

Times are wall-clock seconds (they are shown to the user and written to cluster.json).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class SupervisePolicy:
    """How `hfai local up`'s supervisor keeps its daemons running (every period a setting)."""

    tick_s: float = 0.5
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    burst: int = 5
    window_s: float = 300.0
    steady_s: float = 60.0
    # The store's health probe (as the controller's: [controller] store_probe_*).
    store_probe_s: float = 2.0
    store_probe_timeout_s: float = 3.0
    store_probe_failures: int = 3
    # The NATS server is restarted for a store that refuses writes only once its disk has this
    # much room: a server restarted on a full disk breaks again at its first write.
    store_free_bytes: int = 16 * 1024 * 1024

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SupervisePolicy:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


class Step(enum.Enum):
    """What to do about one daemon now."""

    NOTHING = "nothing"  # alive and well, or waiting out its restart delay, or given up on
    RESTART = "restart"
    GIVE_UP = "give_up"


def delay(streak: int, policy: SupervisePolicy) -> float:
    """The wait before a restart, after ``streak`` restarts since the daemon last stayed up."""
    return min(policy.max_delay_s, policy.first_delay_s * 2 ** streak)


def restart_step(restarts: Sequence[float], streak: int, due_since: float, now: float, policy: SupervisePolicy) -> Step:
    """The one restart policy. ``restarts``: when the daemon was restarted before, for any reason;
    ``streak``: how many of those since it last stayed up ``steady_s``; ``due_since``: when a
    restart became due (the daemon found dead, or its fault judged). RESTART once the delay has
    passed and fewer than ``burst`` restarts fall within ``window_s``; GIVE_UP when that many do;
    else NOTHING (wait)."""
    if now - due_since < delay(streak, policy):
        return Step.NOTHING
    if sum(1 for t in restarts if now - t < policy.window_s) >= policy.burst:
        return Step.GIVE_UP
    return Step.RESTART


@dataclass
class Track:
    """One daemon as the supervisor follows it. ``restarts``: when it was restarted (the last
    ``window_s``); ``total``: restarts since `up`; ``down_since``: when a restart became due (it
    was found dead, or faulty; None while neither); ``started``: when the process now running
    started; ``last_exit``: the reason of the restart due or last made."""

    started: float
    restarts: list[float] = field(default_factory=list)
    total: int = 0
    down_since: float | None = None
    streak: int = 0  # restarts since it last stayed up steady_s: the exponent of the delay
    gave_up: bool = False
    last_exit: str = ""

    def delay(self, policy: SupervisePolicy) -> float:
        return delay(self.streak, policy)

    def see(self, alive: bool, now: float, policy: SupervisePolicy, exit_text: str = "") -> Step:
        """Take what was seen of the daemon at ``now`` (``exit_text``: how it ended, when dead)
        and return what to do about it."""
        if self.gave_up:
            return Step.NOTHING
        if alive:
            if self.streak and now - self.started >= policy.steady_s:
                self.streak = 0
            return Step.NOTHING
        return self._due(now, policy, exit_text)

    def fault(self, now: float, policy: SupervisePolicy, why: str) -> Step:
        """The daemon is alive but must be restarted for ``why`` (the NATS store's fault): the same
        policy as a death's."""
        if self.gave_up:
            return Step.NOTHING
        return self._due(now, policy, why)

    def well(self) -> None:
        """A fault seen before is gone (the daemon alive): no restart is due for it."""
        self.down_since = None

    def _due(self, now: float, policy: SupervisePolicy, why: str) -> Step:
        if self.down_since is None:
            self.down_since = now
            self.last_exit = why
        self.restarts = [t for t in self.restarts if now - t < policy.window_s]
        step = restart_step(self.restarts, self.streak, self.down_since, now, policy)
        if step is Step.GIVE_UP:
            self.gave_up = True
        return step

    def restarted(self, now: float) -> None:
        """The daemon was started again at ``now``."""
        self.restarts.append(now)
        self.total += 1
        self.streak += 1
        self.started = now
        self.down_since = None

    def summary(self) -> dict[str, Any]:
        """What cluster.json keeps of it (for `hfai local status`)."""
        return {"restarts": self.total, "last_restart": self.restarts[-1] if self.restarts else 0.0,
                "gave_up": self.gave_up, "last_exit": self.last_exit}


def store_restart_due(writable: bool, free_bytes: int | None, policy: SupervisePolicy, last_restart: float,
                      now: float) -> bool:
    """Whether to restart the NATS server for its store: it refuses writes, its disk has room
    (``free_bytes`` None: unknown, taken as room), and the last such restart is long enough ago
    for the probes to have judged the new server (``store_probe_failures`` probes and a delay)."""
    if writable:
        return False
    if free_bytes is not None and free_bytes < policy.store_free_bytes:
        return False
    judged = policy.store_probe_failures * (policy.store_probe_s + policy.store_probe_timeout_s) + policy.first_delay_s
    return now - last_restart >= judged
