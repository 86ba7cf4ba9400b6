"""``hfai-controller`` / ``python -m hfai.controller``: run one controller replica."""

from __future__ import annotations

import argparse
import asyncio
import sys

from hfai._daemon import serve, setup_logging
from hfai.config import load_config
from hfai.protocol.errors import HfaiError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hfai-controller", description="Run one hfai controller replica.")
    p.add_argument("--config", help="TOML config file (default: $HFAI_CONFIG or /etc/hfai/hfai.toml)")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    setup_logging(args.log_level)
    try:
        config = load_config(args.config)
        from hfai.controller.service import Controller

        controller = Controller(config)
        asyncio.run(serve(controller.start, controller.close))
    except HfaiError as e:
        print(f"hfai-controller: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
