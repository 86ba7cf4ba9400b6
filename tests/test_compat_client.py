"""The client calls public HFAiLab scripts make: bind_numa, bind_hf_except_hook, set_watchdog_time,
set_nccl_opt_level, the original receive_suspend_command / go_suspend signatures, to_hfai's
arguments."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hfai
import hfai.client
import hfai.distributed
from hfai import numa

A, B, C, D = (frozenset(range(i * 4, i * 4 + 4)) for i in range(4))
ALL = A | B | C | D


def _python(code: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("HFAI_")}
    e.update(env)
    # A session of its own: the except hook kills the script's root and its children, nothing else.
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                          cwd=cwd, timeout=120, start_new_session=True)


# ---------------------------------------------------------------------------------- bind_numa

@pytest.mark.parametrize("nprocs, nodes, gpu_nodes, allowed, want", [
    # One NUMA node (this build machine): nothing is bound.
    (2, {0: ALL}, None, ALL, [None, None]),
    # GPUs known: each rank goes to its GPU's node, whatever the rank order.
    (4, {0: A, 1: B}, [1, 1, 0, 0], ALL, [B, B, A, A]),
    # A GPU whose node the driver does not know is left alone; the others are bound.
    (2, {0: A, 1: B}, [None, 1], ALL, [None, B]),
    # No GPU information: ranks spread over the nodes in contiguous blocks.
    (8, {0: A, 1: B}, None, ALL, [A] * 4 + [B] * 4),
    (4, {0: A, 1: B, 2: C, 3: D}, None, ALL, [A, B, C, D]),
    (3, {0: A, 1: B}, None, ALL, [A, A, B]),
    # The job's cgroup allows only part of the host: only allowed CPUs are handed out ...
    (2, {0: A, 1: B}, [0, 1], frozenset({0, 1, 4}), [frozenset({0, 1}), frozenset({4})]),
    # ... and when that leaves one node, nothing is bound.
    (2, {0: A, 1: B}, [0, 1], A, [None, None]),
    (0, {0: A, 1: B}, None, ALL, []),
])
def test_numa_plan(nprocs, nodes, gpu_nodes, allowed, want):
    assert numa.plan_affinity(nprocs, nodes, gpu_nodes, allowed) == want


def test_host_topology_from_sysfs(tmp_path):
    for n, cpus in ((0, "0-3,8-11"), (1, "4-7,12-15"), (2, "")):  # node 2: memory only
        (tmp_path / f"node{n}").mkdir()
        (tmp_path / f"node{n}" / "cpulist").write_text(cpus + "\n")
    (tmp_path / "possible").write_text("0-2\n")
    assert numa.host_numa_nodes(tmp_path) == {0: frozenset([0, 1, 2, 3, 8, 9, 10, 11]),
                                              1: frozenset([4, 5, 6, 7, 12, 13, 14, 15])}
    assert numa.host_numa_nodes(tmp_path / "absent") == {}
    assert numa.parse_cpulist("5") == frozenset({5})


def _report_affinity(local_rank: int, out: str) -> None:
    with open(os.path.join(out, f"rank{local_rank}"), "w") as f:
        f.write(",".join(map(str, sorted(os.sched_getaffinity(0)))))


@pytest.mark.slow
def test_spawn_accepts_bind_numa_and_keeps_a_single_node_hosts_affinity(tmp_path):
    pytest.importorskip("torch")
    import hfai.multiprocessing

    hfai.multiprocessing.spawn(_report_affinity, args=(str(tmp_path),), nprocs=2, bind_numa=True)
    mine = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    for rank in (0, 1):
        got = (tmp_path / f"rank{rank}").read_text()
        if len(numa.host_numa_nodes()) <= 1:
            assert got == mine
        else:  # a multi-node host: bound to a subset
            assert set(got.split(",")) < set(mine.split(","))


@pytest.mark.slow
def test_spawn_binds_each_rank_as_planned(tmp_path, monkeypatch):
    # This host has one NUMA node; a two-node plan exercises what a worker does with its share.
    pytest.importorskip("torch")
    import hfai.multiprocessing

    first = min(os.sched_getaffinity(0))
    monkeypatch.setattr(numa, "plan_for_this_host", lambda n: [frozenset({first}), None][:n])
    hfai.multiprocessing.spawn(_report_affinity, args=(str(tmp_path),), nprocs=2)
    assert (tmp_path / "rank0").read_text() == str(first)
    assert (tmp_path / "rank1").read_text() == ",".join(map(str, sorted(os.sched_getaffinity(0))))


# --------------------------------------------------------------------------- except hook

_HOOKED = """
    import multiprocessing as mp, os, sys, time
    import hfai.client
    from {module} import Process  # torch.multiprocessing's is multiprocessing's
    hfai.client.bind_hf_except_hook(Process)

    def waits(ev):
        open("waiter.pid", "w").write(str(os.getpid()))
        ev.wait()  # forever: the failing sibling never sets it

    def fails():
        while not os.path.exists("waiter.pid"):
            time.sleep(0.01)
        raise ValueError("boom in rank 1")

    if __name__ == "__main__":
        mp.set_start_method("{method}")
        ev = mp.Event()
        procs = [Process(target=waits, args=(ev,)), Process(target=fails)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        print("joined")
"""


# The public scripts pass torch.multiprocessing.Process; spawned children importing torch cost seconds.
@pytest.mark.parametrize("method, module", [("fork", "torch.multiprocessing"), ("spawn", "multiprocessing")])
def test_an_exception_in_one_process_fails_the_whole_job(tmp_path, method, module):
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(_HOOKED.format(method=method, module=module)))
    e = {k: v for k, v in os.environ.items() if not k.startswith("HFAI_")}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=e, cwd=tmp_path,
                       timeout=120, start_new_session=True)
    assert r.returncode != 0 and "joined" not in r.stdout
    assert "Traceback" in r.stderr and "ValueError: boom in rank 1" in r.stderr, r.stderr
    import psutil

    waiter = int((tmp_path / "waiter.pid").read_text())
    try:
        psutil.Process(waiter).wait(timeout=30)  # killed; reaped by init once the root is gone
    except psutil.NoSuchProcess:
        pass
    assert not psutil.pid_exists(waiter) or psutil.Process(waiter).status() == psutil.STATUS_ZOMBIE


def test_the_hook_is_idempotent_and_checks_its_argument():
    class P:
        def run(self):
            raise KeyError("x")

    hfai.client.bind_hf_except_hook(P)
    wrapped = P.run
    hfai.client.bind_hf_except_hook(P)
    assert P.run is wrapped
    with pytest.raises(TypeError, match="Process class"):
        hfai.client.bind_hf_except_hook(object())  # type: ignore[arg-type]


# ------------------------------------------------------- watchdog, nccl level, suspend signatures

def test_set_watchdog_time_is_checked_and_off_the_platform_only_recorded(monkeypatch):
    # On the platform it reaches the run's launcher too: tests/test_watchdog.py.
    monkeypatch.delenv("HFAI_WATCHDOG_TIME", raising=False)
    monkeypatch.delenv("HFAI_CONTROL_DIR", raising=False)
    assert hfai.set_watchdog_time(1800) is None and hfai.client.set_watchdog_time is hfai.set_watchdog_time
    assert os.environ["HFAI_WATCHDOG_TIME"] == "1800"
    with pytest.raises(TypeError):
        hfai.set_watchdog_time("1800")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        hfai.set_watchdog_time(0)


def test_set_nccl_opt_level_takes_the_enum():
    dist = hfai.distributed
    assert dist.set_nccl_opt_level(dist.HFAI_NCCL_OPT_LEVEL.AUTO) is None
    with pytest.raises(TypeError, match="HFAI_NCCL_OPT_LEVEL"):
        dist.set_nccl_opt_level("AUTO")  # type: ignore[arg-type]


_RANK0_ASKS = """
    import datetime, os, sys
    import torch.distributed as dist
    import hfai, hfai.client, hfai.multiprocessing

    def worker(rank, call):
        os.environ["HFAI_CONTROL_DIR"] = os.path.abspath(f"control{rank}")
        dist.init_process_group("gloo", init_method="file://" + os.path.abspath("store"), rank=rank,
                                world_size=2, timeout=datetime.timedelta(seconds=10))
        if rank == 0:  # as resnet/train.py and bert/pretrain.py do: rank 0 asks, alone
            flags = eval(call)
            open("rank0", "w").write(repr(flags))
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        for r in (0, 1):
            os.makedirs(f"control{r}")
        open("control0/suspend", "w").close()
        hfai.multiprocessing.spawn(worker, args=(sys.argv[1],), nprocs=2, bind_numa=False)
        print("done")
"""


@pytest.mark.slow
def test_the_originals_positional_timeout_is_not_a_collective(tmp_path, monkeypatch):
    # A positional 500 (the original's timeout) must not mean sync=True: an all-reduce hangs (or
    # fails) when only rank 0 calls it. It reads the local flag; the keyword is the collective.
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(_RANK0_ASKS))
    e = {k: v for k, v in os.environ.items() if not k.startswith("HFAI_")}
    call = "(hfai.receive_suspend_command(500), hfai.client.receive_suspend_command(500, False))"
    r = subprocess.run([sys.executable, str(script), call], capture_output=True, text=True, env=e, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
    assert (tmp_path / "rank0").read_text() == "(True, True)"
    monkeypatch.setenv("HFAI_CONTROL_DIR", str(tmp_path))
    with pytest.raises(TypeError, match="sync=True"):
        hfai.receive_suspend_command(True)
    with pytest.raises(TypeError, match="raise_exception"):
        hfai.receive_suspend_command(500, "yes")  # type: ignore[arg-type]


def test_go_suspend_takes_the_originals_arguments(tmp_path):
    r = _python("""
        import hfai
        hfai.go_suspend(500, False)
        print("not reached")
    """, tmp_path, HFAI_CONTROL_DIR=str(tmp_path))
    assert r.returncode == 0 and "not reached" not in r.stdout and (tmp_path / "ack").read_text().endswith("exit\n")


# ----------------------------------------------------------------------------------- to_hfai

def test_to_hfai_takes_the_originals_arguments(capsys):
    torch = pytest.importorskip("torch")
    import hfai.nn

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = hfai.nn.to_hfai(model, contiguous_param=False, verbose=True, inplace=False)
    assert type(out[1]) is hfai.nn.LayerNorm and type(model[1]) is torch.nn.LayerNorm
    assert "LayerNorm" in capsys.readouterr().out
    same = hfai.nn.to_hfai(model, contiguous_param=True)
    assert same is model and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(TypeError, match="contiguous_param"):
        hfai.nn.to_hfai(model, contiguous_param="yes")  # type: ignore[arg-type]
