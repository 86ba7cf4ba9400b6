"""``.hfignore``: which files of a workspace stay behind (gitignore syntax, via pathspec)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

IGNORE_FILE = ".hfignore"
# Never pushed: the workspace's own marker directory and version-control internals.
ALWAYS_IGNORED = (".hfai/", ".git/")
_ALWAYS_DIRS = frozenset(p.rstrip("/") for p in ALWAYS_IGNORED)


class Ignore:
    def __init__(self, lines: list[str]):
        self._spec: Any = None
        if any(line.strip() and not line.lstrip().startswith("#") for line in lines):
            import pathspec  # a costly import on every push: only for a workspace with its own rules

            self._spec = pathspec.GitIgnoreSpec.from_lines([*ALWAYS_IGNORED, *lines])

    @classmethod
    def load(cls, root: Path) -> Ignore:
        try:
            return cls((root / IGNORE_FILE).read_text().splitlines())
        except FileNotFoundError:
            return cls([])

    @property
    def has_rules(self) -> bool:
        """Whether the workspace has rules of its own: without them only directories are ignored,
        so a walk that does not enter those needs to ask about no file."""
        return self._spec is not None

    def ignored(self, rel: str, is_dir: bool = False) -> bool:
        """Whether the ``/``-separated relative path is ignored (a directory: with a trailing ``/``)."""
        if self._spec is None:  # ALWAYS_IGNORED alone: a directory of that name at any depth
            return any(part in _ALWAYS_DIRS for part in (rel.split("/") if is_dir else rel.split("/")[:-1]))
        return self._spec.match_file(rel + "/" if is_dir else rel)
