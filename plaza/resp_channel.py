"""A lean Redis command channel: one connection of its own, pipelined, parsed by hiredis.

redis-py's client pays, on every call, for its connection pool's get and release, its retry
wrapper, its per-argument encoder and its reply callbacks: an ``XREAD`` of one entry cost
85 to 93 µs of client CPU through ``redis.asyncio.Redis`` against 34 µs on a bare socket
with ``hiredis.Reader`` (docs/benchmarks.md). Plaza's three calls that run per batch or per
reply read go through this channel instead: the reply multiplexer's ``XREAD``
(``plaza.replies``), the worker's delivery count and its result write (``EVALSHA``,
``workers/deliveries.py``, ``workers/writer.py``). Everything else stays on redis-py.

- The connection is made from the redis-py client's own connection settings (host and
  port or unix socket, db, username and password, and for ``rediss://`` the TLS context
  redis-py would build), on first use, and again on the first call after it was lost.
- Commands are packed by ``hiredis.pack_command`` and written at once; replies come back
  in order (RESP2), so callers may have several in flight on one channel.
- An error reply raises :class:`CommandError` (a ``redis.exceptions.ResponseError``, as
  redis-py raises); a lost connection fails every call in flight with
  ``redis.exceptions.ConnectionError`` (whether those commands ran is unknown, as with any
  client). Callers keep the retries they had.
- A script is called by its SHA and loaded on ``NOSCRIPT`` (after a Redis restart or a
  ``SCRIPT FLUSH``) by sending it whole with ``EVAL``, which also caches it.
- No channel for a Redis Cluster (:func:`channel_for` answers None): its callers split
  work by hash slot, which redis-py's cluster client does for them.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol, cast

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from plaza.connections import is_cluster

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
"""How long making the connection (and AUTH, SELECT) may take."""

Arg = bytes | str | int | float | memoryview


class Script(Protocol):
    """What ``redis.register_script`` returns, as far as the channel uses it."""

    sha: str
    script: bytes | str | memoryview


class CommandError(ResponseError):
    """Redis answered the command with an error reply."""


def _pack(args: Sequence[Arg]) -> bytes:
    # hiredis' stubs declare a one-element tuple; it takes any number of arguments.
    packed: bytes = hiredis.pack_command(tuple(args))  # type: ignore[arg-type]
    return packed


class _Protocol(asyncio.Protocol):
    """Replies, in order, to the futures of the commands sent."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.transport: asyncio.Transport | None = None
        self.lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while True:
            reply = self.reader.gets()
            if reply is False:
                return
            if not self.waiting:  # a reply nobody asked for: the stream is out of step
                log.error("Redis sent a reply no command asked for; dropping the connection")
                if self.transport is not None:
                    self.transport.abort()  # connection_lost fails what is waiting
                return
            fut = self.waiting.popleft()
            if fut.done():  # its caller stopped waiting (cancelled)
                continue
            if isinstance(reply, hiredis.ReplyError):
                fut.set_exception(CommandError(str(reply)))
            else:
                fut.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = RedisConnectionError(f"connection to Redis lost: {exc or 'closed'}")
        self.transport = None
        while self.waiting:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_exception(RedisConnectionError(str(self.lost)))

    def send(self, packed: bytes) -> asyncio.Future[Any]:
        if self.transport is None or self.transport.is_closing():
            raise RedisConnectionError(str(self.lost or "not connected to Redis"))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        self.transport.write(packed)
        return fut


class RespChannel:
    """Commands to one Redis server on a connection of the channel's own."""

    def __init__(self, connection: AbstractConnection) -> None:
        """``connection``: a redis-py connection, never connected, whose settings (address,
        db, credentials, TLS) the channel's own connection uses."""
        self._settings = connection
        self._protocol: _Protocol | None = None
        self._connecting = asyncio.Lock()

    @property
    def connected(self) -> bool:
        p = self._protocol
        return p is not None and p.transport is not None and not p.transport.is_closing()

    async def call(self, *args: Arg) -> Any:
        """Send one command and return its reply (bytes, int, lists of those, or None)."""
        protocol = await self._connected()
        return await protocol.send(_pack(args))

    async def send(self, *args: Arg) -> asyncio.Future[Any]:
        """Write one command now and return its reply's future, not waited for. The write
        reaches the socket before this returns (asyncio sends at once when nothing is
        buffered), connecting first only if the connection was lost."""
        protocol = await self._connected()
        return protocol.send(_pack(args))

    async def evalsha(self, script: Script, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """Run a registered redis-py ``Script`` by its SHA; on ``NOSCRIPT``, send it whole."""
        try:
            return await self.call("EVALSHA", script.sha, len(keys), *keys, *args)
        except CommandError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
        return await self.call("EVAL", script.script, len(keys), *keys, *args)

    async def close(self) -> None:
        """Close the connection (idempotent); the next call would connect again."""
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()

    async def _connected(self) -> _Protocol:
        if self.connected:
            assert self._protocol is not None
            return self._protocol
        async with self._connecting:
            if not self.connected:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    self._protocol = await self._connect()
        assert self._protocol is not None
        return self._protocol

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        conn = self._settings
        try:
            if isinstance(conn, UnixDomainSocketConnection):
                _, protocol = await loop.create_unix_connection(_Protocol, conn.path)
            else:
                assert isinstance(conn, Connection)  # SSLConnection is one too
                tls: ssl.SSLContext | None = None
                if isinstance(conn, SSLConnection):
                    tls = conn.ssl_context.get()
                _, protocol = await loop.create_connection(_Protocol, conn.host, conn.port, ssl=tls)
        except OSError as exc:
            raise RedisConnectionError(f"cannot connect to Redis: {exc}") from exc
        try:
            password = conn.password
            if password:
                auth = (conn.username, password) if conn.username else (password,)
                await protocol.send(_pack(("AUTH", *auth)))
            if conn.db:
                await protocol.send(_pack(("SELECT", conn.db)))
        except BaseException:  # refused credentials, a timeout: no half-made connection
            if protocol.transport is not None:
                protocol.transport.close()
            raise
        return protocol


def channel_for(redis: aioredis.Redis) -> RespChannel | None:
    """A channel to the server ``redis`` (from ``plaza.connections.redis_client``) talks
    to, or None where its calls must stay on redis-py (a Redis Cluster, a connection class
    of some other kind, credentials from a provider)."""
    if is_cluster(redis):
        return None
    pool = redis.connection_pool
    kwargs = dict(pool.connection_kwargs)
    if kwargs.get("credential_provider") is not None:
        return None
    if pool.connection_class not in (Connection, SSLConnection, UnixDomainSocketConnection):
        return None
    # Only read for its settings: redis-py connects lazily, and this one never connects.
    kwargs["retry"] = Retry(NoBackoff(), 0)
    return RespChannel(pool.connection_class(**kwargs))


class ChannelScript:
    """A Lua script that runs on a channel of its own where there can be one (else through
    redis-py, as on a Redis Cluster): what the result writer and the delivery counter
    call once per batch or fetch. ``share``: another script whose channel (connection)
    this one uses, so that the commands of both reach Redis in the order they were sent."""

    def __init__(
        self, redis: aioredis.Redis, source: str, *, share: ChannelScript | None = None
    ) -> None:
        self._script = redis.register_script(source)
        self._channel: RespChannel | None = channel_for(redis) if share is None else share._channel

    async def __call__(self, keys: Sequence[str | bytes], args: Sequence[Arg]) -> Any:
        if self._channel is not None:
            return await self._channel.evalsha(self._script, keys, args)
        return await self._script(keys=keys, args=args)

    async def send(self, keys: Sequence[str | bytes], args: Sequence[Arg]) -> None:
        """Run the script without waiting for its reply: on a channel, its ``EVAL`` (the
        whole script, so no ``NOSCRIPT`` can come back when nobody waits) is written to the
        socket before this returns, and an error reply is only logged; through redis-py
        (no channel) it is called and waited for."""
        if self._channel is None:
            await self._script(keys=keys, args=args)
            return
        reply = await self._channel.send("EVAL", self._script.script, len(keys), *keys, *args)
        reply.add_done_callback(_log_failure)

    async def close(self) -> None:
        """Close the channel's connection (idempotent); the redis-py client stays open."""
        if self._channel is not None:
            await self._channel.close()


def _log_failure(reply: asyncio.Future[Any]) -> None:
    """A reply nobody waits for: its error is logged (and so retrieved)."""
    if not reply.cancelled() and (exc := reply.exception()) is not None:
        log.warning("a Redis command sent without waiting failed: %s", exc)
