"""`python -m routing.proxy [--host H] [--port P] [--workers N]`: the data plane on its own.

Runs uvicorn with uvloop and httptools and no access log (the request log is the access log).
Several workers share nothing but Redis and the database, exactly like several hosts would.
"""

from __future__ import annotations

import argparse

import uvicorn


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m routing.proxy", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()
    uvicorn.run(
        "routing.proxy.asgi:app",
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level=args.log_level,
        lifespan="on",
        # No X-Forwarded-* rewriting: the proxy never uses the client address, so skip that middleware.
        proxy_headers=False,
    )


if __name__ == "__main__":
    main()
