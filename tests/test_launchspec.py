"""The launch spec (agent/launchspec.py): what the agent writes is what the launcher reads, and a
spec that lacks or mistypes a field is refused with the field's name, never read as a default."""

from __future__ import annotations

import json

import pytest

from hfai.agent.cgroup import CgroupKind
from hfai.agent.launchspec import CgroupPlace, Fencing, LaunchSpec, Limits, SwitchTo, WatchSpec

FULL = LaunchSpec(
    argv=("python", "train.py"), env={"A": "1"}, cwd="/w", log="/l/rank0.log", log_cap=1 << 20,
    limits=Limits(container="bwrap", memory_bytes=2**30, pids_max=512,
                  cgroup=CgroupPlace(CgroupKind.V1, ("/sys/fs/cgroup/memory/h/n/k", "/sys/fs/cgroup/pids/h/n/k"))),
    fence=Fencing(alive="/s/alive", fence_s=3.0, kill_s=4.0, poll_s=0.5),
    watchdog=WatchSpec(watchdog_s=1800.0, control="/c", poll_s=1.0, dump_s=10.0, kill_s=30.0),
    switch=SwitchTo(uid=1000, gid=1000, groups=(1000, 27)),
)


@pytest.mark.parametrize("spec", [FULL, LaunchSpec(argv=("true",), env={}, cwd="/", log="/l", log_cap=0)],
                         ids=["full", "bare"])
def test_a_spec_reads_back_as_written(spec):
    back = LaunchSpec.from_json(spec.to_json())
    assert back == spec
    assert back.limits.contained is (spec.limits.container == "bwrap")


def _broken(path: tuple[str, ...], value) -> bytes:
    raw = json.loads(FULL.to_json())
    at = raw
    for key in path[:-1]:
        at = at[key]
    if value is KeyError:
        del at[path[-1]]
    else:
        at[path[-1]] = value
    return json.dumps(raw).encode()


@pytest.mark.parametrize(("path", "value", "named"), [
    (("argv",), [], "'argv'"),
    (("argv",), "python train.py", "'argv'"),
    (("env",), {"A": 1}, "'env'"),
    (("log_cap",), KeyError, "no 'log_cap'"),
    (("limits", "container"), "docker", "'container'"),
    (("limits", "memory_bytes"), -1, "'memory_bytes'"),
    (("limits", "cgroup", "kind"), "v3", "'kind'"),
    (("fence", "fence_s"), "3", "'fence_s'"),
    (("watchdog", "watchdog_s"), KeyError, "no 'watchdog_s'"),
    (("switch", "uid"), True, "'uid'"),
    (("switch", "groups"), [1000, -5], "'groups'"),
])
def test_a_missing_or_mistyped_field_is_refused_by_name(path, value, named):
    with pytest.raises(ValueError, match=named):
        LaunchSpec.from_json(_broken(path, value))


def test_not_json_is_refused():
    with pytest.raises(ValueError, match="not JSON"):
        LaunchSpec.from_json(b"{argv")
