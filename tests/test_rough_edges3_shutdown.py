"""`make test` ended with ~30 lines of nanobind's leak report from libtriton (issue 39 item 13):
tests/conftest.py keeps it off the terminal once pytest has printed its results. Run in a child
process that leaks a Triton binding object the way a failed compile does, and exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

TESTS = Path(__file__).resolve().parent

LEAK = f"""
import ctypes, runpy, sys
import triton._C.libtriton as lt
conftest = runpy.run_path({str(TESTS / "conftest.py")!r})
if sys.argv[1] == "unconfigure":
    conftest["pytest_unconfigure"](None)  # what pytest calls at the end of the session
print("results", flush=True)
ctypes.pythonapi.Py_IncRef(ctypes.py_object(lt.ir.context()))  # alive at shutdown
"""


def _run(step: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LEAK, step], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", **env})


def test_the_shutdown_report_of_triton_s_bindings_is_kept_off_the_terminal():
    assert "nanobind: leaked" in _run("none").stderr  # what it is without the hook
    quiet = _run("unconfigure")
    assert quiet.returncode == 0 and quiet.stdout == "results\n" and quiet.stderr == ""


def test_it_can_be_kept_for_debugging():
    assert "nanobind: leaked" in _run("unconfigure", HFAI_TEST_SHUTDOWN_STDERR="1").stderr
