"""A bare HTTP pass-through, the reference row of `proxy_overhead.py`: what one Python process that
only forwards costs on this machine, with nothing of a proxy's work (no auth, no limits, no body
checks, no routing, no log, no metrics).

    .venv/bin/python benchmarks/passthrough.py --port P --upstream http://127.0.0.1:BACKEND

aiohttp's server and client in one process on uvloop, set up as aiohttp's deployment notes advise
for speed (no access log, one `ClientSession` with an unlimited keep-alive pool reused for every
request, uvloop): each request's body is read and posted to the same path upstream, and the answer
copied back, a stream chunk by chunk as it arrives. This is the "bare aiohttp pass-through" of issue
13's first table: a reference for what one Python process that only forwards reaches on these cores.
"""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web

HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})


def make_app(upstream: str) -> web.Application:
    app = web.Application()

    async def start(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)

    async def close(app: web.Application) -> None:
        await app["session"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with app["session"].post(upstream + request.path, data=body, headers=headers) as up:
            out_headers = {k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP}
            if up.content_type == "text/event-stream":
                resp = web.StreamResponse(status=up.status, headers=out_headers)
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
            return web.Response(status=up.status, body=await up.read(), headers=out_headers)

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.on_startup.append(start)
    app.on_cleanup.append(close)
    app.router.add_get("/healthz", health)
    app.router.add_post("/{tail:.*}", forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--upstream", required=True, help="base URL of the backend, e.g. http://127.0.0.1:9000"
    )
    args = parser.parse_args()
    import uvloop

    uvloop.install()
    web.run_app(
        make_app(args.upstream.rstrip("/")), host="127.0.0.1", port=args.port, access_log=None, print=None
    )


if __name__ == "__main__":
    main()
