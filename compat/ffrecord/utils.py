"""``ffrecord.utils``: ``dump(dataset, fname, nfiles, verbose=False)`` (see :func:`hfai.data.dump.dump`)."""

from hfai.data.dump import dump

__all__ = ["dump"]
