"""A lean Redis connection for the limiter's hot path: one socket, pipelined, replies parsed by hiredis.

Why not redis-py here: measured in the proxy (docs/proxy.md, "What a quota costs"), redis-py's asyncio
client spent about 300 us of CPU per request on the limiter's two script calls: a pool checkout and
release, a retry wrapper, an `asyncio.timeout`, event hooks, a Python reply parser, and above all one
`write` system call per command, each of which on loopback runs Redis's side of TCP in the sender's
time slice. This connection instead:

- keeps one socket per event loop and sends every command queued during one loop iteration in a
  single `write` (at 16 clients one write carries several admissions and completions);
- matches replies to commands in order (Redis answers a connection's commands in the order sent),
  parsed in C by hiredis, many per `read`;
- times out by one watchdog timer per connection rather than a timer per command;
- lets a caller send without waiting for the reply (the limiter's completions: their reply carries
  nothing, and the next command on the same socket runs after them in Redis anyway).

Commands are RESP arrays packed by the caller (`pack`), so a caller can keep the constant part of a
command (script digest, keys, limits) packed once and add only what changes per request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import importlib
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core.redis_client import redis_link

hiredis: Any
try:
    hiredis = importlib.import_module("hiredis")
except ImportError:  # a virtualenv not yet reinstalled from pyproject.toml: the limiter keeps redis-py
    hiredis = None


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%b\r\n" % (len(value), value)


def pack(*args: bytes | str | int) -> bytes:
    """A whole command as a RESP array."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        parts.append(bulk(a if isinstance(a, bytes) else str(a).encode()))
    return b"".join(parts)


class Script:
    """A Lua script sent by digest (`EVALSHA`), with its source kept for a `NOSCRIPT` reply."""

    def __init__(self, source: str) -> None:
        self.source = source.encode()
        self.sha = hashlib.sha1(self.source).hexdigest().encode()  # Redis names scripts by SHA-1
        self._sha_part = b"$7\r\nEVALSHA\r\n" + bulk(self.sha)
        self._eval_part = b"$4\r\nEVAL\r\n" + bulk(self.source)

    def head(self, nargs: int, *, by_digest: bool = True) -> bytes:
        """The start of `EVALSHA digest ...` (or `EVAL source ...`) with `nargs` items after the script."""
        return b"*%d\r\n" % (nargs + 2) + (self._sha_part if by_digest else self._eval_part)


def lean_params(client: aioredis.Redis) -> dict[str, Any] | None:
    """The connection settings of a redis-py client, when a plain TCP or Unix-socket connection will do.

    None for anything else (TLS, credential providers, ...): those keep going through redis-py.
    """
    pool = getattr(client, "connection_pool", None)
    if pool is None or hiredis is None:
        return None
    kw = pool.connection_kwargs
    if kw.get("credential_provider") is not None or kw.get("ssl_context") is not None:
        return None
    if pool.connection_class is aioredis.Connection:
        where = {"host": kw.get("host", "localhost"), "port": int(kw.get("port", 6379))}
    elif pool.connection_class is aioredis.UnixDomainSocketConnection:
        where = {"path": kw["path"]}
    else:
        return None
    return {
        **where,
        "db": int(kw.get("db") or 0),
        "username": kw.get("username"),
        "password": kw.get("password"),
        "connect_timeout": kw.get("socket_connect_timeout") or kw.get("socket_timeout"),
        "reply_timeout": kw.get("socket_timeout"),
    }


# One pending command: the future of its reply (None: nobody waits), for a script call the script and
# the packed command after its head (so that a NOSCRIPT reply can resend it with the source), and
# whether it was already resent after a lost connection.
_Pending = tuple[asyncio.Future[Any] | None, Script | None, int, bytes, bool]
_SETUP = -1  # in place of `nargs`: a set-up command, whose error reply is its result (connect raises it)
_SKIP = pack("CLIENT", "REPLY", "SKIP")  # Redis sends no reply to the command after this one (nor to it)


class RedisPipe(asyncio.Protocol):
    """One pipelined connection, opened on first use and reopened on the next command after a loss."""

    def __init__(
        self,
        *,
        host: str = "localhost",
        port: int = 6379,
        path: str | None = None,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        connect_timeout: float | None = None,
        reply_timeout: float | None = None,
        scripts: tuple[Script, ...] = (),
        post_delay: float = 0.0,
        name: str = "",
        link: str = "limiter",
    ) -> None:
        self._where = (host, port, path)
        self._setup: list[bytes] = []
        if password is not None:
            self._setup.append(pack("AUTH", *((username,) if username else ()), password))
        if db:
            self._setup.append(pack("SELECT", db))
        if name:
            self._setup.append(pack("CLIENT", "SETNAME", name))
        # Loaded on every (re)connect, so that EVALSHA finds them; pipelined ahead of the first command.
        self._setup += [pack("SCRIPT", "LOAD", s.source) for s in scripts]
        self._connect_timeout = connect_timeout
        self._reply_timeout = reply_timeout
        self._transport: asyncio.Transport | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._reader = hiredis.Reader(replyError=ResponseError)
        self._pending: collections.deque[_Pending] = collections.deque()
        self._sent_at: collections.deque[float] = collections.deque()  # send time of each pending reply
        self._out: list[bytes] = []
        self._posted: list[bytes] = []
        self._post_delay = post_delay
        self._post_timer: asyncio.TimerHandle | None = None
        self._flush_scheduled = False
        self._watchdog: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._link = redis_link(link)
        self._closing = False

    # ---- sending ---------------------------------------------------------------------------------

    def send(self, command: bytes, *, wait: bool = True, script: Script | None = None, nargs: int = 0) -> Any:
        """Queue `command` (packed) for this iteration's write; its reply's future, or None if `wait=False`.

        With `script`, `command` is what follows `script.head(nargs)`: the digest form is sent, and on a
        NOSCRIPT reply the source form is sent in its place.
        """
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        fut = loop.create_future() if wait else None
        self._out.append(script.head(nargs) + command if script is not None else command)
        self._pending.append((fut, script, nargs, command, False))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return fut

    def post(self, command: bytes) -> None:
        """Send `command` (packed) with no reply to read, in the next write or within `post_delay` s.

        Nothing comes back, not even an error, so `command` must be one that cannot fail for want of
        state on the server (a script sent as source with `EVAL`, not by digest).
        """
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        self._posted.append(_SKIP + command)
        if self._post_timer is None and not self._flush_scheduled:
            if self._post_delay > 0:
                self._post_timer = loop.call_later(self._post_delay, self._flush)
            else:
                self._flush_scheduled = True
                loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._post_timer is not None:
            self._post_timer.cancel()
            self._post_timer = None
        if not self._out and not self._posted:
            return
        if self._transport is None or self._connecting is not None:
            # Not while connecting either: the transport exists (connection_made) a loop iteration or
            # more before _connect writes the set-up (SELECT, SCRIPT LOAD, ...). A command written in
            # that gap would run before SELECT, in the wrong database, and the replies would be matched
            # to the wrong waiters (set-up first in `_pending`, but not first on the wire).
            if self._connecting is None:
                assert self._loop is not None
                self._connecting = self._loop.create_task(self._connect())
            return  # flushed once connected
        # Posted commands first: they were queued before the replies now awaited could have been asked
        # for by anything they concern (a completion always follows its own admission's reply).
        chunks = self._posted + self._out if self._posted else self._out
        data = b"".join(chunks) if len(chunks) > 1 else chunks[0]
        now = self._loop.time() if self._loop is not None else 0.0
        if self._out:
            self._sent_at.extend([now] * len(self._out))
        self._out = []
        self._posted = []
        self._transport.write(data)
        if self._reply_timeout is not None and self._watchdog is None and self._loop is not None:
            self._watchdog = self._loop.call_at(now + self._reply_timeout, self._check_timeout)

    async def _connect(self) -> None:
        assert self._loop is not None
        host, port, path = self._where
        setup = [self._loop.create_future() for _ in self._setup]
        try:
            async with asyncio.timeout(self._connect_timeout):
                if path is not None:
                    transport, _ = await self._loop.create_unix_connection(lambda: self, path)
                else:
                    transport, _ = await self._loop.create_connection(lambda: self, host, port)
                if setup:
                    # Set-up replies come before any queued command's, in the same order.
                    for f in reversed(setup):
                        self._pending.appendleft((f, None, _SETUP, b"", False))
                    self._sent_at.extendleft([self._loop.time()] * len(setup))
                    transport.write(b"".join(self._setup))
                    for f in setup:
                        reply = await f
                        if isinstance(reply, Exception):
                            raise reply
        except (OSError, TimeoutError, ResponseError, RedisConnectionError) as exc:
            self._connecting = None
            error = RedisConnectionError(f"Redis unreachable: {type(exc).__name__}: {exc}")
            self._link.lost(error)
            if self._transport is not None:
                self._transport.abort()  # connection_lost fails what is pending
            self._fail_all(error)
            for f in setup:  # nobody else waits for these
                if f.done() and not f.cancelled():
                    f.exception()
            return
        self._connecting = None
        self._link.ok()
        self._flush()

    # ---- receiving -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        pending, sent_at = self._pending, self._sent_at
        while (reply := self._reader.gets()) is not False:
            fut, script, nargs, command, resent = pending.popleft()
            sent_at.popleft()
            if script is not None and isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT"):
                # Redis lost its script cache (restart, SCRIPT FLUSH): the script did not run; run it
                # from source, which also caches it again.
                self._out.append(script.head(nargs, by_digest=False) + command)
                self._pending.append((fut, script, nargs, command, resent))
                if not self._flush_scheduled:
                    self._flush_scheduled = True
                    assert self._loop is not None
                    self._loop.call_soon(self._flush)
                continue
            if fut is not None and not fut.done():
                if isinstance(reply, ResponseError) and nargs != _SETUP:
                    fut.set_exception(reply)
                else:
                    fut.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._reader = hiredis.Reader(replyError=ResponseError)
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        error = RedisConnectionError(
            f"Redis connection lost: {exc}" if exc else "Redis closed the connection"
        )
        if self._closing:
            self._fail_all(error)
            return
        self._link.lost(error)
        # Resend each awaited command once, on a fresh connection: after a Redis restart the old socket
        # is dead but the new server answers. A command that already ran may run twice (its reply was
        # lost); the limiter's scripts write by member name (and add tokens only for a new entry), so at
        # worst a day's budget counts one admission twice, the safe direction. Nothing is resent
        # twice: a second loss fails it. Replies nobody awaits (posted completions) are dropped.
        again = [
            p for p in self._pending if p[0] is not None and not p[0].done() and not p[4] and p[2] != _SETUP
        ]
        given_up = [p for p in self._pending if p not in again]
        self._pending.clear()
        self._sent_at.clear()
        self._out.clear()
        self._posted.clear()
        for fut, *_ in given_up:
            if fut is not None and not fut.done():
                fut.set_exception(error)
        if not again or self._loop is None:
            return
        for fut, script, nargs, command, _ in again:
            self._out.append(script.head(nargs) + command if script is not None else command)
            self._pending.append((fut, script, nargs, command, True))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _fail_all(self, exc: Exception) -> None:
        pending = list(self._pending)
        self._pending.clear()
        self._sent_at.clear()
        self._out.clear()
        self._posted.clear()
        for fut, *_ in pending:
            if fut is not None and not fut.done():
                fut.set_exception(exc)

    def _check_timeout(self) -> None:
        self._watchdog = None
        if not self._sent_at or self._loop is None or self._reply_timeout is None:
            return
        oldest = self._sent_at[0]
        if self._loop.time() - oldest >= self._reply_timeout:
            # A reply overdue: the connection is unusable (later replies would be matched wrongly).
            pending = list(self._pending)
            self._pending.clear()
            self._sent_at.clear()
            for fut, *_ in pending:
                if fut is not None and not fut.done():
                    fut.set_exception(RedisTimeoutError("Redis did not answer in time"))
            if self._transport is not None:
                self._transport.abort()
            return
        self._watchdog = self._loop.call_at(oldest + self._reply_timeout, self._check_timeout)

    def local_address(self) -> str | None:
        """`host:port` of this end of the connection (Redis's CLIENT LIST `addr`), if connected over TCP."""
        if self._transport is None:
            return None
        name = self._transport.get_extra_info("sockname")
        return f"{name[0]}:{name[1]}" if isinstance(name, tuple) else None

    async def aclose(self) -> None:
        self._closing = True
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._connecting
        if self._post_timer is not None or self._flush_scheduled:
            self._flush()  # what was posted still goes out (close() writes the buffer first)
        if self._transport is not None:
            self._transport.close()
