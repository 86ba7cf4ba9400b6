"""Submit-time spec validation (controller/validate.py): what the agents could not launch is refused
with one line that says what to fix; everything launchable still passes."""

from __future__ import annotations

import dataclasses

import pytest

from hfai.controller import validate
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import AUTO_PRIORITY, JobSpec, NodeRecord

SPEC = JobSpec(name="mnist", entrypoint=("python", "train.py", "--lr", "0.1"), workdir="/home/alice/mnist",
               nodes=2, priority=10, group="default", user="alice", env={"OMP_NUM_THREADS": "4"})
NODES = [NodeRecord(name=f"n{i}", group="default", address="10.0.0.1", ts=0.0, seq=1, envs=("py311", "torch2"))
         for i in range(3)] + [NodeRecord(name="c0", group="cpu", address="10.0.0.2", ts=0.0, seq=1, envs=("py311",))]


def spec(**changes) -> JobSpec:
    return dataclasses.replace(SPEC, **changes)


def refused(s: JobSpec, nodes=NODES) -> str:
    with pytest.raises(InvalidRequest) as info:
        validate.validate_spec(s, nodes)
    message = str(info.value)
    assert message and "\n" not in message and "\r" not in message, repr(message)
    assert len(message) < 400, message
    return message


@pytest.mark.parametrize("s", [
    SPEC,
    spec(name="训练-resnet50 (lr=0.1)"),
    spec(name="x" * 128),
    spec(name="a.b_c-d:e"),
    spec(nodes=3),
    spec(nodes=3, min_nodes=1, max_nodes=3),
    spec(nodes=2, min_nodes=2, max_nodes=2),
    spec(priority=AUTO_PRIORITY),
    spec(priority=50),
    spec(env={}),
    spec(env={"_X": "", "lower_case9": "a=b=c", "PATH": "/opt/bin:/usr/bin", "JSON": '{"a": [1, 2]}'}),
    spec(env_name="torch2"),
    spec(group="cpu", nodes=1),
    spec(entrypoint=("bash", "-c", "echo 'é\t\n'")),
    spec(entrypoint=("./run",), workdir="/"),
    spec(workdir="/home/alice/my project/ü"),
])
def test_launchable_specs_pass(s):
    assert validate.validate_spec(s, NODES) is s


@pytest.mark.parametrize("changes, text", [
    ({"name": ""}, "1-128 characters"),
    ({"name": "x" * 129}, "1-128 characters"),
    ({"name": "bad\0name"}, "control character '\\x00'"),
    ({"name": "\x1b[2J\x1b[Hhello"}, "control character '\\x1b'"),
    ({"name": "a\nb"}, "control character '\\n'"),
    ({"name": "tab\there"}, "control character '\\t'"),
    ({"name": "csi\x9b31m"}, "control character '\\x9b'"),
    ({"name": "rtl\u202eevil"}, "control character '\\u202e'"),
    ({"name": "zero\u200bwidth"}, "control character"),
    ({"name": "a/b"}, "'/'"),
    ({"name": "../../etc"}, "'/'"),
    ({"name": ".."}, "'..'"),
    ({"name": "."}, "'.'"),
    ({"name": " padded"}, "space"),
    ({"name": "padded "}, "space"),
    ({"nodes": 0}, "at least 1 node"),
    ({"nodes": -5}, "at least 1 node"),
    ({"nodes": 10**9}, "at most 100000 nodes"),
    ({"nodes": 2**63 - 1}, "at most 100000 nodes"),
    ({"nodes": 3, "min_nodes": 5, "max_nodes": 3}, "elastic"),
    ({"nodes": 3, "min_nodes": 0, "max_nodes": 3}, "elastic"),
    ({"nodes": 3, "min_nodes": -1, "max_nodes": 0}, "elastic"),
    ({"nodes": 3, "min_nodes": 1, "max_nodes": 10**9}, "elastic"),
    ({"nodes": 2, "min_nodes": 1, "max_nodes": 3}, "elastic"),
    ({"priority": 7}, "unknown priority 7"),
    ({"priority": -2}, "unknown priority"),
    ({"priority": 10**18}, "unknown priority"),
    ({"group": ""}, "group"),
    ({"group": "gpu.big"}, "group"),
    ({"group": "a b"}, "group"),
    ({"group": "g" * 65}, "group"),
    ({"env_name": "../../usr"}, "HF_ENV_NAME"),
    ({"env_name": "py\0"}, "HF_ENV_NAME"),
    ({"entrypoint": ()}, "no command"),
    ({"entrypoint": ("",)}, "no command"),
    ({"entrypoint": ("python", "a\0b")}, "argument 1"),
    ({"entrypoint": ("x",) * 4097}, "at most 4096"),
    ({"entrypoint": ("python", "x" * 70000)}, "shorten the command line"),
    ({"env": {"": "v"}}, "empty name"),
    ({"env": {"A=B": "v"}}, "contains '='"),
    ({"env": {"=": "v"}}, "contains '='"),
    ({"env": {"NUL\0KEY": "v"}}, "letters, digits"),
    ({"env": {"1ABC": "v"}}, "letters, digits"),
    ({"env": {"A B": "v"}}, "letters, digits"),
    ({"env": {"K\x1b": "v"}}, "letters, digits"),
    ({"env": {"K" * 257: "v"}}, "at most 256"),
    ({"env": {"GOOD": "bad\0value"}}, "GOOD contains a NUL"),
    ({"env": {f"V{i}": "" for i in range(1025)}}, "at most 1024"),
    ({"env": {"BIG": "x" * 70000}}, "shorten the command line or the environment"),
    ({"workdir": "relative/dir"}, "absolute"),
    ({"workdir": ""}, "absolute"),
    ({"workdir": "/home/a\0b"}, "NUL"),
    ({"workdir": "/" + "d" * 5000}, "at most 4096"),
])
def test_unlaunchable_specs_are_refused_with_one_line(changes, text):
    message = refused(spec(**changes))
    assert text in message, message


@pytest.mark.parametrize("changes, nodes, text", [
    ({"group": "nope"}, NODES, "group 'nope' has no nodes"),
    ({"nodes": 4}, NODES, "asks for 4 nodes but group 'default' has 3"),
    ({"nodes": 5, "min_nodes": 4, "max_nodes": 5}, NODES, "asks for 4 nodes"),
    ({"env_name": "torch2", "group": "cpu", "nodes": 1}, NODES, "environments on group 'cpu': py311"),
    ({}, [], "has no nodes"),
])
def test_placement_is_checked_against_the_group(changes, nodes, text):
    assert text in refused(spec(**changes), nodes)


def test_static_problems_are_reported_before_placement():
    # A spec bad in itself is refused for that, not for a group that happens to lack nodes.
    assert "NUL" in refused(spec(group="nope", env={"A": "\0"}))


def test_error_quotes_of_huge_or_hostile_values_stay_short():
    message = refused(spec(name="\x1b" * 5000))
    assert "\x1b" not in message and len(message) < 200


def test_check_spec_is_pure_and_returns_the_spec_unchanged():
    before = dataclasses.replace(SPEC)
    assert validate.check_spec(SPEC) is SPEC and SPEC == before
