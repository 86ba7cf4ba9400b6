"""The quick exit of a query command run as its own process (``main()`` without arguments, as the
console script and ``python -m`` call it: hfai.cli.main._exit_now): the answer
is all there, the exit status is the command's, the atexit handlers ran, and the interpreter's
teardown (freeing every object, one by one) was skipped; where a thread still runs, or the command
is called in-process, the exit is the usual one. Real processes against a real cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from spine_cluster import Cluster

from hfai.protocol.types import ChainState

#: The process: an object whose __del__ runs only at the interpreter's teardown, an atexit
#: handler, optionally a thread still running when the command ends, then the command as the
#: console script runs it (`sys.exit(main())` at the top of a script named hfai).
SCRIPT = textwrap.dedent("""
    import atexit, os, sys, threading, time
    from hfai.cli.main import main

    fd, thread = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND), sys.argv[2] == "thread"
    def mark(what, write=os.write, fd=fd):  # all it needs bound: at the teardown, globals are going
        write(fd, what.encode() + b"\\n")

    class Witness:
        def __del__(self, mark=mark):
            mark("torn down")

    sys.modules["exit_witness"] = Witness()  # dropped as the teardown empties sys.modules
    atexit.register(mark, "atexit")
    if thread:
        threading.Thread(target=time.sleep, args=(0.3,)).start()
    del sys.argv[1:3]
    sys.exit(main())
""")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("exit"), nodes=1) as c:
        c.creds("tester")
        yield c


@pytest.fixture(scope="module")
def job(cluster, tmp_path_factory):
    record = cluster.submit([sys.executable, "-c", "pass"], "exit", workdir=tmp_path_factory.mktemp("work"))
    return cluster.wait_state(record.id, ChainState.SUCCEEDED)


def hfai(cluster: Cluster, tmp_path: Path, *args: str, thread: bool = False) -> tuple[subprocess.CompletedProcess,
                                                                                    list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HFAI_NATS_", "HFAI_ISSUER"))}
    env.update(HFAI_CONFIG=str(cluster.local.config_path), HFAI_USER="tester")
    marks, script = tmp_path / "marks", tmp_path / "bin" / "hfai"  # a console script, as pip writes it
    script.parent.mkdir(exist_ok=True)
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script), str(marks), "thread" if thread else "-", *args], env=env,
                       capture_output=True, text=True, timeout=60)
    return r, marks.read_text().splitlines() if marks.exists() else []


@pytest.mark.parametrize("args", [("ps", "-a"), ("status", "JOB"), ("nodes",)])
def test_a_query_ends_at_once_with_its_answer_and_its_atexit_handlers_run(cluster, job, tmp_path, args):
    args = tuple(job.id if a == "JOB" else a for a in args)
    r, marks = hfai(cluster, tmp_path, *args)
    assert r.returncode == 0, r.stderr
    assert (job.id if args != ("nodes",) else "node-0") in r.stdout  # flushed before the exit
    assert marks == ["atexit"]  # no teardown: the witness was never freed


def test_a_failed_query_ends_at_once_with_its_status_and_message(cluster, tmp_path):
    r, marks = hfai(cluster, tmp_path, "status", "no-such-job")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.startswith("Error: ") and "no-such-job" in r.stderr
    assert marks == ["atexit"]
    (tmp_path / "usage").mkdir()
    r, marks = hfai(cluster, tmp_path / "usage", "ps", "--no-such-option")
    assert r.returncode == 2 and "No such option" in r.stderr


def test_with_a_thread_still_running_the_exit_is_the_usual_one(cluster, job, tmp_path):
    r, marks = hfai(cluster, tmp_path, "status", job.id, thread=True)
    assert r.returncode == 0 and job.id in r.stdout, r.stderr
    assert marks == ["atexit", "torn down"]


def test_a_call_that_ran_no_command_ends_at_once_too(cluster, tmp_path):
    r, marks = hfai(cluster, tmp_path, "--help")
    assert r.returncode == 0 and "Commands" in r.stdout
    assert marks == ["atexit"]
    (tmp_path / "unknown").mkdir()
    r, marks = hfai(cluster, tmp_path / "unknown", "no-such-command")
    assert r.returncode == 2 and "No such command" in r.stderr
    assert marks == ["atexit"]


def test_other_commands_and_in_process_calls_exit_the_usual_way(cluster, tmp_path):
    r, marks = hfai(cluster, tmp_path, "sim", "--help")  # not one of QUICK_EXIT
    assert r.returncode == 0 and "Replay" in r.stdout
    assert marks == ["atexit", "torn down"]
    # In-process, from a script that goes on after it (click's CliRunner; main() given its arguments),
    # even one named hfai: each call returns.
    code = textwrap.dedent("""
        import sys
        from click.testing import CliRunner
        from hfai.cli.main import main
        r = CliRunner().invoke(main, ['status', 'no-such-job'])
        print('returned', r.exit_code)
        try:
            main(['status', 'no-such-job'])
        except SystemExit as e:
            print('returned', e.code)
    """)
    script = tmp_path / "in-process" / "hfai"
    script.parent.mkdir()
    script.write_text(code)
    env = {**os.environ, "HFAI_CONFIG": str(cluster.local.config_path), "HFAI_USER": "tester"}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split("\n")[:2] == ["returned 1", "returned 1"], out.stderr


WITNESS = """
import os, sys
class _Witness:
    def __del__(self, write=os.write):
        write(2, b"torn down\\n")
sys.modules["exit_witness"] = _Witness()  # dropped as the teardown empties sys.modules
"""


@pytest.mark.parametrize("entry", ["console script", "python -m"])
def test_the_console_script_and_python_m_end_a_query_at_once(cluster, job, tmp_path, entry):
    script = Path(sys.executable).parent / "hfai"
    if entry == "console script" and not script.exists():
        pytest.skip("no hfai console script next to this interpreter")
    cmd = [str(script)] if entry == "console script" else [sys.executable, "-m", "hfai.cli.main"]
    (tmp_path / "sitecustomize.py").write_text(WITNESS)  # imported at the interpreter's start
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HFAI_NATS_", "HFAI_ISSUER"))}
    env.update(HFAI_CONFIG=str(cluster.local.config_path), HFAI_USER="tester",
               PYTHONPATH=os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = subprocess.run([*cmd, "status", job.id], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and job.id in r.stdout, r.stderr
    assert "torn down" not in r.stderr
    r = subprocess.run([*cmd, "sim", "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "torn down" in r.stderr


GC_WITNESS = """
import atexit, gc, os, sys
seen = {"loading": 0}
def count(phase, info):
    jobs = sys.modules.get("hfai.cli.jobs")
    if phase == "start" and jobs is not None and not hasattr(jobs, "logs"):  # cli/jobs.py defines logs last
        seen["loading"] += 1
gc.callbacks.append(count)
atexit.register(lambda write=os.write: write(2, f"gc {seen['loading']} {gc.isenabled()}\\n".encode()))
"""


@pytest.mark.parametrize("entry", ["console script", "python -m"])
def test_the_collector_rests_while_the_commands_module_loads(cluster, job, tmp_path, entry):
    """While the command's module and what it imports load (asyncio, nats-py, the protocol) no
    collection runs; it runs again once the module loaded."""
    script = Path(sys.executable).parent / "hfai"
    if entry == "console script" and not script.exists():
        pytest.skip("no hfai console script next to this interpreter")
    cmd = [str(script)] if entry == "console script" else [sys.executable, "-m", "hfai.cli.main"]
    (tmp_path / "sitecustomize.py").write_text(GC_WITNESS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HFAI_NATS_", "HFAI_ISSUER"))}
    env.update(HFAI_CONFIG=str(cluster.local.config_path), HFAI_USER="tester",
               PYTHONPATH=os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = subprocess.run([*cmd, "status", job.id], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and job.id in r.stdout, r.stderr
    assert r.stderr.splitlines()[-1] == "gc 0 True"


def test_importing_the_cli_leaves_the_collector_and_the_exit_alone():
    """No side effect at import, whatever the process's argv: the collector runs, and a cycle left
    at exit is finalized as Python finalizes it."""
    code = """
import gc, sys
sys.argv[0] = "/usr/bin/hfai"  # as the console script names the process
import hfai.cli, hfai.cli.main
print(gc.isenabled(), gc.get_freeze_count(), flush=True)

class Cycle:
    def __del__(self):
        print("finalized", flush=True)

c = Cycle()
c.me = c
del c
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "0", "finalized"]
