"""The in-job runtime: light import, suspend API on and off the platform, checkpoints, config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hfai
import hfai.checkpoint
from hfai.core.config import load_config
from hfai.protocol.errors import InvalidRequest


def _python(code: str, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("HFAI_")}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=60)


def test_import_hfai_and_cli_help_stay_light():
    r = _python("import sys, hfai, hfai.cli.main, hfai.core.config, hfai.client\n"
                "print(sorted(m for m in ('torch', 'numpy', 'nats') if m in sys.modules))")
    assert r.stdout.strip() == "[]", r.stderr
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "hfai.cli.main", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "time-sharing" in r.stdout
    assert " torch" not in r.stderr


def test_lazy_subpackages_are_attributes():
    r = _python("import hfai; print(hfai.client.go_suspend is hfai.go_suspend, callable(hfai.multiprocessing.spawn))")
    assert r.stdout.split() == ["True", "True"], r.stderr
    with pytest.raises(AttributeError):
        _ = hfai.no_such_thing


def test_off_platform_calls_are_noops(monkeypatch):
    monkeypatch.delenv("HFAI_CONTROL_DIR", raising=False)
    monkeypatch.delenv("HFAI_SIMULATE_SUSPEND_S", raising=False)
    assert hfai.receive_suspend_command() is False
    assert hfai.go_suspend() is None


def test_control_directory_protocol(tmp_path, monkeypatch):
    monkeypatch.setenv("HFAI_CONTROL_DIR", str(tmp_path))
    assert not hfai.client.receive_suspend_command()
    (tmp_path / "suspend").write_text("1")
    assert hfai.client.receive_suspend_command()
    hfai.set_whole_life_state(41)
    assert hfai.get_whole_life_state() == 41 and (tmp_path / "whole_life_state").read_text().strip() == "41"
    with pytest.raises(SystemExit) as e:
        hfai.go_suspend()
    assert e.value.code == 0 and (tmp_path / "ack").exists()
    with pytest.raises(TypeError):
        hfai.set_whole_life_state("7")


def test_simulated_suspend_after_n_seconds():
    r = _python("import hfai, time\nassert not hfai.receive_suspend_command()\ntime.sleep(0.3)\n"
                "print(hfai.receive_suspend_command())\nhfai.go_suspend()\nprint('not reached')",
                HFAI_SIMULATE_SUSPEND_S="0.2")
    assert r.returncode == 0 and r.stdout.split() == ["True"] and "simulated suspend" in r.stderr


def test_checkpoint_is_atomic_and_latest_is_found(tmp_path):
    def failing_saver(obj, path):
        with open(path, "w") as f:
            f.write("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        hfai.checkpoint.save({"a": 1}, tmp_path / "ckpt_3.pt", saver=failing_saver)
    assert list(tmp_path.iterdir()) == []  # neither the final name nor a temp file remains

    import pickle

    def saver(obj, path):
        with open(path, "wb") as f:
            pickle.dump(obj, f)

    for step in (2, 10, 9):
        hfai.checkpoint.save({"step": step}, tmp_path / f"ckpt_{step}.pt", saver=saver)
    newest = hfai.checkpoint.latest(tmp_path)
    assert newest.name == "ckpt_10.pt"
    assert hfai.checkpoint.load(newest, loader=lambda p: pickle.load(open(p, "rb"))) == {"step": 10}
    assert hfai.checkpoint.latest(tmp_path / "missing") is None


def test_config_file_and_environment_overrides(tmp_path):
    path = tmp_path / "hfai.toml"
    path.write_text('[nats]\nurl = "nats://10.1.1.1:4222"\n[controller]\nslice_s = 60\n')
    cfg = load_config(path, env={"HFAI_CONTROLLER_ACK_WINDOW_S": "5", "HFAI_AGENT_NODE": "gpu-3"})
    assert cfg.nats.url == "nats://10.1.1.1:4222" and cfg.controller.slice_s == 60.0
    assert cfg.controller.ack_window_s == 5.0 and cfg.agent.node == "gpu-3"
    path.write_text("[controller]\nslise_s = 60\n")
    with pytest.raises(InvalidRequest, match="unknown keys: slise_s"):
        load_config(path, env={})
    with pytest.raises(InvalidRequest, match="not a float"):
        load_config(None, env={"HFAI_CONTROLLER_SLICE_S": "soon"})


def test_the_documented_example_config_loads_and_sets_what_it_says():
    example = Path(__file__).resolve().parent.parent / "systemd" / "hfai.toml.example"
    cfg = load_config(example, env={})  # unknown or mistyped keys would raise
    assert cfg.nats.replicas == 3 and cfg.nats.url.count(",") == 2
    assert cfg.controller.api_reply_bytes < 1024 * 1024 and cfg.controller.finished_retention_s == 30 * 86400
    assert cfg.agent.container == "bwrap" and not cfg.agent.allow_uncontained and cfg.agent.run_pids_max == 65536


def test_job_environment_has_torch_hfai_and_marsv2_names():
    from hfai.agent.jobenv import job_environment
    from hfai.protocol.types import DesiredRun, RunAssignment

    ra = RunAssignment(job_id="j", run_id=3, name="n", user="u", group="g", priority=10, rank=1, world_size=2,
                       master_addr="10.0.0.1", master_port=20001, entrypoint=("x",), workdir="/",
                       desired=DesiredRun.RUN, suspend_count=2, whole_life_state=9)
    env = job_environment(ra, "node-1", "/ctl")
    assert (env["WORLD_SIZE"], env["RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("2", "1", "10.0.0.1", "20001")
    assert env["HFAI_SUSPEND_COUNT"] == "2" and env["HFAI_WHOLE_LIFE_STATE"] == "9" and env["HFAI_RUN_ID"] == "3"
    assert env["MARSV2_WHOLE_LIFE_STATE"] == "9" and env["MARSV2_RANK"] == "1"


def test_simulated_gpus_follow_load():
    from hfai.agent.gpu import open_gpu_source

    src = open_gpu_source("sim")
    assert src.name == "sim"
    idle, busy = src.sample(busy=False), src.sample(busy=True)
    assert len(idle) == 8 and all(g.utilization == 0 for g in idle)
    assert all(80 <= g.utilization <= 100 for g in busy)
    with pytest.raises(InvalidRequest):
        open_gpu_source("cuda")


def test_auto_gpu_source_falls_back_without_nvml():
    import pynvml

    from hfai.agent.gpu import open_gpu_source

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here: auto picks the real GPUs")
    except pynvml.NVMLError:
        pass
    assert open_gpu_source("auto").name == "sim"
    with pytest.raises(InvalidRequest, match="NVML"):
        open_gpu_source("nvml")


def test_master_ports_stay_below_the_kernels_ephemeral_ports():
    # A job's rendezvous port taken as some outgoing connection's local port fails its bind
    # (EADDRINUSE): seen when the range reached into 32768-60999, Linux's default.
    from hfai.core.config import Config

    cc = Config().controller
    low = 32768
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    assert cc.master_port_base + cc.master_port_span <= min(low, 32768)
