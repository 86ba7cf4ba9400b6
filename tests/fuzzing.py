"""The wire-tree mutator the fuzz tests share: one random node of a decoded message replaced by
something hostile, or a key dropped."""

from __future__ import annotations

import random


def mutate(rng: random.Random, obj, hostile: list, descend: float = 0.8, replace: float = 0.5):
    """``obj`` with one random node replaced by a choice from ``hostile`` or a dict key dropped:
    at each container it goes deeper with chance ``descend``; at a dict's key it drops it with
    chance 0.1, replaces it while the roll is under ``replace``, else goes into it."""
    if isinstance(obj, dict) and obj and rng.random() < descend:
        key = rng.choice(list(obj))
        out = dict(obj)
        roll = rng.random()
        if roll < 0.1:
            del out[key]
        elif roll < replace:
            out[key] = rng.choice(hostile)
        else:
            out[key] = mutate(rng, obj[key], hostile, descend, replace)
        return out
    if isinstance(obj, list) and obj and rng.random() < descend:
        i = rng.randrange(len(obj))
        out = list(obj)
        out[i] = mutate(rng, obj[i], hostile, descend, replace) if rng.random() < 0.5 else rng.choice(hostile)
        return out
    return rng.choice(hostile)
