"""``ffrecord.package``: packed folders (a tree of small files in one ffrecord file).

:class:`PackedFolder` reads one by path; :func:`pack_folder` ``(folder, out_file, verbose=False)``
writes one. Both are :mod:`hfai.data.packed`'s: the index is unpickled with an unpickler that can
only build plain containers.
"""

from hfai.data.packed import MAGIC as MAGIC_BYTES
from hfai.data.packed import PackedFolder, pack_folder

__all__ = ["MAGIC_BYTES", "PackedFolder", "pack_folder"]
