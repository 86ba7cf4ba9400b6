"""The tests' real sleeps stay within a budget (issue 37 §3): a test that waits for time to pass
(a timeout, an idle period, a window, a backoff) moves a :class:`hfai.core.clock.FakeClock` instead,
and one that waits for a real process polls through ``tests/waits.py``.

Counted: each call ``time.sleep(...)`` or ``asyncio.sleep(...)`` in a test module or helper, read
from the syntax tree, so the Python code of the jobs that tests start (string literals) and the
modules under ``tests/jobs/`` are the jobs' own time. Not counted: ``tests/waits.py``, the polling
helper, and a sleep of a literal 0, which yields to other tasks without waiting."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
BUDGET = 25
NOT_COUNTED = {TESTS / "waits.py"}


def _is_zero(arg: ast.expr) -> bool:
    return isinstance(arg, ast.Constant) and arg.value == 0


def real_sleeps(root: Path = TESTS) -> list[str]:
    """``path:line: call`` for each real sleep under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path in NOT_COUNTED or "jobs" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sleep"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in ("time", "asyncio")
                    and not (node.args and _is_zero(node.args[0]))):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_tests_real_sleeps_stay_within_the_budget():
    found = real_sleeps()
    assert len(found) <= BUDGET, f"{len(found)} real sleeps in tests/, at most {BUDGET}:\n" + "\n".join(found)


def test_the_count_sees_sleeps_and_only_sleeps(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "job.py").write_text("import time\ntime.sleep(1)\n")
    (tmp_path / "test_x.py").write_text(
        "import asyncio, time\n"
        "JOB = 'import time; time.sleep(5)'\n"  # a job's code: its own time
        "def f():\n    time.sleep(0.1)\n"
        "async def g():\n    await asyncio.sleep(0)\n    await asyncio.sleep(0.5)\n")
    assert real_sleeps(tmp_path) == ["test_x.py:4: time.sleep(0.1)", "test_x.py:7: asyncio.sleep(0.5)"]
