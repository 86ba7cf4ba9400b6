"""Issue 24 item 2 through the real CLI on a local cluster: a job array stopped, held, released,
updated and shown as a whole by its id or name, several jobs in one `hfai stop`, members in
index order, `hfai ps --sort`."""

from __future__ import annotations

import json
import re

import pytest
from spine_cluster import Cluster

from hfai.protocol.types import ChainState, Priority

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("arrays"), nodes=1) as c:
        yield c


def ok(r):
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_an_array_is_handled_as_a_whole(cluster, tmp_path):
    out = ok(cluster.cli("submit", "--name", "sweep", "--array", "0-4", "bash", "-c", "sleep 600", cwd=tmp_path))
    array_id = re.search(r"job array sweep \((\w+)\)", out).group(1)
    ids = out.split("ids:")[1].split()
    cluster.wait_state(ids[0], ChainState.RUNNING)  # one node: the others wait

    shown = ok(cluster.cli("status", "sweep"))
    assert shown.startswith(f"job array sweep ({array_id}) of tester: 5 member(s)")
    assert [int(i) for i in re.findall(r"sweep\[(\d)\]", shown)] == [0, 1, 2, 3, 4]
    listed = ok(cluster.cli("ps", "--name", "sweep*"))
    assert [int(i) for i in re.findall(r"sweep\[(\d)\]", listed)] == [0, 1, 2, 3, 4]
    backwards = ok(cluster.cli("ps", "--sort", "-name"))
    assert [int(i) for i in re.findall(r"sweep\[(\d)\]", backwards)] == [4, 3, 2, 1, 0]

    held = ok(cluster.cli("hold", "sweep"))
    assert "1 left as they are" in held and held.count(" held: queued") == 4
    members = json.loads(ok(cluster.cli("status", array_id, "--json")))["members"]
    assert [m["held_by"] for m in members] == [None, "tester", "tester", "tester", "tester"]
    ok(cluster.cli("release", array_id))
    assert not any(cluster.job(i).hold for i in ids)
    ok(cluster.cli("update", "sweep", "-p", "LOW"))
    assert [cluster.job(i).spec.priority for i in ids[1:]] == [Priority.LOW.value] * 4

    # Several ids in one stop; then the rest of the array by its name.
    stopped = ok(cluster.cli("stop", ids[3], ids[4]))
    assert stopped.count("stopped: stopped") == 2
    ok(cluster.cli("stop", "sweep"))
    for i in ids:
        cluster.wait_state(i, ChainState.STOPPED, timeout=30)
    missing = cluster.cli("stop", "no-such-array")
    assert missing.returncode == 1 and "no job or job array" in missing.stderr and "Traceback" not in missing.stderr
