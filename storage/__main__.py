"""``hfai-storage`` / ``python -m hfai.storage``: run the storage service."""

from __future__ import annotations

import sys

from hfai.core.daemon import run_daemon


def _make(config):
    from hfai.storage.service import StorageService

    return StorageService(config)


def main(argv: list[str] | None = None) -> int:
    return run_daemon("hfai-storage", "Run the hfai storage service (workspaces, storage rules, datasets).", _make,
                      argv)


if __name__ == "__main__":
    sys.exit(main())
