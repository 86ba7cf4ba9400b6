"""Development sessions end to end on one local cluster (nats-server, controller, agent, hfai-web as
processes, real credentials) with a real JupyterLab and real headless Chromium: alice starts a
session with ``hfai dev start``, reaches it only through hfai-web's proxy on her sign-in, runs
notebook cells over the kernel's WebSocket through the proxy (one prints, one runs ``hfai ps`` as
her), saves the notebook, stops and starts the session and finds it again; bob gets 403 on her
session's page and WebSocket; a stopped session's URL says it is stopped. Screenshots go to the
test's tmp dir."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import urllib.parse
import uuid
from pathlib import Path

import pytest
from browser import chromium
from ports import free_port
from spine_cluster import Cluster

from hfai.core.config import WebConfig
from hfai.protocol.types import JOB_DEV, ChainState

pytestmark = pytest.mark.slow

aiohttp = pytest.importorskip("aiohttp")
pytest.importorskip("jupyterlab")



@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("dev")
    overrides = {"HFAI_AGENT_METRICS_PORT": "-1", "HFAI_DEV_NOTEBOOKS_ROOT": str(root / "jupyter")}
    old = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)  # the daemons inherit them; the session reads [dev] through them
    try:
        c = Cluster(root / "cluster", nodes=1)
        c.local.web = WebConfig(port=free_port(), poll_s=0.3)
        c.shots = root / "screenshots"  # type: ignore[attr-defined]
        c.shots.mkdir()  # type: ignore[attr-defined]
        c.notebooks = root / "jupyter"  # type: ignore[attr-defined]
        with c:
            c.wait(lambda: _run(_status(c, "/healthz")) == 200, 30, "hfai-web to answer")
            yield c
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _base(c: Cluster) -> str:
    assert c.local.web is not None
    return f"http://127.0.0.1:{c.local.web.port}"


def _run(coro):
    return asyncio.run(coro)


async def _status(c: Cluster, path: str, cookie: str = "") -> int:
    try:
        async with aiohttp.ClientSession() as s, s.get(_base(c) + path, headers={"Cookie": cookie},
                                                       allow_redirects=False) as r:
            return r.status
    except aiohttp.ClientError:
        return 0


async def _sign_in(c: Cluster, user: str) -> str:
    form = {"creds": c.creds(user).read_text()}
    async with aiohttp.ClientSession() as s, s.post(_base(c) + "/login", data=form, allow_redirects=False) as r:
        assert r.status == 302, r.status
        return f"hfai_session={r.cookies['hfai_session'].value}"


def _dev_job(c: Cluster, name: str, user: str = "alice"):
    jobs = c.run(lambda api: api.list(), user=user)
    live = [j for j in jobs if j.spec.kind == JOB_DEV and j.spec.name == name and not j.state.final]
    return live[0] if live else None


def _start(c: Cluster, name: str) -> str:
    r = c.cli("dev", "start", "--name", name, user="alice")
    assert r.returncode == 0, r.stderr
    job = _dev_job(c, name)
    assert job is not None and f"/dev/{job.id}/" in r.stdout
    c.wait_state(job.id, ChainState.RUNNING)
    return job.id


class Lab:
    """JupyterLab's REST and kernel WebSocket API through hfai-web, as one signed-in browser."""

    def __init__(self, c: Cluster, job_id: str, cookie: str):
        self.base, self.prefix, self.cookie = _base(c), f"/dev/{job_id}", cookie

    def session(self):
        return aiohttp.ClientSession(headers={"Cookie": self.cookie})

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session() as s, s.get(self.base + self.prefix + path, allow_redirects=False) as r:
            return r.status, await r.text()

    async def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        async with self.session() as s, s.request(method, self.base + self.prefix + path, json=body) as r:
            text = await r.text()
            return r.status, json.loads(text) if text and r.content_type == "application/json" else {}

    async def execute(self, kernel: str, code: str) -> str:
        """Run ``code`` in the kernel over its WebSocket; what it printed."""
        url = self.base.replace("http", "ws") + f"{self.prefix}/api/kernels/{kernel}/channels"
        async with self.session() as s, s.ws_connect(url) as ws:
            msg_id = uuid.uuid4().hex
            await ws.send_str(json.dumps({
                "header": {"msg_id": msg_id, "username": "alice", "session": uuid.uuid4().hex,
                           "msg_type": "execute_request", "version": "5.3"},
                "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                            "allow_stdin": False, "stop_on_error": True}}))
            out = []
            async with asyncio.timeout(60):
                async for m in ws:
                    msg = json.loads(m.data)
                    if msg.get("parent_header", {}).get("msg_id") != msg_id:
                        continue
                    if msg["msg_type"] == "stream":
                        out.append(msg["content"]["text"])
                    elif msg["msg_type"] == "error":
                        out.append("\n".join(msg["content"]["traceback"]))
                    elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                        break
            return "".join(out)


def _notebook(cells: list[tuple[str, str]]) -> dict:
    return {"type": "notebook", "format": "json", "content": {
        "nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        "cells": [{"cell_type": "code", "id": uuid.uuid4().hex[:8], "metadata": {}, "execution_count": i + 1,
                   "source": src, "outputs": [{"output_type": "stream", "name": "stdout", "text": out}]}
                  for i, (src, out) in enumerate(cells)]}}


def _browser_shots(c: Cluster, job_id: str, tmp: Path) -> None:
    """Sign in through the page in Chromium, see the session's Open button, load JupyterLab."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium(tmp / "profile")
    try:
        driver.get(_base(c) + "/login")
        driver.execute_script("document.getElementById('creds').value=arguments[0]", c.creds("alice").read_text())
        driver.find_element(By.ID, "sign-in").click()
        # The page redraws its rows as it polls: an element found may be gone by the next call.
        link = WebDriverWait(driver, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "a.open") and d.find_element(By.CSS_SELECTOR, "a.open")
            .get_attribute("href"))
        assert link.endswith(f"/dev/{job_id}/")
        driver.save_screenshot(str(c.shots / "jobs-open-button.png"))  # type: ignore[attr-defined]
        driver.get(link + "lab/tree/hello.ipynb")
        WebDriverWait(driver, 90).until(ec.presence_of_element_located((By.CSS_SELECTOR, ".jp-Notebook")))
        WebDriverWait(driver, 60).until(lambda d: "hello from alice" in d.page_source)
        driver.save_screenshot(str(c.shots / "jupyterlab-notebook.png"))  # type: ignore[attr-defined]
        assert "token" not in urllib.parse.urlparse(driver.current_url).query
    finally:
        driver.quit()


def test_a_session_through_the_proxy_keeps_its_notebook_and_is_alices_alone(cluster, tmp_path):
    c = cluster
    alice, bob = _run(_sign_in(c, "alice")), _run(_sign_in(c, "bob"))
    job_id = _start(c, "lab")

    # One session at a time ([dev] max_per_user = 1), refused at submit with a clear error.
    again = c.cli("dev", "start", "--name", "lab2", user="alice")
    assert again.returncode != 0 and "already has 1 development session" in again.stderr
    listed = c.cli("dev", "list", "--json", user="alice")
    assert [s["id"] for s in json.loads(listed.stdout)["sessions"]] == [job_id]

    lab = Lab(c, job_id, alice)
    c.wait(lambda: _run(lab.get("/api/status"))[0] == 200, 90, "JupyterLab to answer through the proxy")
    status, page = _run(lab.get("/lab"))
    assert status == 200 and "JupyterLab" in page
    where = c.run(lambda api: api.status(job_id), user="alice")
    assert where.nodes

    # bob: 403 on the page, the API and the kernel WebSocket (no JupyterLab byte reaches him).
    bobs = Lab(c, job_id, bob)
    status, text = _run(bobs.get("/lab"))
    assert status == 403 and "only its owner" in text
    assert _run(bobs.get("/api/contents"))[0] == 403

    async def bob_ws() -> int:
        async with bobs.session() as s:
            try:
                async with s.ws_connect(bobs.base.replace("http", "ws") + f"{bobs.prefix}/api/kernels/x/channels"):
                    return 101
            except aiohttp.WSServerHandshakeError as e:
                return e.status
    assert _run(bob_ws()) == 403
    assert _run(_status(c, f"/dev/{job_id}/lab")) == 302  # not signed in: to the sign-in page

    # Cells through the kernel's WebSocket, through the proxy.
    status, kernel = _run(lab.call("POST", "/api/kernels", {"name": "python3"}))
    assert status == 201, kernel
    printed = _run(lab.execute(kernel["id"], "print('hello from alice')"))
    assert printed == "hello from alice\n"
    ps = _run(lab.execute(kernel["id"], "import subprocess\n"
                                        "r = subprocess.run(['hfai', 'ps'], capture_output=True, text=True)\n"
                                        "print(r.returncode, r.stdout, r.stderr)"))
    assert ps.startswith("0 ") and job_id in ps and "lab" in ps, ps
    status, saved = _run(lab.call("PUT", "/api/contents/hello.ipynb",
                                  _notebook([("print('hello from alice')", printed), ("!hfai ps", ps)])))
    assert status in (200, 201), saved
    nb_dir = c.notebooks / "alice" / "notebooks"  # type: ignore[attr-defined]
    assert (nb_dir / "hello.ipynb").is_file()
    assert stat.S_IMODE(nb_dir.stat().st_mode) == 0o700 and stat.S_IMODE(nb_dir.parent.stat().st_mode) == 0o700

    _browser_shots(c, job_id, tmp_path)

    # Stopped: its URL says so (not a 502); the notebook outlives it.
    r = c.cli("dev", "stop", "lab", user="alice")
    assert r.returncode == 0, r.stderr
    c.wait(lambda: c.job(job_id).state.final, 60, "the session to end")
    status, text = _run(lab.get("/lab"))
    assert status == 410 and "Session stopped" in text

    second = _start(c, "lab")
    assert second != job_id
    lab2 = Lab(c, second, alice)
    c.wait(lambda: _run(lab2.get("/api/status"))[0] == 200, 90, "the new session to answer")
    status, nb = _run(lab2.call("GET", "/api/contents/hello.ipynb"))
    assert status == 200 and "hello from alice" in json.dumps(nb["content"])
    assert c.cli("dev", "stop", second, user="alice").returncode == 0
