"""``hfai-agent`` / ``python -m hfai.agent``: run the agent of this node."""

from __future__ import annotations

import sys

from hfai.core.daemon import run_daemon


def _make(config):
    from hfai.agent.service import Agent

    return Agent(config)


def main(argv: list[str] | None = None) -> int:
    return run_daemon("hfai-agent", "Run the hfai agent of this node.", _make, argv)


if __name__ == "__main__":
    sys.exit(main())
