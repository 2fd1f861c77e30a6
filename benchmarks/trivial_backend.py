"""A trivial OpenAI-compatible backend for benchmarks and proxy tests: raw asyncio, fixed answers.

`python benchmarks/trivial_backend.py --port P [--chunks N] [--echo]` answers /v1/chat/completions and
/v1/completions (JSON or SSE with usage), /v1/embeddings and /v1/models as fast as a socket allows,
so that what a benchmark measures in front of it is the proxy, not the backend. The answer is
"hello " N times; with `--echo` it is the last message's content (or the prompt), in N stream pieces,
so a test or benchmark chooses the answer (e.g. JSON for the schema stage).
"""

from __future__ import annotations

import argparse
import asyncio
import json

try:
    import uvloop
except ImportError:  # pragma: no cover
    uvloop = None  # type: ignore[assignment]

CHUNKS = 8
ECHO = False


def _pieces(req: dict[str, object], chat: bool) -> list[str]:
    """The answer's stream pieces: "hello " each, or (--echo) the request's last text cut in CHUNKS."""
    if not ECHO:
        return ["hello "] * CHUNKS
    text = ""
    if chat:
        messages = req.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
            content = messages[-1].get("content")
            text = content if isinstance(content, str) else ""
    else:
        prompt = req.get("prompt")
        text = prompt if isinstance(prompt, str) else ""
    size = -(-len(text) // CHUNKS) or 1
    return [text[i * size : (i + 1) * size] for i in range(CHUNKS)]


def _completion(model: bytes, chat: bool, pieces: list[str]) -> bytes:
    text = "".join(pieces)
    choice = (
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        if chat
        else {"index": 0, "text": text, "finish_reason": "stop"}
    )
    return json.dumps(
        {
            "id": "cmpl-trivial",
            "object": "chat.completion" if chat else "text_completion",
            "created": 0,
            "model": model.decode(),
            "choices": [choice],
            "usage": {"prompt_tokens": 5, "completion_tokens": CHUNKS, "total_tokens": 5 + CHUNKS},
        },
        separators=(",", ":"),
    ).encode()


def _embedding(model: bytes) -> bytes:
    return json.dumps(
        {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}],
            "model": model.decode(),
            "usage": {"prompt_tokens": 5, "total_tokens": 5},
        },
        separators=(",", ":"),
    ).encode()


def _stream(model: bytes, chat: bool, usage: bool, pieces: list[str]) -> bytes:
    obj = "chat.completion.chunk" if chat else "text_completion"
    events = []
    for i, piece in enumerate(pieces):
        choice: dict[str, object] = (
            {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
        )
        choice["finish_reason"] = "stop" if i == CHUNKS - 1 else None
        events.append(
            {"id": "cmpl-trivial", "object": obj, "created": 0, "model": model.decode(), "choices": [choice]}
        )
    if usage:
        events.append(
            {
                "id": "cmpl-trivial",
                "object": obj,
                "created": 0,
                "model": model.decode(),
                "choices": [],
                "usage": {"prompt_tokens": 5, "completion_tokens": CHUNKS, "total_tokens": 5 + CHUNKS},
            }
        )
    out = b"".join(b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in events)
    return out + b"data: [DONE]\n\n"


class Backend(asyncio.Protocol):
    """HTTP/1.1 keep-alive, Content-Length bodies only (what proxies and benchmark clients send)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4 : head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length :]
            self.respond(head.split(b" ", 2)[1], body)

    def respond(self, path: bytes, body: bytes) -> None:
        if path.startswith(b"/v1/models"):
            payload = (
                b'{"object":"list","data":[{"id":"trivial","object":"model","created":0,"owned_by":"x"}]}'
            )
            self.send(b"application/json", payload)
            return
        if path == b"/health":
            self.send(b"application/json", b"{}")
            return
        chat = path == b"/v1/chat/completions"
        try:
            req = json.loads(body) if body else {}
        except ValueError:
            req = {}
        model = str(req.get("model", "trivial")).encode()
        if path == b"/v1/embeddings":
            self.send(b"application/json", _embedding(model))
            return
        if req.get("stream"):
            usage = bool((req.get("stream_options") or {}).get("include_usage"))
            self.send(b"text/event-stream", _stream(model, chat, usage, _pieces(req, chat)))
        else:
            self.send(b"application/json", _completion(model, chat, _pieces(req, chat)))

    def send(self, ctype: bytes, payload: bytes) -> None:
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: "
            + ctype
            + b"\r\ncontent-length: "
            + str(len(payload)).encode()
            + b"\r\n\r\n"
            + payload
        )


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Backend, host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    global CHUNKS, ECHO
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=CHUNKS)
    parser.add_argument("--echo", action="store_true", help="answer with the last message's content")
    args = parser.parse_args()
    CHUNKS, ECHO = args.chunks, args.echo
    if uvloop is not None:
        uvloop.install()
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
