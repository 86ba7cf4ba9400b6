"""``hfai-controller`` / ``python -m hfai.controller``: run one controller replica."""

from __future__ import annotations

import sys

from hfai.core.daemon import run_daemon


def _make(config):
    from hfai.controller.service import Controller

    return Controller(config)


def main(argv: list[str] | None = None) -> int:
    return run_daemon("hfai-controller", "Run one hfai controller replica.", _make, argv)


if __name__ == "__main__":
    sys.exit(main())
