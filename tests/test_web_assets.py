"""hfai-web serves plotly.js from the installed plotly wheel: gzipped, cached by version, 304."""

from __future__ import annotations

import asyncio
import gzip

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from hfai.core.config import Config
from hfai.web import assets
from hfai.web.service import WebService


def test_the_bundle_comes_from_the_installed_wheel_and_its_url_names_the_version():
    path = assets.bundle_path()
    assert path.parts[-3:] == ("plotly", "package_data", "plotly.min.js")
    assert b"plotly.js" in path.read_bytes()[:200]
    assert assets.script_url() == f"/static/plotly-{assets.plotly_version()}.min.js"
    assert "missing" not in assets.script_url()


def test_the_service_sends_it_gzipped_with_an_etag_and_answers_304_to_a_browser_that_has_it():
    service = WebService(Config())

    async def go():
        app = web.Application()
        app.router.add_get(assets.script_url(), service.plotly_js)
        async with TestClient(TestServer(app)) as client:
            r = await client.get(assets.script_url(), headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
            body = await r.read()
            assert r.status == 200 and r.headers["Content-Encoding"] == "gzip"
            assert r.headers["Content-Type"].startswith("application/javascript")
            assert "immutable" in r.headers["Cache-Control"]
            assert gzip.decompress(body) == assets.bundle_path().read_bytes()
            assert len(body) < assets.bundle_path().stat().st_size / 2
            again = await client.get(assets.script_url(), headers={"If-None-Match": r.headers["ETag"]})
            assert again.status == 304
            plain = await client.get(assets.script_url(), headers={"Accept-Encoding": "identity"})
            assert "Content-Encoding" not in plain.headers and await plain.read() == assets.bundle_path().read_bytes()
        await service.assets.close()

    asyncio.run(go())
