"""``.hfignore``: which files of a workspace stay behind (gitignore syntax, via pathspec)."""

from __future__ import annotations

from pathlib import Path

import pathspec

IGNORE_FILE = ".hfignore"
# Never pushed: the workspace's own marker directory and version-control internals.
ALWAYS_IGNORED = (".hfai/", ".git/")


class Ignore:
    def __init__(self, lines: list[str]):
        self._spec = pathspec.GitIgnoreSpec.from_lines([*ALWAYS_IGNORED, *lines])

    @classmethod
    def load(cls, root: Path) -> Ignore:
        try:
            return cls((root / IGNORE_FILE).read_text().splitlines())
        except FileNotFoundError:
            return cls([])

    def ignored(self, rel: str, is_dir: bool = False) -> bool:
        """Whether the ``/``-separated relative path is ignored (a directory: with a trailing ``/``)."""
        return self._spec.match_file(rel + "/" if is_dir else rel)
