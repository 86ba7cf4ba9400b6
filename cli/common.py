"""What the ``hfai`` commands share: a client of the configured cluster, the async runner that
turns typed errors into one line, ``--json``, and the terminal's width.

Commands call ``common.api()`` through this module (not a copy of the name), so that a test can
replace the client in one place.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import click

from hfai.cli.errors import user_errors

if TYPE_CHECKING:
    from hfai.api.client import ApiClient

#: Runs an async command body; typed hfai errors become a clean one-line failure (hfai.cli.errors).
run_async = user_errors()

json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print JSON (documented in docs/cli.md) instead of a table; nothing cut.")


def api() -> ApiClient:
    """A client of the cluster the configuration names, as the user the credentials file proves."""
    from hfai.api.client import ApiClient
    from hfai.api.config import cli_config

    return ApiClient(cli_config())


def terminal_width() -> int | None:
    """Columns of the terminal the output goes to ($COLUMNS wins), or None for a file or pipe."""
    if os.environ.get("COLUMNS", "").isdigit() or sys.stdout.isatty():
        import shutil  # here: a pipe or file, as for most scripted calls, does without it

        return shutil.get_terminal_size().columns
    return None
