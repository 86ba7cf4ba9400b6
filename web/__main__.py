"""``hfai-web`` / ``python -m hfai.web``: serve the task-management pages."""

from __future__ import annotations

import sys

from hfai.core.daemon import run_daemon


def _make(config):
    from hfai.web.service import WebService

    return WebService(config)


def main(argv: list[str] | None = None) -> int:
    return run_daemon("hfai-web", "Serve hfai's task-management web pages.", _make, argv)


if __name__ == "__main__":
    sys.exit(main())
