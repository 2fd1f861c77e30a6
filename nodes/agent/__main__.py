"""`python -m nodes.agent --host NAME`: run the node agent for NAME (see nodes/agent/main.py)."""

from __future__ import annotations

import os

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inferchain.settings")
    django.setup()
    # After setup: the agent's modules import models, which need the app registry ready.
    from nodes.agent.main import build_parser, run

    run(build_parser().parse_args())


if __name__ == "__main__":
    main()
