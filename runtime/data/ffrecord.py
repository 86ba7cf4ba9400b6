"""Drop-in names for scripts written against HFAiLab's ``ffrecord`` package.

``from hfai.data import ffrecord`` then ``ffrecord.FileReader(...)``/``ffrecord.FileWriter(...)``
behave like the originals (same file format, same method names), minus their known defects.
"""

from hfai.data.packed import PackedFolder, pack_folder
from hfai.data.reader import FileReader
from hfai.data.writer import FileWriter, MultiFileWriter

__all__ = ["FileReader", "FileWriter", "MultiFileWriter", "PackedFolder", "pack_folder"]
