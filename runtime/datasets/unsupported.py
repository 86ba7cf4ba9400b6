"""Datasets of the original ``hfai.datasets`` that this platform does not provide (yet).

Each is a class with the original's name, so ``from hfai.datasets import OGB`` works and a script
fails where it builds one, with a :class:`~hfai.datasets.errors.UnsupportedDatasetError` that
says what is missing and what to use instead, rather than at import or with a wrong result.
"""

from __future__ import annotations

from typing import Any, NoReturn

from hfai.datasets.errors import UnsupportedDatasetError


def _refuse(name: str, why: str) -> NoReturn:
    raise UnsupportedDatasetError(f"hfai.datasets.{name} is not provided on this platform: {why}")


class OGB:
    """Refused: the OGB graphs need the packages ``ogb`` and ``torch_geometric``."""

    def __init__(self, *args: Any, **kwargs: Any):
        _refuse("OGB", "the Open Graph Benchmark datasets need the packages 'ogb' and 'torch_geometric' "
                "(pip install ogb torch_geometric) and are not converted here; use ogb's own loaders "
                "(ogb.nodeproppred / graphproppred / linkproppred) with root= a local folder")


class NuScenes:
    """Refused: nuScenes needs ``nuscenes-devkit`` and the HDMapNet rasterization."""

    def __init__(self, *args: Any, **kwargs: Any):
        _refuse("NuScenes", "nuScenes needs the package 'nuscenes-devkit' (pip install nuscenes-devkit) and "
                "its map rasterization, which this platform does not ship; use the devkit's loaders")


class ERA5:
    """Refused: no ERA5 converter (OpenCastKit's weather data)."""

    def __init__(self, *args: Any, **kwargs: Any):
        _refuse("ERA5", "no ERA5 converter exists; read your own ffrecord files with hfai.data.FileReader "
                "or subclass hfai.datasets.base.BaseDataset")
