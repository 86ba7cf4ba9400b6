"""Check the layer contract (pyproject.toml's ``[tool.importlinter]``) with import-linter.

import-linter's graph (grimp) reads the packages as installed, not as folders, so this script lays
out the installed tree under ``build/layers/tree`` (tools/layout.py) and runs ``lint-imports``
there. It first checks that the runtime contract names every top-level module of runtime/: a new
module left out of it would go unchecked.

    python tools/importlint.py [--root REPO] [LINT_IMPORTS_ARGS...]

``--root``: check another copy of the repository (the tests inject an upward import into one).
Exit status: lint-imports' (0: every contract kept), or 2 when the contract misses a module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from layout import ROOT, build_tree, package_dirs

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

RUNTIME_CONTRACT = "The runtime and compat/ import no daemon nor the CLI"


def runtime_modules(root: Path) -> set[str]:
    """hfai's modules and packages in the runtime folder (``hfai.core.config``, ``hfai.data``, ...)."""
    found = set()
    for entry in (root / package_dirs(root)["hfai"]).iterdir():
        if entry.name.startswith((".", "__")):  # __init__.py is hfai itself (a contract of its own)
            continue
        if entry.suffix == ".py":
            found.add(f"hfai.{entry.stem}")
        elif (entry / "__init__.py").is_file():
            found.add(f"hfai.{entry.name}")
    return found


def missing_from_contract(root: Path) -> set[str]:
    contracts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [runtime] = [c for c in contracts if c["name"] == RUNTIME_CONTRACT]
    return runtime_modules(root) - set(runtime["source_modules"])


def main(argv: list[str]) -> int:
    root = ROOT
    if argv[:1] == ["--root"]:
        root, argv = Path(argv[1]).resolve(), argv[2:]
    missing = missing_from_contract(root)
    if missing:
        print(f"importlint: add {', '.join(sorted(missing))} to the source_modules of the contract "
              f"{RUNTIME_CONTRACT!r} in pyproject.toml", file=sys.stderr)
        return 2
    tree = root / "build" / "layers" / "tree"
    build_tree(tree, root)
    lint_imports = Path(sys.executable).parent / "lint-imports"
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [str(lint_imports), str(root / "pyproject.toml"), "--no-cache", "--no-logo", *argv]
    return subprocess.run(cmd, cwd=tree, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
