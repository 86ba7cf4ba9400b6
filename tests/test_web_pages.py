"""Every page of hfai-web in real headless Chromium at 1 and 64 nodes (issue 24, "The pages").

A real cluster (nats-server, controller, hfai-web; the nodes are a fleet of real agents in one
process) goes through a preemption and a resume, so the time-sharing timeline has something to
show. Then Chromium signs in as alice and, on every page, takes a full-page screenshot (saved in
the test's tmp dir and, if HFAI_SCREENSHOT_DIR is set, copied there) and checks in the DOM that
each chart has a title, titled axes and a legend (or a titled colour bar): not only that it exists.
Skipped without Chromium, except under CI=true (see tests/test_web_live.py)."""

from __future__ import annotations

import base64
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from browser import chromium
from ports import free_port
from spine_cluster import Cluster

from hfai.agent import fleet
from hfai.auth.roles import Role
from hfai.core.config import WebConfig
from hfai.protocol.types import ChainState, NodeState, Priority

pytestmark = pytest.mark.slow

STEPS = [sys.executable, str(Path(__file__).parent / "jobs" / "steps.py")]

# Per chart: its title, axis titles, legend entries and colour-bar titles, as plotly drew them.
CHARTS_JS = """
return [...document.querySelectorAll('.js-plotly-plot')].map(p=>{
  const texts=sel=>[...p.querySelectorAll(sel)].map(t=>t.textContent.trim()).filter(t=>t);
  const cls=re=>[...p.querySelectorAll('text')].filter(t=>re.test(t.getAttribute('class')||''))
    .map(t=>t.textContent.trim()).filter(t=>t);
  return {id:p.id, title:cls(/^gtitle$/), x:cls(/^x\\d*title$/), y:cls(/^y\\d*title$/),
          legend:texts('.legend .legendtext'), colorbar:texts('.colorbar .cbtitle text')};});
"""



class Site:
    def __init__(self, cluster: Cluster, size: int, jobs: dict):
        self.c, self.size, self.jobs = cluster, size, jobs

    def url(self, path: str) -> str:
        assert self.c.local.web is not None
        return f"http://127.0.0.1:{self.c.local.web.port}{path}"


def _interrupt_and_resume(c: Cluster, size: int, work: Path) -> dict:
    """One of alice's LOW jobs is preempted by bob's HIGH one, which is then stopped, so hers resumes."""
    quarter = max(1, size // 4)
    run = [*STEPS, "100000", "0.1"]
    jobs = {"pretrain": c.submit(run, name="pretrain", nodes=quarter, priority=Priority.LOW, user="alice",
                                 workdir=work)}
    if size > 1:
        jobs["ablation"] = c.submit(run, name="ablation", nodes=quarter, priority=Priority.LOW, user="alice",
                                    workdir=work)
        jobs["eval"] = c.submit(run, name="eval", nodes=max(1, size // 8), priority=Priority.NORMAL, user="bob",
                                workdir=work)
    for j in jobs.values():
        c.wait_state(j.id, ChainState.RUNNING, timeout=120)
    # HIGH needs more nodes than are free: a LOW job gives way (alice's, alone at 1 node).
    free = size - sum(j.spec.nodes for j in jobs.values())
    urgent = c.submit(run, name="urgent", nodes=min(size, free + quarter), priority=Priority.HIGH, user="bob",
                      workdir=work)
    c.wait_state(urgent.id, ChainState.RUNNING, timeout=120)
    time.sleep(3)  # pacing, not a check: its run then shows as a bar and has telemetry
    c.run(lambda api: api.stop(urgent.id), user="bob")
    c.wait_state(urgent.id, ChainState.STOPPED, timeout=60)
    resumed = c.wait(lambda: [j for j in jobs.values() if c.job(j.id).run_id == 2
                              and c.job(j.id).state is ChainState.RUNNING], 120, "the preempted job to resume")
    return {**{k: c.job(j.id) for k, j in jobs.items()}, "urgent": c.job(urgent.id), "resumed": c.job(resumed[0].id)}


@pytest.fixture(scope="module", params=[1, 64], ids=["1-node", "64-nodes"])
def site(request, tmp_path_factory):
    size = request.param
    root = tmp_path_factory.mktemp(f"pages{size}")
    c = Cluster(root / "cluster", nodes=0)
    c.local.web = WebConfig(port=free_port(), poll_s=1.0 if size > 1 else 0.5)
    work = root / "work"
    work.mkdir()
    with c:
        nodes = fleet.node_names(0, size)
        for n in nodes:
            c.local.service_creds(n, Role.AGENT)
        proc = fleet.spawn(c.local.config_path, size, 0, c.local.root / "agents", c.local.root / "auth" / "creds",
                           c.local.root / "logs" / "fleet.log")
        try:
            c.wait(lambda: sum(i.state is NodeState.UP for i in c.run(lambda api: api.nodes())) == size, 120,
                   f"{size} agents up")
            jobs = _interrupt_and_resume(c, size, work)
            yield Site(c, size, jobs)
            for j in jobs.values():
                if not c.job(j.id).state.final:
                    c.run(lambda api, jid=j.id: api.stop(jid), user="root")
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except Exception:
                proc.kill()
                proc.wait()


class Shots:
    """Full-page screenshots, kept in the test's tmp dir and copied to HFAI_SCREENSHOT_DIR if set."""

    def __init__(self, driver, where: Path, prefix: str):
        self.d, self.where, self.prefix = driver, where, prefix
        self.where.mkdir(parents=True, exist_ok=True)
        self.taken: list[Path] = []

    def take(self, name: str) -> Path:
        height = self.d.execute_script("return Math.ceil(document.documentElement.scrollHeight)")
        shot = self.d.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": 1400, "height": min(int(height), 9000), "scale": 1}})
        path = self.where / f"{self.prefix}-{name}.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        self.taken.append(path)
        out = os.environ.get("HFAI_SCREENSHOT_DIR")
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(out) / path.name)
        return path


def _charts(d, wait, ids: list[str]) -> dict:
    """Wait until plotly drew the charts ``ids``, then each one's texts (see CHARTS_JS)."""
    def drawn():
        got = {c["id"]: c for c in d.execute_script(CHARTS_JS)}
        return got if set(ids) <= set(got) and all(got[i]["x"] for i in ids) else None

    return wait.until(lambda _d: drawn())


def _assert_readable(charts: dict) -> None:
    for cid, c in charts.items():
        assert c["title"], f"chart {cid} has no title: {c}"
        assert c["x"] and c["y"], f"chart {cid} has an unlabelled axis: {c}"
        assert c["legend"] or c["colorbar"], f"chart {cid} has no legend: {c}"


def test_every_page_in_chromium_with_labelled_charts(site, tmp_path):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    c, n = site.c, site.size
    d = chromium(tmp_path / "profile", hide_scrollbars=True)
    wait = WebDriverWait(d, 60, poll_frequency=0.25, ignored_exceptions=(StaleElementReferenceException,))
    shots = Shots(d, tmp_path / "screenshots", f"{n}-node{'s' if n > 1 else ''}")
    print(f"screenshots in {shots.where}")
    resumed, urgent = site.jobs["resumed"], site.jobs["urgent"]
    try:
        d.get(site.url("/login"))
        d.find_element(By.ID, "creds").send_keys(c.creds("alice").read_text())
        shots.take("1-sign-in")
        d.find_element(By.ID, "sign-in").click()
        wait.until(lambda _d: d.find_elements(By.CSS_SELECTOR, f"tr[data-id='{resumed.id}']"))
        shots.take("2-jobs")

        # The cluster: its figures and the time-sharing timeline with the preemption marked.
        d.get(site.url("/cluster"))
        charts = _charts(d, wait, ["charts", "timeline"])
        _assert_readable(charts)
        legend = charts["timeline"]["legend"]
        assert any(resumed.spec.name in t for t in legend) and any("urgent" in t for t in legend), legend
        assert {"preempted", "suspend acknowledged", "resumed"} <= set(legend), legend
        # No quota set: the table says so and shows the use, it is not an empty table.
        wait.until(lambda _d: "no limit" in d.find_element(By.ID, "quotas").text)
        assert "No quotas are set" in d.find_element(By.ID, "quota-note").text
        shots.take("3-cluster")

        # The nodes: one heat-map row per node, memory next to utilisation, job names linking to them.
        d.get(site.url("/nodes"))
        charts = _charts(d, wait, ["heat-util", "heat-mem", "gpu-util", "gpu-mem"])
        _assert_readable(charts)
        assert len(charts["gpu-util"]["legend"]) == 8  # one line per GPU of the picked node
        wait.until(lambda _d: d.find_elements(By.CSS_SELECTOR, f"#nodes a[href='/jobs/{resumed.id}']"))
        # The rows are re-made at every poll: read one inside the wait, which retries a stale one.
        row = wait.until(lambda _d: d.find_element(By.CSS_SELECTOR, f"tr[data-node='{resumed.nodes[0]}']").text)
        assert resumed.spec.name in row and "GiB" in row
        assert len(d.find_elements(By.CSS_SELECTOR, "#nodes tr")) == n
        shots.take("4-nodes")

        # alice's own job: its name in the heading, timeline, GPUs, node links, Stop and logs.
        d.get(site.url(f"/jobs/{resumed.id}"))
        charts = _charts(d, wait, ["timeline", "job-util", "job-mem"])
        _assert_readable(charts)
        assert resumed.spec.name in d.find_element(By.TAG_NAME, "h1").text
        assert {"preempted", "resumed"} <= set(charts["timeline"]["legend"])
        wait.until(lambda _d: d.find_elements(By.CSS_SELECTOR, f"#nodes a[href='/nodes?node={resumed.nodes[0]}']"))
        wait.until(lambda _d: "starts at step" in d.find_element(By.ID, "log").text)
        assert d.find_element(By.ID, "stop").is_displayed()
        shots.take("5-job-own")

        # bob's job, seen by alice: no Stop, no logs to poll, and why.
        d.get(site.url(f"/jobs/{urgent.id}"))
        charts = _charts(d, wait, ["timeline"])
        _assert_readable(charts)
        assert "urgent" in d.find_element(By.TAG_NAME, "h1").text
        assert not d.find_elements(By.ID, "stop") and not d.find_elements(By.ID, "log")
        assert "Only bob and operators" in d.find_element(By.ID, "no-logs").text
        shots.take("6-job-other")

        d.get(site.url("/usage"))
        wait.until(lambda _d: d.find_elements(By.CSS_SELECTOR, "#rows tr"))
        charts = _charts(d, wait, ["chart"])
        _assert_readable(charts)
        assert {"alice", "bob"} <= set(charts["chart"]["legend"])
        shots.take("7-usage")

        # Stop her own job: the answer stays on its line while the page goes on polling.
        d.get(site.url(f"/jobs/{resumed.id}"))
        wait.until(lambda _d: d.find_element(By.ID, "state").text == "running")
        d.find_element(By.ID, "stop").click()
        d.switch_to.alert.accept()
        wait.until(lambda _d: d.find_element(By.ID, "state").text == "stopped")
        polled = d.execute_script("return performance.getEntriesByType('resource').length")
        wait.until(lambda _d: d.execute_script("return performance.getEntriesByType('resource').length") > polled + 2)
        assert d.find_element(By.ID, "action").text == "stop requested"
        shots.take("8-job-stopped")
    finally:
        d.quit()
    assert len(shots.taken) == 8 and all(p.stat().st_size > 10_000 for p in shots.taken)
