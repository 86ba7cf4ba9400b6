"""Node quotas as the scheduler applies them, and as `hfai quota` shows them (pure): one rule for the
policy, the API's checks and the CLI's listings, from the operators' table (``QuotaTable``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hfai.protocol.types import Priority, QuotaTable

#: Wildcard for the user or group part of a quota key.
ANY = "*"


@dataclass(frozen=True)
class Quotas:
    """Node quotas per (user, priority, group): the most nodes a user's jobs of that priority may
    hold in that group at once. ``limits`` maps ``(user, priority, group)`` to a node count; the
    user or the group may be :data:`ANY`. The most specific key wins: (user, p, group), (user, p,
    ANY), (ANY, p, group), (ANY, p, ANY). No matching key means no limit, except at levels above
    ``closed_above``: there it means 0 nodes (the level is closed until an operator gives a quota,
    ``*`` opening it for everyone), unless the job is ``exempt`` (an operator's). A live cluster
    closes the levels above NORMAL (:func:`quotas_of`); None closes none.
    """

    limits: Mapping[tuple[str, int, str], int] = field(default_factory=dict)
    closed_above: int | None = None

    def limit(self, user: str, priority: int, group: str, exempt: bool = False) -> int | None:
        found = self.explicit(user, priority, group) if self.limits else None
        if found is None and not exempt and self.closed(priority):
            return 0
        return found

    def explicit(self, user: str, priority: int, group: str) -> int | None:
        """The quota a key sets for the user (None: no key matches)."""
        get = self.limits.get
        for key in ((user, priority, group), (user, priority, ANY), (ANY, priority, group), (ANY, priority, ANY)):
            found = get(key)
            if found is not None:
                return found
        return None

    def closed(self, priority: int) -> bool:
        """Whether ``priority`` is a level that needs a quota (no key: 0 nodes)."""
        return self.closed_above is not None and priority > self.closed_above

    def closed_by_default(self, user: str, priority: int, group: str, exempt: bool = False) -> bool:
        """Whether the user gets no nodes at ``priority`` only because no quota opens the level."""
        return not exempt and self.closed(priority) and self.explicit(user, priority, group) is None


#: On a live cluster the levels above this need a quota ([controller] quota_needed_above,
#: docs/scheduling.md "Quotas"): without one, any user could submit at EXTREME_HIGH and preempt
#: everyone. Operators' jobs are exempt.
CLOSED_ABOVE = Priority.NORMAL.value


def quotas_of(table: QuotaTable | None, closed_above: int = CLOSED_ABOVE) -> Quotas:
    """The live cluster's quotas: the operators' table; the levels above ``closed_above`` need a
    quota (none closed from EXTREME_HIGH on)."""
    entries = table.entries if table is not None else ()
    closed = closed_above if closed_above < Priority.EXTREME_HIGH.value else None
    return Quotas(limits={(e.user, e.priority, e.group): e.nodes for e in entries}, closed_above=closed)
