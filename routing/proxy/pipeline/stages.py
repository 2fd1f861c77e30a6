"""Steps 4 and 9, pre-stages and post-stages: the policy's chain around the one generation step.

A stage has the interface of an Envoy filter or a Kong plugin: `on_request` before generation (it may
change the request or refuse it with a ProxyError), `on_chunk` for each piece of answer text, and
`on_response` once the answer is out. A stage keeps only per-request state, in the context; what
outlives a request is in the services it is given. With no stage configured (`ctx.stages` empty) the
relay calls nothing per chunk.
"""

from __future__ import annotations

from routing.proxy.pipeline.context import RequestContext
from routing.proxy.services import Services


class Stage:
    """One stage of a chain; subclasses override the hooks they need."""

    name = "stage"

    async def on_request(self, ctx: RequestContext, svc: Services) -> None:
        """Before generation: look at (or change) `ctx.body`, or raise a ProxyError to refuse."""

    def on_chunk(self, ctx: RequestContext, text: str) -> str:
        """Each piece of answer text on its way to the client: what to send instead."""
        return text

    async def on_response(self, ctx: RequestContext, svc: Services) -> None:
        """After the answer is out (the request's status and usage are known)."""


async def pre(ctx: RequestContext, svc: Services) -> None:
    for stage in ctx.stages:
        await stage.on_request(ctx, svc)


async def post(ctx: RequestContext, svc: Services) -> None:
    for stage in ctx.stages:
        await stage.on_response(ctx, svc)
