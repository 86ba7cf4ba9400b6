"""``ffrecord``: HFAiLab's ffrecord package as its users import it, served by :mod:`hfai.data`.

``FileReader``, ``FileWriter``, ``checkFsAlign`` (:mod:`ffrecord.fileio`), ``PackedFolder``,
``pack_folder`` (:mod:`ffrecord.package`), ``ffrecord.utils.dump`` and the torch side in
:mod:`ffrecord.torch` (imported separately; ``import ffrecord`` imports no torch). The files are
byte-compatible with the original's. ``ffrecord.PROVIDER == "hfai"`` tells this package from the
original (which has no such name); see ``docs/data.md`` when both are installed.
"""

from ffrecord import utils
from ffrecord.fileio import FileReader, FileWriter, checkFsAlign
from ffrecord.package import PackedFolder, pack_folder
from hfai._version import __version__ as __version__

PROVIDER = "hfai"
"""Which implementation this is (the original ffrecord has no ``PROVIDER``)."""

__all__ = ["FileReader", "FileWriter", "PackedFolder", "checkFsAlign", "pack_folder", "utils"]
