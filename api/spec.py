"""What a submitted command runs and how long a job may: the pure parsers a job's spec is built
with, shared by ``hfai submit`` / ``hfai python`` and :mod:`hfai.client`."""

from __future__ import annotations

import os
import re
from pathlib import Path

from hfai.protocol.errors import InvalidRequest

#: Interpreters whose first operand is a script file: the CLI checks it exists before submitting
#: (a typo would otherwise surface only on a node) and the job is named after it.
INTERPRETER = re.compile(r"python[0-9.]*|bash|sh")
# Their long options that take the next argument as a value (so that value is not the script).
_LONG_VALUE_OPTIONS = frozenset({"--check-hash-based-pycs", "--rcfile", "--init-file"})


def entry_script(command: list[str] | tuple[str, ...]) -> tuple[str | None, str]:
    """(the script file ``command`` runs, or None; the default job name). Pure.

    ``python -c CODE``, ``bash -c CMD`` and ``python -m MODULE`` run no file: nothing to check,
    and the job is named after the interpreter (or the module). Any other program is named after
    itself; it is looked up on the nodes, not here.
    """
    program = os.path.basename(command[0])
    if not INTERPRETER.fullmatch(program):
        return None, Path(command[0]).stem
    python = program.startswith("python")
    # Short options that take a value (attached, or the next argument) and those that end the
    # options because the program follows inline (-c) or is a module (-m).
    valued, inline = ("WX", "cm") if python else ("oO", "c")
    rest = iter(command[1:])
    for arg in rest:
        if arg == "--":
            script = next(rest, None)
            return (script, Path(script).stem) if script else (None, program)
        if arg in _LONG_VALUE_OPTIONS:
            next(rest, None)
            continue
        if arg.startswith("--"):
            continue
        if arg[:1] in "-+" and len(arg) > 1:
            for i, flag in enumerate(arg[1:], 1):  # short options may be bundled: -uc CODE, -mpkg.mod
                if flag in valued:
                    if i == len(arg) - 1:
                        next(rest, None)
                    break
                if flag in inline:
                    if flag == "m":
                        module = arg[i + 1:] or next(rest, "")
                        return None, module.rpartition(".")[2] or program
                    return None, program
            continue
        if arg == "-":  # the program comes on stdin
            return None, program
        return arg, Path(arg).stem
    return None, program


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds from ``90m``, ``2h``, ``1d``, ``45s``, ``1:30:00`` (h:m:s), ``30:00`` (m:s) or
    a plain number of minutes (Slurm's ``-t 30``). Raises InvalidRequest."""
    t = text.strip().lower()
    try:
        if ":" in t:
            parts = [int(p) for p in t.split(":")]
            if len(parts) > 3 or any(p < 0 for p in parts):
                raise ValueError
            seconds = 0
            for p in parts:
                seconds = seconds * 60 + p
            value = float(seconds)
        elif t[-1:] in _UNITS:
            value = float(t[:-1]) * _UNITS[t[-1]]
        else:
            value = float(t) * 60
    except (ValueError, IndexError):
        raise InvalidRequest(f"{text!r}: use 90m, 2h, 1d, 45s or H:MM:SS") from None
    if not 0 < value < float("inf"):
        raise InvalidRequest(f"{text!r}: the time limit must be more than 0")
    return value
