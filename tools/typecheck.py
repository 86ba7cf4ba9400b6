"""Run mypy on the ``hfai`` packages as they are installed, not as folders.

mypy cannot see the folder-to-package mapping of the editable install (tools/layout.py), so this
script builds the installed layout under ``.mypy_cache/tree``, runs mypy there with the
``[tool.mypy]`` settings of pyproject.toml, and prints the paths in mypy's report as repository
paths again.

    python tools/typecheck.py [MYPY_ARGS...]     # e.g. -p hfai.cli to check one package

Exit status: mypy's.
"""

from __future__ import annotations

import os
import subprocess
import sys

from layout import ROOT, build_tree


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
