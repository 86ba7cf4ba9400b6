"""hfai-web, /metrics and usage accounting against a real local cluster (nats-server, controller,
agent, hfai-web as processes, real credentials), one cluster for the whole module.

The browser test drives real headless Chromium (Debian's chromium + chromium-driver) through
selenium: skipped with a reason when Chromium is missing, except under CI=true where it fails."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from browser import chromium
from ports import free_port
from spine_cluster import Cluster

from hfai.core.config import WebConfig
from hfai.protocol.types import ChainState, Priority

pytestmark = pytest.mark.slow

STEPS = [sys.executable, str(Path(__file__).parent / "jobs" / "steps.py")]



@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("web")
    old = os.environ.get("HFAI_AGENT_METRICS_PORT")
    os.environ["HFAI_AGENT_METRICS_PORT"] = "-1"  # each agent picks a free port, written to its state dir
    try:
        c = Cluster(root / "cluster", nodes=1, metrics_port=free_port())
        c.local.web = WebConfig(port=free_port(), poll_s=0.3)
        work = root / "work"  # where the jobs keep their progress files
        work.mkdir()
        submit = c.submit
        c.submit = lambda *a, **kw: submit(*a, **{"workdir": work, **kw})  # type: ignore[method-assign]
        with c:
            c.wait(lambda: _get(c, "/healthz")[0] == 200, 30, "hfai-web to answer")
            yield c
    finally:
        if old is None:
            os.environ.pop("HFAI_AGENT_METRICS_PORT", None)
        else:
            os.environ["HFAI_AGENT_METRICS_PORT"] = old


def _url(c: Cluster, path: str) -> str:
    assert c.local.web is not None
    return f"http://127.0.0.1:{c.local.web.port}{path}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _request(c: Cluster, path: str, cookie: str = "", data: bytes | None = None, headers: dict | None = None,
             method: str | None = None) -> tuple[int, bytes, dict]:
    req = urllib.request.Request(_url(c, path), data=data, method=method,
                                 headers={**({"Cookie": cookie} if cookie else {}), **(headers or {})})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=30) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def _get(c: Cluster, path: str, cookie: str = "") -> tuple[int, bytes]:
    try:
        status, body, _ = _request(c, path, cookie)
    except OSError:
        return 0, b""
    return status, body


def sign_in(c: Cluster, user: str) -> str:
    """Sign in as ``user`` with their credentials file; returns the session cookie."""
    form = urllib.parse.urlencode({"creds": c.creds(user).read_text()}).encode()
    status, _body, headers = _request(c, "/login", data=form, method="POST",
                                      headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 302, status
    cookie = headers["Set-Cookie"].split(";")[0]
    assert cookie.startswith("hfai_session=") and "BEGIN" not in headers["Set-Cookie"]
    return cookie


def test_a_session_cannot_stop_or_read_another_users_job(cluster):
    c = cluster
    bobs = c.submit([*STEPS, "100000", "0.05"], name="bobs", user="bob", priority=Priority.NORMAL)
    c.wait_state(bobs.id, ChainState.RUNNING)
    alice, bob = sign_in(c, "alice"), sign_in(c, "bob")

    assert _get(c, "/api/jobs")[0] == 401  # no session
    assert _request(c, "/login", data=b"creds=garbage", method="POST")[0] == 400
    status, body = _get(c, "/api/jobs", alice)
    assert status == 200 and bobs.id.encode() in body  # everyone sees the queue, as with hfai ps

    # bob reads his own log; alice may not, by id or through the download
    c.wait(lambda: b"starts at step" in _get(c, f"/api/jobs/{bobs.id}/logs/0", bob)[1], 30, "bob's log")
    status, body = _get(c, f"/api/jobs/{bobs.id}/logs/0", alice)
    assert status == 403 and b"starts at step" not in body
    status, body = _get(c, f"/jobs/{bobs.id}/logs/0/download", alice)
    assert status == 403 and b"starts at step" not in body

    stop = {"X-Requested-With": "hfai-web"}
    assert _request(c, f"/api/jobs/{bobs.id}/stop", alice, b"", stop, "POST")[0] == 403
    assert _request(c, f"/api/jobs/{bobs.id}/stop", bob, b"", {}, "POST")[0] == 403  # no header: refused
    assert c.job(bobs.id).state is ChainState.RUNNING

    assert _request(c, f"/api/jobs/{bobs.id}/stop", bob, b"", stop, "POST")[0] == 200
    c.wait_state(bobs.id, ChainState.STOPPED)


def _scrape(port: int) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(families: dict, name: str, **labels) -> float | None:
    for family in families.values():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def test_metrics_of_the_controller_and_the_agent_match_the_cluster(cluster):
    c = cluster
    job = c.submit([*STEPS, "100000", "0.05"], name="metered", priority=Priority.LOW)
    c.wait_state(job.id, ChainState.RUNNING)

    def jobs_match():
        by_state = {}
        for j in c.run(lambda api: api.list()):
            by_state[j.state.value] = by_state.get(j.state.value, 0) + 1
        m = _scrape(c.local.controller.metrics_port)
        got = {s: _value(m, "hfai_jobs", state=s) for s in by_state}
        return got == {s: float(n) for s, n in by_state.items()} and m

    m = c.wait(jobs_match, 30, "hfai_jobs to match the API's job list")
    assert _value(m, "hfai_jobs", state="running") == 1.0
    assert _value(m, "hfai_nodes", state="up") == 1.0
    # The histograms are fed by a scan of the records every second.
    m = c.wait(lambda: _value(m2 := _scrape(c.local.controller.metrics_port),
                              "hfai_job_submit_to_running_seconds_count") >= 1 and m2, 10, "submit->running observed")
    assert _value(m, "hfai_scheduling_round_seconds_count") > 0
    assert _value(m, "hfai_nats_reconnects_total") == 0.0

    port = int((c.local.root / "agents" / "node-0" / "metrics_port").read_text())
    a = _scrape(port)
    utils = [s for s in a["hfai_gpu_utilization_ratio"].samples if s.labels["node"] == "node-0"]
    assert len(utils) == 8 and all(0.0 <= s.value <= 1.0 for s in utils)
    assert _value(a, "hfai_gpu_memory_total_bytes", node="node-0", gpu="0") > 0
    # As of the agent's last heartbeat (every 0.5 s here): the run shows from the next one on.
    c.wait(lambda: _value(_scrape(port), "hfai_node_runs", node="node-0") == 1.0, 10, "the run in hfai_node_runs")
    c.run(lambda api: api.stop(job.id))
    c.wait_state(job.id, ChainState.STOPPED)


def test_usage_outlives_the_purged_job_record(cluster):
    c = cluster
    job = c.submit([*STEPS, "4", "0.1"], name="short", user="carol")
    c.wait_state(job.id, ChainState.SUCCEEDED)

    def carol_rows():
        out = c.cli("usage", "--csv", "--user", "carol", user="carol")
        assert out.returncode == 0, out.stderr
        return [line for line in out.stdout.splitlines()[1:] if ",carol," in line] or None

    rows = c.wait(carol_rows, 30, "carol's run in hfai usage")
    assert len(rows) == 1 and rows[0].endswith(",1") and float(rows[0].split(",")[4]) > 0

    nc_creds = str(c.service_creds())

    async def with_js(act):
        from hfai.core import nats as _nats

        nc = await _nats.connect(c.config, "test-purge", reconnect=False, creds=nc_creds)
        try:
            return await act(nc.jetstream())
        finally:
            await nc.close()

    async def stored(js):
        try:
            return await (await js.key_value("hfai_usage")).get(f"{job.id}.1")
        except Exception:
            return None

    async def purge(js):
        await (await js.key_value("hfai_jobs")).purge(job.id)

    # The controllers copy ended runs every usage_interval_s; the retention purge comes far later.
    c.wait(lambda: asyncio.run(with_js(stored)), 30, "the run to be stored in hfai_usage")
    asyncio.run(with_js(purge))
    c.wait(lambda: job.id not in {j.id for j in c.run(lambda api: api.list())}, 10, "the record to be gone")
    assert carol_rows() == rows  # the GPU-hours stayed in hfai_usage
    table = c.cli("usage", user="carol")
    assert table.returncode == 0 and "carol" in table.stdout and "GPU-HOURS" in table.stdout
    bad = c.cli("usage", "--days", "0", user="carol")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr


# ----------------------------------------------------------------------------- the browser

def test_browser_sign_in_watch_suspend_logs_stop_and_gpu_chart(cluster, tmp_path):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    c = cluster
    shots = tmp_path / "screenshots"
    shots.mkdir()
    print(f"screenshots in {shots}")
    d = chromium(shots / "profile")
    # The pages re-render their rows at every poll: an element found a moment ago may be gone.
    wait = WebDriverWait(d, 60, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,))

    def click_link(text: str) -> bool:
        d.find_element(By.LINK_TEXT, text).click()
        return True

    def row_state(job_id: str) -> str | None:
        rows = d.find_elements(By.CSS_SELECTOR, f"tr[data-id='{job_id}']")
        return rows[0].get_attribute("data-state") if rows else None

    try:
        d.get(_url(c, "/login"))
        d.find_element(By.ID, "creds").send_keys(c.creds("tester").read_text())
        d.save_screenshot(str(shots / "1-sign-in.png"))
        d.find_element(By.ID, "sign-in").click()
        try:
            wait.until(lambda _d: d.find_elements(By.ID, "who") and d.find_element(By.ID, "who").text == "tester")
        except Exception:
            d.save_screenshot(str(shots / "1-sign-in-failed.png"))
            raise AssertionError(f"sign-in failed: {d.current_url} {d.page_source[:3000]}") from None

        low = c.submit([*STEPS, "100000", "0.05"], name="pretrain", priority=Priority.LOW)
        wait.until(lambda _d: row_state(low.id) == "running")
        d.save_screenshot(str(shots / "2-jobs-running.png"))

        # Its steps counted in windows of 1 s (the default 20 s would outlast the page's waits).
        high = c.submit([*STEPS, "100000", "0.05"], name="urgent", priority=Priority.HIGH,
                        env={"HFAI_THROUGHPUT_INTERVAL_S": "1"})
        wait.until(lambda _d: row_state(low.id) == "suspended")
        wait.until(lambda _d: row_state(high.id) == "running")
        d.save_screenshot(str(shots / "3-jobs-suspended.png"))

        wait.until(lambda _d: click_link("pretrain"))
        wait.until(lambda _d: "suspending at step" in d.find_element(By.ID, "log").text)
        assert d.find_element(By.ID, "state").text == "suspended"
        assert "suspending" in d.find_element(By.ID, "history").text
        # Its first run ended: what it used, from the run's cgroup (compute containers).
        wait.until(lambda _d: "peak memory" in d.find_element(By.ID, "meta").text)
        assert "MiB" in d.find_element(By.ID, "meta").text or "GiB" in d.find_element(By.ID, "meta").text
        d.save_screenshot(str(shots / "4-job-logs.png"))

        d.get(_url(c, f"/jobs/{high.id}"))
        wait.until(lambda _d: d.find_element(By.ID, "state").text == "running")
        # Its log watchdog: the cluster's default time, and how long it has been silent.
        wait.until(lambda _d: "watchdog 30 min, silent for " in d.find_element(By.ID, "meta").text)
        assert " on node-0 at " in d.find_element(By.ID, "meta").text
        # Its steps/s where it ran, and how busy its node's GPUs were meanwhile, one line a size
        # under their own label (a rigid job's: nothing said of growing).
        wait.until(lambda _d: "GPUs" in d.find_element(By.ID, "throughput").text)
        measured = [li.text for li in d.find_elements(By.CSS_SELECTOR, "#throughput li")]
        assert len(measured) == 1 and re.fullmatch(r"1 node: [\d.]+ steps/s, GPUs \d+% busy", measured[0]), measured
        assert d.find_element(By.ID, "throughput-label").is_displayed()
        d.find_element(By.ID, "stop").click()
        d.switch_to.alert.accept()
        wait.until(lambda _d: d.find_element(By.ID, "state").text == "stopped")
        d.save_screenshot(str(shots / "5-job-stopped.png"))
        assert c.job(high.id).state is ChainState.STOPPED

        d.get(_url(c, "/nodes?node=node-0"))
        wait.until(lambda _d: d.find_elements(By.CSS_SELECTOR, "tr[data-node='node-0']"))
        # Its health: the validator ran at the agent's start (docs/health.md).
        wait.until(lambda _d: "check passed in" in d.find_element(By.CSS_SELECTOR, "tr[data-node='node-0']").text)
        # plotly draws one trace per GPU of the picked node (tests/test_web_pages.py checks the labels)
        wait.until(lambda _d: len(d.find_elements(By.CSS_SELECTOR, "#gpu-util .scatterlayer .trace")) == 8)
        d.save_screenshot(str(shots / "6-nodes.png"))

        d.get(_url(c, "/cluster"))
        wait.until(lambda _d: "nodes" in d.find_element(By.ID, "summary").text)
        d.save_screenshot(str(shots / "7-cluster.png"))
        d.get(_url(c, "/usage"))
        wait.until(lambda _d: d.find_elements(By.CSS_SELECTOR, "#rows tr"))
        d.save_screenshot(str(shots / "8-usage.png"))
    finally:
        d.quit()
    assert len(list(shots.glob("*.png"))) == 8
