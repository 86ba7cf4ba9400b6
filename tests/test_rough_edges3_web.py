"""Issue 39, the web's and the local cluster's rough edges that need no cluster: `hfai local status`
names the hfai-web `up` really started (item 4), and a local cluster's /metrics listen on loopback
(item 15). The live checks are in test_rough_edges3_web_live.py."""

from __future__ import annotations

import os

from hfai._atomic import write_atomic
from hfai.cli.local import LocalCluster
from hfai.core.config import WebConfig, dump_toml, load_config


def _started(tmp_path, web: WebConfig | None) -> LocalCluster:
    """What `hfai local up` leaves behind for `hfai local status`: the daemons' config and
    cluster.json (a live pid stands in for each daemon)."""
    c = LocalCluster(root=tmp_path, web=web, url="nats://127.0.0.1:4222")
    c.layout.prepare()
    write_atomic(c.config_path, dump_toml(c.config()))
    c.pids = {"nats": os.getpid(), **({"web": os.getpid()} if web is not None else {})}
    c.save()
    return c


def test_local_status_names_the_port_up_took_for_hfai_web(tmp_path):
    """Issue 39 item 4: with 8470 taken, `up` printed its real address and `status` 8470: on a
    shared host someone else's hfai-web, where signing in uploads your credentials."""
    _started(tmp_path, WebConfig(port=51234))
    loaded = LocalCluster.load(tmp_path)
    assert loaded is not None
    assert ("web pages", "http://127.0.0.1:51234/") in loaded.urls()


def test_a_cluster_without_hfai_web_lists_no_pages(tmp_path):
    _started(tmp_path, None)
    loaded = LocalCluster.load(tmp_path)
    assert loaded is not None and loaded.web is None
    assert [what for what, _ in loaded.urls() if what == "web pages"] == []


def test_the_local_daemons_metrics_listen_on_loopback(tmp_path):
    """Issue 39 item 15: a local cluster's /metrics listened on 0.0.0.0. What the daemons read:"""
    c = _started(tmp_path, WebConfig(port=51234))
    read = load_config(c.config_path, env={})
    assert (read.controller.metrics_host, read.agent.metrics_host) == ("127.0.0.1", "127.0.0.1")
    # A cluster of many hosts keeps serving every interface, for its Prometheus.
    from hfai.core.config import AgentConfig, ControllerConfig

    assert ControllerConfig().metrics_host == AgentConfig().metrics_host == "0.0.0.0"
