"""Run mypy on the ``hfai`` packages as they are installed, not as folders.

The repository root maps its folders onto one import package (pyproject.toml's
``[tool.setuptools.package-dir]``: runtime/ -> hfai, protocol/ -> hfai.protocol, ...). An editable
install serves that mapping through an import hook, which mypy cannot see, so this script builds
the installed layout as a tree of symbolic links under ``.mypy_cache/tree`` (rebuilt on every run,
so new files are seen at once; nothing to reinstall), runs mypy there with the ``[tool.mypy]``
settings of pyproject.toml, and prints the paths in mypy's report as repository paths again.

    python tools/typecheck.py [MYPY_ARGS...]     # e.g. -p hfai.cli to check one package

Exit status: mypy's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: mypy itself depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def build_tree(tree: Path) -> dict[str, str]:
    """Recreate ``tree`` as the installed import layout; returns {tree path prefix: repo prefix}."""
    package_dir: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    shutil.rmtree(tree, ignore_errors=True)
    prefixes: dict[str, str] = {}
    # Parents first, so that a subpackage's link replaces whatever its parent's folder holds there.
    for name in sorted(package_dir, key=lambda n: n.count(".")):
        dest = tree.joinpath(*name.split("."))
        src = ROOT / package_dir[name]
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
                raise SystemExit(f"typecheck: cannot lay out {name} inside a linked package folder")
            if dest.is_symlink():
                dest.unlink()
            dest.symlink_to(src, target_is_directory=True)
        prefixes[str(dest) + os.sep] = package_dir[name] + "/"
    return prefixes


def main(argv: list[str]) -> int:
    cache = ROOT / ".mypy_cache"
    tree = cache / "tree"
    prefixes = build_tree(tree)
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
           "--cache-dir", str(cache), *argv]
    proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    # Longest prefix first: hfai/nn/ before hfai/.
    ordered = sorted(prefixes.items(), key=lambda kv: -len(kv[0]))
    relative = sorted(((os.path.relpath(k, tree) + os.sep, v) for k, v in prefixes.items()),
                      key=lambda kv: -len(kv[0]))
    for stream, text in ((sys.stdout, proc.stdout), (sys.stderr, proc.stderr)):
        for line in text.splitlines(keepends=True):
            for old, new in (*ordered, *relative):
                if line.startswith(old):
                    line = new + line[len(old):]
                    break
            stream.write(line)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
