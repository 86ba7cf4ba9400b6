"""The charting library, served by hfai-web itself from the installed plotly wheel (clusters are
intranet-only: no CDN). The wheel ships the plotly.js bundle as package data; the Python package
is never imported (its import pulls in narwhals and more, and the service needs none of it).

The bundle is read and gzipped once, on first request, off the event loop, and served with a
versioned URL so browsers may keep it: 4.8 MB as shipped, about 1.4 MB gzipped."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from hfai.protocol.errors import Unavailable

BUNDLE = ("package_data", "plotly.min.js")


def bundle_path() -> Path:
    """Where the installed plotly wheel keeps plotly.min.js; Unavailable (with the fix) if not there."""
    spec = importlib.util.find_spec("plotly")
    for where in (spec.submodule_search_locations or []) if spec else []:
        path = Path(where).joinpath(*BUNDLE)
        if path.is_file():
            return path
    raise Unavailable("the charts need the plotly package on the hfai-web host: pip install 'plotly>=5.20' "
                      "(hfai-web serves the plotly.js bundle its wheel ships)")


def plotly_version() -> str:
    try:
        return importlib.metadata.version("plotly")
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def script_url() -> str:
    """The bundle's URL; it names the plotly version, so a cached copy is never a stale one."""
    return f"/static/plotly-{plotly_version()}.min.js"


@dataclass(frozen=True)
class Asset:
    raw: bytes
    gzipped: bytes
    etag: str


class Assets:
    """The bundle, loaded once (concurrent first requests share the load)."""

    def __init__(self) -> None:
        self._task: asyncio.Task[Asset] | None = None

    async def plotly(self) -> Asset:
        if self._task is None:
            self._task = asyncio.ensure_future(asyncio.to_thread(_load, bundle_path()))
        try:
            return await asyncio.shield(self._task)
        except OSError as e:
            self._task = None  # e.g. removed or reinstalled meanwhile: try again at the next request
            raise Unavailable(f"cannot read the plotly.js bundle: {e}") from e

    async def close(self) -> None:
        """Wait for a load still under way (a thread cannot be cancelled); safe to call twice."""
        if self._task is not None and not self._task.done():
            await asyncio.wait([self._task])


def _load(path: Path) -> Asset:
    raw = path.read_bytes()
    return Asset(raw=raw, gzipped=gzip.compress(raw, compresslevel=6, mtime=0),
                 etag='"' + hashlib.sha256(raw).hexdigest()[:32] + '"')
