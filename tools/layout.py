"""The ``hfai`` packages laid out as installed, for tools that cannot see the folder mapping.

The repository root maps its folders onto one import package (pyproject.toml's
``[tool.setuptools.package-dir]``: runtime/ -> hfai, protocol/ -> hfai.protocol, ...). An editable
install serves that mapping through an import hook, which mypy and import-linter (grimp) cannot
see. :func:`build_tree` recreates the installed layout as a tree of symbolic links (rebuilt on
every run, so new files are seen at once; nothing to reinstall). tools/typecheck.py and
tools/importlint.py run their tool there.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: mypy itself depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def package_dirs(root: Path = ROOT) -> dict[str, str]:
    """{package: folder} from pyproject.toml's ``[tool.setuptools.package-dir]``."""
    return tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def build_tree(tree: Path, root: Path = ROOT) -> dict[str, str]:
    """Recreate ``tree`` as the installed import layout of the repository at ``root``; returns
    {tree path prefix: repo prefix}."""
    package_dir = package_dirs(root)
    shutil.rmtree(tree, ignore_errors=True)
    prefixes: dict[str, str] = {}
    # Parents first, so that a subpackage's link replaces whatever its parent's folder holds there.
    for name in sorted(package_dir, key=lambda n: n.count(".")):
        dest = tree.joinpath(*name.split("."))
        src = root / package_dir[name]
        if name.count(".") == 0:
            # The top package: a real folder whose entries link to the source's entries, so that a
            # subpackage folder mapped elsewhere (hfai.protocol -> protocol/) can sit beside them.
            dest.mkdir(parents=True)
            for entry in src.iterdir():
                if entry.name != "__pycache__":
                    (dest / entry.name).symlink_to(entry)
        else:
            if not dest.parent.resolve().is_relative_to(tree.resolve()):
                # Its parent is itself a link into the repository: never write there.
                raise SystemExit(f"layout: cannot lay out {name} inside a linked package folder")
            if dest.is_symlink():
                dest.unlink()
            dest.symlink_to(src, target_is_directory=True)
        prefixes[str(dest) + os.sep] = package_dir[name] + "/"
    return prefixes
