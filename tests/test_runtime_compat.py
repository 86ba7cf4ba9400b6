"""The in-job runtime as scripts written for the original platform use it (issue 13): the
simulated suspend resumes like the platform, and the original client's module names import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHAIN = """
import os, hfai
count = int(os.environ["HFAI_SUSPEND_COUNT"])
print("run", count, hfai.get_whole_life_state(), os.environ["MARSV2_SUSPEND_COUNT"],
      os.environ.get("MARSV2_WHOLE_LIFE_STATE", "0"), flush=True)
if count < 2 and hfai.receive_suspend_command():
    hfai.set_whole_life_state(hfai.get_whole_life_state() + 7)
    hfai.go_suspend()
print("finished", flush=True)
"""


def _run(script, cwd, home, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HFAI_", "MARSV2_"))}
    e.update(HFAI_HOME=str(home), **env)
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env=e, capture_output=True, text=True, timeout=60)


def test_a_simulated_suspend_resumes_like_the_platform(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(CHAIN)
    home = tmp_path / "home"
    seen = []
    for _ in range(3):
        r = _run(script, tmp_path, home, HFAI_SIMULATE_SUSPEND_S="0")
        assert r.returncode == 0, r.stderr
        seen.append(r.stdout.split("\n")[0])
    # Suspended twice, the count and the whole-life state carried across (HFAI_ and MARSV2_
    # names), then it finished: that ends the chain, and the next run starts a new one.
    assert seen == ["run 0 0 0 0", "run 1 7 1 7", "run 2 14 2 14"]
    assert not list((home / "simulate").iterdir())
    assert _run(script, tmp_path, home, HFAI_SIMULATE_SUSPEND_S="0").stdout.startswith("run 0 0")
    # Another command line in the same directory is another chain.
    other = tmp_path / "other.py"
    other.write_text(CHAIN)
    assert _run(other, tmp_path, home, HFAI_SIMULATE_SUSPEND_S="0").stdout.startswith("run 0 0")


def test_without_simulation_nothing_is_kept(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import hfai\nhfai.set_whole_life_state(3)\nhfai.go_suspend()\nprint('ran on')\n")
    r = _run(script, tmp_path, tmp_path / "home")
    assert r.returncode == 0 and "ran on" in r.stdout and not (tmp_path / "home").exists()


@pytest.mark.slow  # a fresh interpreter or more: seconds
def test_hfai_nccl_distributed_is_hfai_distributed_and_stays_light():
    code = ("import sys, hfai, hfai.distributed\n"
            "import hfai.nccl.distributed as dist\n"
            "from hfai.nccl import distributed as again\n"
            "print(dist is hfai.distributed is again is hfai.nccl.distributed, 'torch' in sys.modules)\n"
            "print(dist.is_available(), callable(dist.all_reduce), callable(dist.setup))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["True", "False", "True", "True", "True"], r.stderr
