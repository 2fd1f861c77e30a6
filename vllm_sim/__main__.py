"""Entry point: `python -m vllm_sim serve MODEL [options]`."""

from __future__ import annotations

import logging
import sys

import uvloop

from vllm_sim.cli import parse_args


def main(argv: list[str] | None = None) -> int:
    """Parse the vLLM-style command line and run the simulated server until it is stopped."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(asctime)s [sim] %(message)s", stream=sys.stderr
    )
    # Imported after parsing: `--help` and argument errors answer without loading the server.
    from vllm_sim.server import serve

    return uvloop.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
