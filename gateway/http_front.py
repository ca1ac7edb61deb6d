"""The gateway's HTTP front: ``plaza.gateway.http_server`` over the Starlette app.

Sync inference (``POST /v2/models/{model}[/versions/{version}]/infer``), the call that
carries the load, is answered here directly: the same checks and the same code as the
Starlette route (``Endpoints.infer_encoded``), without the ASGI layers around it. Every
other request (metadata, health, statistics, async jobs, the model repository) goes to the
Starlette app through a small ASGI bridge, so each route is written once, in
``plaza.gateway.app``, and the unit tests that drive that app cover it.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import MutableMapping
from typing import Any
from urllib.parse import unquote

from starlette.applications import Starlette

from plaza.errors import PlazaError, Unauthorized
from plaza.gateway import kserve
from plaza.gateway.app import Endpoints, decoded_body
from plaza.gateway.errors import http_error
from plaza.gateway.http_server import HttpRequest, HttpResponse

log = logging.getLogger(__name__)

_JSON = kserve.CONTENT_TYPE_JSON
_LENGTH_HEADER = kserve.HEADER_INFERENCE_LENGTH.lower()


class HttpFront:
    """The HTTP server's handler: the infer fast path, the rest through the app."""

    def __init__(self, app: Starlette, api_key: str | None, scheme: str = "http") -> None:
        self.app = app
        self.endpoints: Endpoints = app.state.endpoints
        self.service = self.endpoints.service
        self.max_body = self.service.settings.gateway.max_body_bytes
        self._expected = f"Bearer {api_key}" if api_key is not None else None
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
        if self._expected is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode("latin-1"), self._expected.encode()):
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
                body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    done.set()

        try:
            await self.app(scope, receive, send)
        finally:
            done.set()
        return HttpResponse(status, b"".join(body), content_type, headers)


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
    """The JSON error answer of ``exc`` (the same status and body as the app's handler)."""
    status, body = http_error(exc)
    return HttpResponse(status, kserve.encode_json(body), _JSON)
