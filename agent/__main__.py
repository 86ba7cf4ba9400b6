"""``hfai-agent`` / ``python -m hfai.agent``: run the agent of this node."""

from __future__ import annotations

import argparse
import asyncio
import sys

from hfai._daemon import serve, setup_logging
from hfai.config import load_config
from hfai.protocol.errors import HfaiError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hfai-agent", description="Run the hfai agent of this node.")
    p.add_argument("--config", help="TOML config file (default: $HFAI_CONFIG or /etc/hfai/hfai.toml)")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    setup_logging(args.log_level)
    try:
        config = load_config(args.config)
        from hfai.agent.service import Agent

        agent = Agent(config)
        asyncio.run(serve(agent.start, agent.close))
    except HfaiError as e:
        print(f"hfai-agent: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
