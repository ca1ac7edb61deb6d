"""The gateway's HTTP front: ``plaza.gateway.http_server`` over the Starlette app.

Sync inference (``POST /v2/models/{model}[/versions/{version}]/infer``), the call that
carries the load, is answered here directly: the same checks and the same code as the
Starlette route (``Endpoints.infer_encoded``), without the ASGI layers around it. Every
other request (metadata, health, statistics, async jobs, the model repository) goes to the
Starlette app through a small ASGI bridge, so each route is written once, in
``plaza.gateway.app``, and the unit tests that drive that app cover it. A response the app
streams (a decoupled model's ``generate_stream``: its body in parts, ``more_body``) is
passed on as it comes, a chunk at a time (``HttpResponse.stream``), at most
``STREAM_BUFFER`` parts ahead of the client; a client that goes away ends the app's call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, MutableMapping
from typing import Any
from urllib.parse import unquote

from starlette.applications import Starlette

from plaza.auth import CHALLENGE, bearer_matches
from plaza.errors import PlazaError, Unauthorized
from plaza.gateway import kserve
from plaza.gateway.app import Endpoints, decoded_body
from plaza.gateway.errors import http_error
from plaza.gateway.http_server import HttpRequest, HttpResponse
from plaza.tasks import cancel_and_wait

log = logging.getLogger(__name__)

_JSON = kserve.CONTENT_TYPE_JSON
STREAM_BUFFER = 16
"""Parts of a streamed response the app may send ahead of the client before it waits."""
_LENGTH_HEADER = kserve.HEADER_INFERENCE_LENGTH.lower()


class HttpFront:
    """The HTTP server's handler: the infer fast path, the rest through the app."""

    def __init__(self, app: Starlette, api_key: str | None, scheme: str = "http") -> None:
        self.app = app
        self.endpoints: Endpoints = app.state.endpoints
        self.service = self.endpoints.service
        self.max_body = self.service.settings.gateway.max_body_bytes
        self._key = api_key.encode() if api_key is not None else None
        self._scheme = scheme

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        route = _infer_route(request) if request.method == "POST" else None
        if route is None:
            return await self._bridge(request)
        try:
            self._authorize(request)
            model, version = route
            self.service.model(model, version)  # an unknown model: 404
            raw = decoded_body(request.body, request.headers.get("content-encoding"), self.max_body)
            length = request.headers.get(_LENGTH_HEADER)
            encoded = await self.endpoints.infer_encoded(model, version, raw, length)
        except PlazaError as exc:
            return error(exc)
        except Exception as exc:
            log.exception("internal error on %s", request.path)
            return error(PlazaError(f"internal error: {type(exc).__name__}"))
        headers = []
        if encoded.header_length is not None:
            headers.append((kserve.HEADER_INFERENCE_LENGTH, str(encoded.header_length)))
        return HttpResponse(200, encoded.content, encoded.content_type, headers)

    def _authorize(self, request: HttpRequest) -> None:
        if self._key is None:
            return
        given = request.headers.get("authorization", "")
        if not bearer_matches(given.encode("latin-1"), self._key):
            raise Unauthorized("missing or wrong API key (Authorization: Bearer)")

    async def _bridge(self, request: HttpRequest) -> HttpResponse:
        """``request`` through the Starlette app as one ASGI call (auth is its middleware)."""
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version,
            "method": request.method,
            "scheme": self._scheme,
            "path": _unquoted(request.path),
            "raw_path": request.path.encode("latin-1"),
            "query_string": request.query.encode("latin-1"),
            "root_path": "",
            "headers": [
                (k.encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()
            ],
            "client": None,
            "server": None,
            "state": {},
        }
        done = asyncio.Event()
        delivered = False
        status = 500
        content_type: str | None = None
        headers: list[tuple[str, str]] = []
        body: list[bytes] = []
        parts: asyncio.Queue[bytes] = asyncio.Queue(STREAM_BUFFER)
        streaming: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": request.body, "more_body": False}
            await done.wait()  # nothing more comes: the next message is the end
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            nonlocal status, content_type
            if message["type"] == "http.response.start":
                status = int(message["status"])
                for name, value in message.get("headers", ()):
                    key = name.decode("latin-1").lower()
                    if key == "content-type":
                        content_type = value.decode("latin-1")
                    elif key != "content-length":
                        headers.append((key, value.decode("latin-1")))
            elif message["type"] == "http.response.body":
                more = message.get("more_body", False)
                if not more and not streaming.done():
                    body.append(message.get("body", b""))
                    done.set()
                    return
                if not streaming.done():  # the body comes in parts: pass them on as they come
                    streaming.set_result(None)
                await parts.put(message.get("body", b""))
                if not more:
                    done.set()

        call = asyncio.create_task(self.app(scope, receive, send))
        try:
            await asyncio.wait([call, streaming], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            call.cancel()
            raise
        if not streaming.done():
            try:
                await call  # re-raises what the app raised
            finally:
                done.set()
            return HttpResponse(status, b"".join(body), content_type, headers)
        relay = _relay(call, parts, done)
        return HttpResponse(status, b"", content_type, headers, stream=relay)


async def _relay(
    call: asyncio.Task[None], parts: asyncio.Queue[bytes], done: asyncio.Event
) -> AsyncGenerator[bytes, None]:
    """A streamed response's parts as the app sends them, until its call ends; closed early
    (the client went away), it tells the app so (``done``: receive() says disconnect) and
    stops the call, and the wait for its next part (none is left pending)."""
    part: asyncio.Future[bytes] | None = None
    try:
        while not (call.done() and parts.empty()):
            part = asyncio.ensure_future(parts.get())
            await asyncio.wait([part, call], return_when=asyncio.FIRST_COMPLETED)
            if part.done():
                yield part.result()
            else:
                part.cancel()
        await call  # re-raises a failure midway (the server then closes the connection)
    finally:
        done.set()
        # Cancelled or closed while waiting, the get() of the next part is still pending.
        await cancel_and_wait([f for f in (part, call) if f is not None and not f.done()])


def _infer_route(request: HttpRequest) -> tuple[str, str] | None:
    """(model, version) of a sync infer path, or None for any other path."""
    path = request.path
    if not path.endswith("/infer") or not path.startswith("/v2/models/"):
        return None
    parts = path.split("/")  # '', 'v2', 'models', model, ['versions', version,] 'infer'
    if len(parts) == 5 and parts[3]:
        return _unquoted(parts[3]), ""
    if len(parts) == 7 and parts[4] == "versions" and parts[3] and parts[5]:
        return _unquoted(parts[3]), _unquoted(parts[5])
    return None


def _unquoted(text: str) -> str:
    return unquote(text) if "%" in text else text


def error(exc: PlazaError) -> HttpResponse:
    """The JSON error answer of ``exc`` (the same status, body and headers as the app's)."""
    status, body = http_error(exc)
    headers = [CHALLENGE] if isinstance(exc, Unauthorized) else []
    return HttpResponse(status, kserve.encode_json(body), _JSON, headers)
