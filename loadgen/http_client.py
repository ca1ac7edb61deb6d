"""A KServe v2 HTTP client for load: bodies encoded once, one pooled async session.

Bodies are JSON (``data`` lists) or Triton's binary tensor extension (a JSON header, then
raw little-endian tensors; ``Inference-Header-Content-Length`` gives the header's length).
They are built before the clock starts, so a measurement times the server, not numpy.

The transport is aiohttp when it is importable (it is the faster of the two here), else
httpx; both keep a bounded pool of keep-alive connections.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import orjson

from plaza.datatypes import from_numpy_dtype

HEADER_INFERENCE_LENGTH = "Inference-Header-Content-Length"
JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class EncodedRequest:
    """An infer request body and its headers, ready to send again and again."""

    body: bytes
    headers: dict[str, str]


def _header(name: str, array: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {"name": name, "shape": list(array.shape), "datatype": from_numpy_dtype(array.dtype)}


def json_request(
    inputs: Mapping[str, np.ndarray[Any, Any]],
    *,
    binary_output: bool = False,
    parameters: Mapping[str, Any] | None = None,
) -> EncodedRequest:
    """A KServe v2 JSON body: every input's values as a flat ``data`` list (``parameters``:
    the request's own, such as a sequence's)."""
    doc: dict[str, Any] = {
        "inputs": [{**_header(n, a), "data": a.reshape(-1).tolist()} for n, a in inputs.items()]
    }
    params = dict(parameters or {})
    if binary_output:
        params["binary_data_output"] = True
    if params:
        doc["parameters"] = params
    return EncodedRequest(orjson.dumps(doc), dict(JSON_HEADERS))


def binary_request(
    inputs: Mapping[str, np.ndarray[Any, Any]],
    *,
    binary_output: bool = True,
    parameters: Mapping[str, Any] | None = None,
) -> EncodedRequest:
    """Triton's binary tensor extension: JSON header + raw tensor bytes, in input order."""
    blobs = [
        np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes() for a in inputs.values()
    ]
    doc: dict[str, Any] = {
        "inputs": [
            {**_header(n, a), "parameters": {"binary_data_size": len(b)}}
            for (n, a), b in zip(inputs.items(), blobs, strict=True)
        ],
        "parameters": {**(parameters or {}), "binary_data_output": binary_output},
    }
    header = orjson.dumps(doc)
    headers = {
        "Content-Type": "application/octet-stream",
        HEADER_INFERENCE_LENGTH: str(len(header)),
    }
    return EncodedRequest(b"".join([header, *blobs]), headers)


def response_header(body: bytes, headers: Mapping[str, str]) -> dict[str, Any]:
    """The JSON part of an infer response (all of it, or the binary extension's header)."""
    length = headers.get(HEADER_INFERENCE_LENGTH) or headers.get(HEADER_INFERENCE_LENGTH.lower())
    doc = orjson.loads(body[: int(length)] if length else body)
    if not isinstance(doc, dict):
        raise ValueError("response is not a JSON object")
    return doc


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    body: bytes
    headers: Mapping[str, str]


class HttpTransport(Protocol):
    """The one seam the targets use: POST and GET bytes."""

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> HttpResponse: ...

    async def get(self, url: str) -> HttpResponse: ...

    async def close(self) -> None: ...


class AiohttpTransport:
    def __init__(self, max_connections: int, timeout_s: float) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max_connections, use_dns_cache=True),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            auto_decompress=False,
        )

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> HttpResponse:
        async with self._session.post(url, data=body, headers=dict(headers)) as resp:
            return HttpResponse(resp.status, await resp.read(), resp.headers)

    async def get(self, url: str) -> HttpResponse:
        async with self._session.get(url) as resp:
            return HttpResponse(resp.status, await resp.read(), resp.headers)

    async def close(self) -> None:
        await self._session.close()


class HttpxTransport:
    def __init__(self, max_connections: int, timeout_s: float) -> None:
        import httpx

        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._client = httpx.AsyncClient(limits=limits, timeout=timeout_s)

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> HttpResponse:
        resp = await self._client.post(url, content=body, headers=dict(headers))
        return HttpResponse(resp.status_code, resp.content, resp.headers)

    async def get(self, url: str) -> HttpResponse:
        resp = await self._client.get(url)
        return HttpResponse(resp.status_code, resp.content, resp.headers)

    async def close(self) -> None:
        await self._client.aclose()


def open_transport(max_connections: int = 256, timeout_s: float = 30.0) -> HttpTransport:
    """aiohttp if installed, else httpx (a dev dependency)."""
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return HttpxTransport(max_connections, timeout_s)
    return AiohttpTransport(max_connections, timeout_s)
