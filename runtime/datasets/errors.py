"""The exceptions ``hfai.datasets`` raises on purpose, under :class:`hfai.data.DataError`.

Each says what went wrong and what to do: a dataset that is not there names the path looked in
and the ``hfai data convert`` command that makes it; a missing third-party package is named with
the ``pip install`` that brings it.
"""

from __future__ import annotations

from hfai.data.errors import DataError


class DatasetError(DataError):
    """Base class of the errors of ``hfai.datasets``."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """A dataset (or one split of it) is not under the data directory."""

    def __init__(self, name: str, path: object, how: str):
        self.name = name
        self.path = str(path)
        super().__init__(
            f"dataset {name} not found at {self.path} (data directory from HFAI_DATASETS_DIR or "
            f"hfai.datasets.set_data_dir()); make it with: {how}"
        )


class MissingPackageError(DatasetError, ImportError):
    """A dataset or converter needs a third-party package that is not installed."""

    def __init__(self, package: str, what: str, pip_name: str | None = None):
        self.package = package
        super().__init__(f"{what} needs the package {package!r}: pip install {pip_name or package}")


class UnsupportedDatasetError(DatasetError, NotImplementedError):
    """A dataset of the original ``hfai.datasets`` that this platform does not provide."""


class ConvertError(DatasetError, ValueError):
    """The source data of ``hfai data convert`` is missing or malformed; nothing was published."""
