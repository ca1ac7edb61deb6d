"""The HTTP front: KServe v2 / Triton routes on Starlette, over ``GatewayService``.

Each endpoint decodes (``plaza.gateway.kserve``), calls the service, encodes; PlazaErrors become
statuses in one exception handler (``plaza.gateway.errors``). There is no per-request validation
layer besides the one the worker also runs (``plaza.validation``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from plaza import __version__
from plaza.auth import CHALLENGE, bearer_matches
from plaza.contract import InferRequest, new_correlation_id
from plaza.errors import (
    ConfigError,
    InvalidInput,
    JobNotFound,
    PayloadTooLarge,
    PlazaError,
    SharedMemoryError,
    Unauthorized,
    Unsupported,
)
from plaza.gateway import generate, kserve
from plaza.gateway.errors import http_error
from plaza.gateway.requests import load_config
from plaza.gateway.service import GatewayService
from plaza.gateway.shared_memory import CUDA_UNSUPPORTED
from plaza.modelconfig import ModelSpec
from plaza.results import JobStatus, JobView, step_answer
from plaza.settings import PlazaSettings
from plaza.tensors import Buffer

HEALTH_PREFIX = "/v2/health/"
"""Health endpoints answer without an API key (probes carry none)."""
EXTENSIONS = (
    "classification",
    "binary_tensor_data",
    "model_configuration",
    "parameters",
    "statistics",
    "model_repository",
    "schedule_policy",
    "sequence",
    "system_shared_memory",
    "logging",
    "trace",
    "generate",
    "plaza_async_jobs",
)
_DECOMPRESS_WBITS = {"gzip": 31, "deflate": 15}
MAX_GZIP_MEMBERS = 16
"""gzip members a request body may hold: each member's read copies the bytes after it, so a
body of many tiny members would cost time in the square of its size (clients send one)."""
DECOUPLED_REFUSED = "HTTP end point doesn't support models with decoupled transaction policy"
"""Triton's words for a sync infer call to a decoupled model (400)."""


class JSONBody(Response):
    """A JSON response rendered with orjson."""

    media_type = kserve.CONTENT_TYPE_JSON

    def render(self, content: Any) -> bytes:
        return kserve.encode_json(content)


def tensor_response(body: kserve.EncodedBody, status_code: int = 200) -> Response:
    """An infer response: JSON, or JSON header + binary tensors with the length header."""
    headers = None
    if body.header_length is not None:
        headers = {kserve.HEADER_INFERENCE_LENGTH: str(body.header_length)}
    return Response(body.content, status_code, headers, media_type=body.content_type)


def error_response(error: PlazaError) -> Response:
    status, body = http_error(error)
    return JSONBody(body, status, dict([CHALLENGE]) if isinstance(error, Unauthorized) else None)


# -- request bodies -------------------------------------------------------------------------


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, decompressed if it says so; PayloadTooLarge past ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return decoded_body(b"".join(chunks), request.headers.get("content-encoding"), limit)


def decoded_body(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """``body`` as its Content-Encoding header (None: identity) says to read it."""
    if content_encoding is None:
        return body
    encoding = content_encoding.strip().lower()
    return body if encoding == "identity" else decompress(body, encoding, limit)


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """gzip or deflate (tritonclient's request compression), bounded by ``limit``. A gzip
    body may be several members, one after another (RFC 1952 §2.2), up to
    ``MAX_GZIP_MEMBERS``: each is read. Bytes after the end of the data (after a deflate
    stream, or a gzip body's last member, that are no member) are refused, not dropped."""
    wbits = _DECOMPRESS_WBITS.get(encoding)
    if wbits is None:
        raise InvalidInput(f"unsupported Content-Encoding {encoding!r} (gzip, deflate)")
    parts: list[bytes] = []
    size = 0
    rest = body
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            part = inflater.decompress(rest, limit + 1 - size)
        except zlib.error as exc:
            raise InvalidInput(f"request body is not valid {encoding}: {exc}") from exc
        size += len(part)
        if size > limit:
            raise PayloadTooLarge(f"decompressed request body is over the limit of {limit} bytes")
        if not inflater.eof:
            raise InvalidInput(f"request body is truncated {encoding} data")
        parts.append(part)
        rest = inflater.unused_data
        if not rest:
            return parts[0] if len(parts) == 1 else b"".join(parts)
        if encoding != "gzip":
            raise InvalidInput(f"request body has bytes after the end of its {encoding} data")
        if len(parts) >= MAX_GZIP_MEMBERS:
            raise InvalidInput(f"request body has more than {MAX_GZIP_MEMBERS} gzip members")


# -- auth -----------------------------------------------------------------------------------


def is_health_path(path: str) -> bool:
    """Paths open without an API key, as Triton's HEALTH category: server live and ready, and
    a model's (or version's) ready, ``/v2/models/{m}[/versions/{v}]/ready`` by segments
    (``/v2/models/ready`` is the metadata of a model named ready, and stays guarded)."""
    if path.startswith(HEALTH_PREFIX):
        return True
    parts = path.split("/")  # '', 'v2', 'models', model, ['versions', version,] 'ready'
    if parts[:3] != ["", "v2", "models"] or parts[-1] != "ready" or not parts[3]:
        return False
    return len(parts) == 5 or (len(parts) == 7 and parts[4] == "versions" and bool(parts[5]))


class BearerAuth:
    """Requires ``Authorization: Bearer <api_key>`` on every path but the health ones."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_health_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        if bearer_matches(given, self._key):
            await self.app(scope, receive, send)
            return
        response = error_response(Unauthorized("missing or wrong API key (Authorization: Bearer)"))
        await response(scope, receive, send)


# -- endpoints ------------------------------------------------------------------------------


def _model_path(request: Request) -> tuple[str, str]:
    params = request.path_params
    return str(params["model"]), str(params.get("version", ""))


class Endpoints:
    """The route handlers; each decodes, calls the service and encodes."""

    def __init__(self, service: GatewayService) -> None:
        self.service = service
        self._max_body = service.settings.gateway.max_body_bytes

    async def server_metadata(self, request: Request) -> Response:
        return JSONBody(kserve.server_metadata(__version__, EXTENSIONS))

    async def live(self, request: Request) -> Response:
        live = self.service.live()
        return JSONBody({"live": live}, 200 if live else 503)

    async def ready(self, request: Request) -> Response:
        state = await self.service.ready()
        body = {"ready": state.ready, "reasons": list(state.reasons)}
        return JSONBody(body, 200 if state.ready else 503)

    async def model_metadata(self, request: Request) -> Response:
        model = self.service.model_metadata(*_model_path(request))
        return JSONBody(kserve.model_metadata(model.spec, model.versions))

    async def model_ready(self, request: Request) -> Response:
        """200 when ready; 503 when not, a model (or version) not loaded too, as gRPC's
        ModelReady answers ready=false for it and Triton answers it as not ready (this
        route is open without an API key: it does not tell loaded names from others)."""
        name, version = _model_path(request)
        ready = await self.service.model_ready(name, version)
        return JSONBody({"name": name, "ready": ready}, 200 if ready else 503)

    async def model_config(self, request: Request) -> Response:
        return JSONBody(self.service.model_config(*_model_path(request)))

    async def model_stats(self, request: Request) -> Response:
        params = request.path_params
        name, version = str(params.get("model", "")), str(params.get("version", ""))
        return JSONBody(await self.service.statistics(name, version))

    async def _infer_body(self, request: Request, model: str, version: str) -> kserve.InferBody:
        self.service.model(model, version)  # 404 before reading a body for nothing
        raw = await read_body(request, self._max_body)
        length = kserve.parse_header_length(request.headers.get(kserve.HEADER_INFERENCE_LENGTH))
        return kserve.decode_infer_request(raw, length, self.service.shm)

    async def infer(self, request: Request) -> Response:
        model, version = _model_path(request)
        self.service.model(model, version)  # 404 before reading a body for nothing
        raw = await read_body(request, self._max_body)
        length = request.headers.get(kserve.HEADER_INFERENCE_LENGTH)
        return tensor_response(await self.infer_encoded(model, version, raw, length))

    async def infer_encoded(
        self, model: str, version: str, raw: bytes, header_length: str | None
    ) -> kserve.EncodedBody:
        """A sync inference from its (decoded) body to its encoded answer: what both the
        Starlette route and the gateway's own HTTP server (``plaza.gateway.http_front``) run."""
        if self.service.model(model, version).spec.decoupled:
            raise Unsupported(DECOUPLED_REFUSED, model=model)
        length = kserve.parse_header_length(header_length)
        body = kserve.decode_infer_request(raw, length, self.service.shm)
        req = body.to_request(model, version, new_correlation_id())
        result = await self.service.infer(req, self.service.sync_timeout(body.timeout_us))
        return kserve.encode_infer_response(
            result,
            response_id=body.client_id or req.id,
            binary=body.wants_binary,
            shm=body.shm_of if body.uses_shm_outputs else None,
            regions=self.service.shm,
        )

    async def submit_job(self, request: Request) -> Response:
        model, version = _model_path(request)
        body = await self._infer_body(request, model, version)
        if body.uses_shm_outputs:  # as the other shared memory refusals: shared_memory
            raise SharedMemoryError(
                "an async job cannot write its outputs to shared memory: its answer is "
                "polled later (GET /v2/jobs/{job_id}); request them in the response"
            )
        req = body.to_request(model, version, new_correlation_id())
        job_id = await self.service.submit(req, _job_view(body))
        accepted = {"job_id": job_id, "id": body.client_id or job_id}
        return JSONBody(accepted, 202)

    async def poll_job(self, request: Request) -> Response:
        job_id = str(request.path_params["job_id"])
        status = await self.service.poll(job_id)
        if step_answer(job_id, status):
            raise JobNotFound(f"no job {job_id!r} (an ensemble step's id)", job_id=job_id)
        if status.state == "pending" or status.result is None:
            return JSONBody({"status": "pending", "job_id": job_id})
        result, view = status.result, status.view
        binary = request.query_params.get("binary_data_output", "").lower() == "true"
        if self.service.decoupled(result, status.decoupled):
            chosen = functools.partial(view.wants_binary, asked=binary)
            return tensor_response(_decoupled_job(job_id, status, chosen))
        if result.error is not None:
            error = {"status": "error", "job_id": job_id, "error": result.error.message}
            return JSONBody({**error, "code": result.error.code})
        encoded = kserve.encode_infer_response(
            result,
            response_id=view.client_id or job_id,
            binary=lambda name: view.wants_binary(name, binary),
            extra={"status": "done", "job_id": job_id},
        )
        return tensor_response(encoded)

    # -- Triton's generate extension (plaza.gateway.generate) ---------------------------
    async def generate(self, request: Request) -> Response:
        model, version = _model_path(request)
        spec = self.service.model(model, version).spec  # 404 before reading a body
        if spec.decoupled:
            raise Unsupported(
                f"model {model!r} is decoupled (it may answer many times) and generate "
                "returns one answer: use generate_stream",
                model=model,
            )
        return JSONBody(await self._generated(request, spec))

    async def generate_stream(self, request: Request) -> Response:
        model, version = _model_path(request)
        spec = self.service.model(model, version).spec  # 404 before reading a body
        if not spec.decoupled:
            answer = generate.sse_event(await self._generated(request, spec))
            return Response(answer, media_type=generate.CONTENT_TYPE_SSE)
        req, client_id, timeout_s = await self._generate_request(request, spec)
        events = generate.sse_events(self.service.infer_stream(req, timeout_s), client_id)
        try:
            first = await anext(events)  # an error before it is answered with its status
        except StopAsyncIteration:  # the model closed the request without a response
            return Response(b"", media_type=generate.CONTENT_TYPE_SSE)
        return StreamingResponse(_events_from(first, events), media_type=generate.CONTENT_TYPE_SSE)

    async def _generate_request(
        self, request: Request, spec: ModelSpec
    ) -> tuple[InferRequest, str | None, float]:
        """The request a generate body makes, the client's ``id``, and the wait."""
        model, version = _model_path(request)
        doc = generate.load_generate_body(await read_body(request, self._max_body))
        front, client_id = generate.decode_generate_request(doc, spec)
        req = front.to_request(model, version, new_correlation_id())
        return req, client_id, self.service.sync_timeout(front.timeout_us)

    async def _generated(self, request: Request, spec: ModelSpec) -> dict[str, Any]:
        req, client_id, timeout_s = await self._generate_request(request, spec)
        result = await self.service.infer(req, timeout_s)
        return generate.generate_response(result, client_id)

    # -- model repository (Triton's model control) -------------------------------------
    async def _json_object(self, request: Request) -> dict[str, Any]:
        raw = await read_body(request, self._max_body)
        if not raw.strip():
            return {}
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(f"request body is not valid JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise InvalidInput("request body must be a JSON object")
        return doc

    async def repository_index(self, request: Request) -> Response:
        ready = (await self._json_object(request)).get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidInput("'ready' must be true or false")
        rows = await self.service.repository_index(ready)
        return JSONBody(
            [{k: v for k, v in dataclasses.asdict(r).items() if v or k == "name"} for r in rows]
        )

    async def load_model(self, request: Request) -> Response:
        params = (await self._json_object(request)).get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidInput("'parameters' must be a JSON object")
        await self.service.load_model(str(request.path_params["model"]), load_config(params))
        return Response(status_code=200)

    async def unload_model(self, request: Request) -> Response:
        params = (await self._json_object(request)).get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidInput("'parameters' must be a JSON object")
        dependents = params.get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidInput("'parameters.unload_dependents' must be true or false")
        await self.service.unload_model(str(request.path_params["model"]), dependents)
        return Response(status_code=200)

    # -- log settings (Triton's logging extension, plaza/log_settings.py) ------------------
    async def get_log_settings(self, request: Request) -> Response:
        settings = await self.service.get_log_settings()
        return JSONBody(dataclasses.asdict(settings))

    async def update_log_settings(self, request: Request) -> Response:
        changes = await self._json_object(request)
        settings = await self.service.update_log_settings(changes)
        return JSONBody(dataclasses.asdict(settings))

    # -- trace settings (Triton's trace extension, gateway/tracing.py) ---------------------
    async def get_trace_settings(self, request: Request) -> Response:
        model = str(request.path_params.get("model", ""))
        if model:
            self.service.model(model)  # 404 for a model not served
        return JSONBody(self.service.tracer.settings(model).wire())

    async def update_trace_settings(self, request: Request) -> Response:
        model = str(request.path_params.get("model", ""))
        if model:
            self.service.model(model)
        changes = await self._json_object(request)
        return JSONBody(self.service.tracer.update(model, changes).wire())

    # -- system shared memory (Triton's extension, gateway/shared_memory.py) ----------------
    async def shm_status(self, request: Request) -> Response:
        regions = self.service.shm.status(str(request.path_params.get("name", "")))
        return JSONBody([dataclasses.asdict(r) for r in regions])

    async def cuda_shm(self, request: Request) -> Response:
        """Triton's CUDA shared memory routes: refused by name (no CUDA memory is shared),
        as gRPC's calls are, not an unknown route's 404."""
        raise Unsupported(CUDA_UNSUPPORTED)

    async def shm_register(self, request: Request) -> Response:
        doc = await self._json_object(request)
        key, offset, size = doc.get("key"), doc.get("offset", 0), doc.get("byte_size")
        if not isinstance(key, str):
            raise InvalidInput("register needs 'key' (a string): the shared memory object")
        if type(offset) is not int or type(size) is not int:
            raise InvalidInput("register needs 'offset' and 'byte_size' as integers")
        self.service.shm.register(str(request.path_params["name"]), key, offset, size)
        return Response(status_code=200)

    async def shm_unregister(self, request: Request) -> Response:
        self.service.shm.unregister(str(request.path_params.get("name", "")))
        return Response(status_code=200)

    def routes(self) -> list[BaseRoute]:
        """Every route; the hot ones first (Starlette tries routes in order)."""
        bases = ("/v2/models/{model}", "/v2/models/{model}/versions/{version}")
        routes: list[BaseRoute] = [Route(f"{b}/infer", self.infer, methods=["POST"]) for b in bases]
        routes += [Route(f"{b}/jobs", self.submit_job, methods=["POST"]) for b in bases]
        routes += [Route(f"{b}/generate", self.generate, methods=["POST"]) for b in bases]
        routes += [
            Route(f"{b}/generate_stream", self.generate_stream, methods=["POST"]) for b in bases
        ]
        routes += [
            Route("/v2/jobs/{job_id}", self.poll_job, methods=["GET"]),
            Route("/v2", self.server_metadata, methods=["GET"]),
            Route("/v2/health/live", self.live, methods=["GET"]),
            Route("/v2/health/ready", self.ready, methods=["GET"]),
            Route("/v2/models/stats", self.model_stats, methods=["GET"]),  # before {model}
            Route("/v2/repository/index", self.repository_index, methods=["POST"]),
            Route("/v2/repository/models/{model}/load", self.load_model, methods=["POST"]),
            Route("/v2/repository/models/{model}/unload", self.unload_model, methods=["POST"]),
        ]
        routes += [
            Route("/v2/logging", self.get_log_settings, methods=["GET"]),
            Route("/v2/logging", self.update_log_settings, methods=["POST"]),
            Route("/v2/trace/setting", self.get_trace_settings, methods=["GET"]),
            Route("/v2/trace/setting", self.update_trace_settings, methods=["POST"]),
        ]
        shm = "/v2/systemsharedmemory"
        routes += [
            Route(f"{shm}/status", self.shm_status, methods=["GET"]),
            Route(f"{shm}/region/{{name}}/status", self.shm_status, methods=["GET"]),
            Route(f"{shm}/region/{{name}}/register", self.shm_register, methods=["POST"]),
            Route(f"{shm}/region/{{name}}/unregister", self.shm_unregister, methods=["POST"]),
            Route(f"{shm}/unregister", self.shm_unregister, methods=["POST"]),
        ]
        cuda = "/v2/cudasharedmemory"
        routes += [
            Route(f"{cuda}/status", self.cuda_shm, methods=["GET"]),
            Route(f"{cuda}/region/{{name}}/status", self.cuda_shm, methods=["GET"]),
            Route(f"{cuda}/region/{{name}}/register", self.cuda_shm, methods=["POST"]),
            Route(f"{cuda}/region/{{name}}/unregister", self.cuda_shm, methods=["POST"]),
            Route(f"{cuda}/unregister", self.cuda_shm, methods=["POST"]),
        ]
        for base in bases:
            routes += [
                Route(f"{base}/stats", self.model_stats, methods=["GET"]),
                Route(base, self.model_metadata, methods=["GET"]),
                Route(f"{base}/ready", self.model_ready, methods=["GET"]),
                Route(f"{base}/config", self.model_config, methods=["GET"]),
            ]
        model_trace = "/v2/models/{model}/trace/setting"
        routes += [
            Route(model_trace, self.get_trace_settings, methods=["GET"]),
            Route(model_trace, self.update_trace_settings, methods=["POST"]),
        ]
        return routes


async def _events_from(
    first: bytes, events: AsyncGenerator[bytes, None]
) -> AsyncGenerator[bytes, None]:
    """``first``, then the rest of ``events`` (closed when the client goes away)."""
    async with contextlib.aclosing(events):
        yield first
        async for event in events:
            yield event


def _job_view(body: kserve.InferBody) -> JobView:
    """How the job of ``body`` wants its answer: its ``id`` and its binary choices."""
    outputs = {out.name: out.binary for out in body.outputs if out.binary is not None}
    return JobView(body.client_id, body.binary_output, outputs)


def _decoupled_job(
    job_id: str, status: JobStatus, binary: Callable[[str], bool]
) -> kserve.EncodedBody:
    """A done decoupled model's job: ``responses`` holds each response as the poll endpoint
    renders one result (an output binary where ``binary`` picks it, its bytes after the
    JSON header in the order of the responses and their outputs) or, for an error
    response, its ``error`` and ``code``; a final response that is an error makes the
    job's ``status`` ``error``. A response that JSON cannot carry (a BYTES output that is
    not UTF-8, asked as JSON) is rendered as its error in its place: the others stand."""
    response_id = status.view.client_id or job_id
    final = status.result
    assert final is not None
    doc: dict[str, Any] = {
        "status": "done",
        "job_id": job_id,
        "model_name": final.model,
        "model_version": final.version,
    }
    responses: list[dict[str, Any]] = []
    blobs: list[Buffer] = []
    for result in status.responses:
        if result.error is not None:
            responses.append({"error": result.error.message, "code": result.error.code})
            continue
        try:
            responses.append(kserve.result_doc(result, response_id, binary, blobs))
        except InvalidInput as exc:
            responses.append({"error": exc.message, "code": exc.code})
    if final.error is not None:
        doc.update(status="error", error=final.error.message, code=final.error.code)
        if status.responses and status.responses[-1] is final:
            responses.pop()  # the final error is the job's own, at the top
    doc["responses"] = responses
    if status.missing:
        doc["missing_responses"] = status.missing
    header = kserve.encode_json(doc)
    if not blobs:
        return kserve.EncodedBody(header)
    return kserve.EncodedBody(b"".join([header, *blobs]), header_length=len(header))


# -- the application ------------------------------------------------------------------------


async def _plaza_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, PlazaError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONBody({"error": exc.detail, "code": "http_error"}, exc.status_code, exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    return error_response(PlazaError(f"internal error: {type(exc).__name__}"))


def create_app(settings: PlazaSettings, service: GatewayService | None = None) -> Starlette:
    """The gateway's ASGI app; its lifespan starts and stops the service."""
    svc = service or GatewayService(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await svc.start()
            yield
        finally:
            await svc.stop()

    middleware: list[Middleware] = []
    key = api_key(settings)
    if key is not None:
        middleware.append(Middleware(BearerAuth, api_key=key))
    endpoints = Endpoints(svc)
    app = Starlette(
        routes=endpoints.routes(),
        middleware=middleware,
        exception_handlers={
            PlazaError: _plaza_error,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
        lifespan=lifespan,
    )
    # a path with a slash too many is the JSON 404 of any unknown path, not Starlette's 307 to
    # a Location built from the client's Host header
    app.router.redirect_slashes = False
    app.state.service = svc
    app.state.endpoints = endpoints
    return app


def api_key(settings: PlazaSettings) -> str | None:
    """The gateway's API key, or None for no auth; ConfigError for an empty one."""
    if settings.gateway.api_key is None:
        return None
    key = settings.gateway.api_key.get_secret_value()
    if not key.strip():  # `Authorization: Bearer ` would pass: refuse rather than guess
        raise ConfigError("gateway.api_key is empty: set a key, or unset it for no auth")
    return key
