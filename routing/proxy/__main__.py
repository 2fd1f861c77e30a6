"""`python -m routing.proxy [--host H] [--port P] [--workers N] [--server inferchain|uvicorn]`.

The data plane: serves the proxy's ASGI app with its own lean HTTP/1.1 server
(routing/proxy/server.py; uvloop + httptools, no access log: the request log is the access log).
`--server uvicorn` runs the same app under uvicorn instead, for comparison. Several workers share the
listening socket and nothing else but Redis and the database, exactly like several hosts would.
"""

from __future__ import annotations

import argparse
import logging
import os

APP = "routing.proxy.asgi:app"


def _max_body() -> int:
    # Read in each worker after django.setup() (the server's import of the app does it).
    from django.conf import settings

    return int(settings.PROXY_MAX_BODY_BYTES)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m routing.proxy", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--server", choices=("inferchain", "uvicorn"), default="inferchain")
    args = parser.parse_args()
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.server == "uvicorn":
        # Only for --server uvicorn: the default server never loads it.
        import uvicorn

        uvicorn.run(
            APP,
            host=args.host,
            port=args.port,
            workers=args.workers,
            loop="uvloop",
            http="httptools",
            access_log=False,
            log_level=args.log_level,
            lifespan="on",
            # No X-Forwarded-* rewriting: the proxy never uses the client address.
            proxy_headers=False,
        )
        return
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s proxy[{os.getpid()}] %(levelname)s %(name)s: %(message)s",
    )
    # After argument parsing, so `--help` and usage errors do not load the server and its loop.
    from routing.proxy.server import run

    run(APP, args.host, args.port, args.workers, _max_body)


if __name__ == "__main__":
    main()
