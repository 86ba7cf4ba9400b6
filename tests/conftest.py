"""Settings that must hold before any test module imports the libraries they steer, and the
fixtures tests share (plain fakes are in tests/fakes.py, the local cluster in tests/spine_cluster.py,
the in-process CLI in tests/hfai_cli.py)."""

import atexit
import os
import sys

import pytest

# hfai.nn's Triton kernels run on the CPU under Triton's interpreter. Triton reads TRITON_INTERPRET
# once, when it is first imported, and torch imports it on the side (torch.distributed.pipelining,
# FSDP, the compiler): set here, it holds whichever test imports triton first. Without a GPU only;
# a GPU machine compiles the kernels for real.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_unconfigure(config):
    """Once the results are out: keep triton's shutdown report off the terminal (see below)."""
    if "triton" in sys.modules and not os.environ.get("HFAI_TEST_SHUTDOWN_STDERR"):
        atexit.register(_quiet_stderr)


def _quiet_stderr():
    # At interpreter shutdown nanobind (under libtriton) lists the binding objects still alive,
    # ~30 lines of "nanobind: leaked N functions!". Triton keeps an ir.context alive past a failed
    # compile (fixed upstream, triton-lang/triton#11552), and the process is exiting: the memory
    # goes back with it. Runs after every test's outcome and pytest's summary were printed;
    # HFAI_TEST_SHUTDOWN_STDERR=1 keeps the report (Triton's own compile workers do the same).
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


@pytest.fixture
def nats_url(tmp_path):
    """The URL of a lone JetStream nats-server of this test's own, stopped when it ends."""
    # Imported here: the cluster harness pulls in the local cluster's code, which most tests never need.
    from spine_cluster import nats_server

    with nats_server(tmp_path) as url:
        yield url


@pytest.fixture
def home(tmp_path):
    """An HFAI_HOME for `hfai local` commands; a local cluster the test left running there is
    brought down afterwards."""
    from hfai.cli.local import LocalCluster

    h = tmp_path / "home"
    yield h
    local = LocalCluster.load(h / "local")
    if local is not None:
        local.down()


@pytest.fixture(scope="module")
def users():
    """The two Unix test users of tests/unix_users.py, ``{name: pwd entry}``, created for a module
    where missing and removed after it (needs root)."""
    from unix_users import create_users

    yield from create_users()
