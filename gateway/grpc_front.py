"""The KServe v2 gRPC front: Triton's ``GRPCInferenceService`` over the gateway's service.

It serves the service definitions that ship in tritonclient (``service_pb2_grpc``), on the
same ``GatewayService`` as the HTTP front, so both fronts share one producer core, one
model registry and one reply stream. Handlers only map messages (``gateway.grpc_codec``)
and errors (``gateway.errors.grpc_status``); nothing here publishes or waits on its own.

``ModelStreamInfer`` keeps many requests in flight on one stream (at most
``STREAM_MAX_INFLIGHT``, answers not yet sent included; past it the stream stops reading
until one is sent) and sends
each response as it completes, tagged with the request's ``id``, as Triton does. A
decoupled model's request gets each of its responses as it comes, interleaved with the
stream's other requests (at most ``STREAM_MAX_INFLIGHT`` responses wait to be sent; past
it the requests wait, and a request whose responses then pile up in the reply reader past
its bound gets an error). As Triton's stream does, every response carries
``triton_final_response`` (true on a request's last one: an ordinary model's one answer,
an error that ends the request), and ``triton_enable_empty_final_response`` only decides
whether a decoupled model's empty final response is sent too. An error response that a
timed-out wait ends names the job to poll (its message, and a ``job_id`` parameter).
``ModelInfer`` refuses a decoupled model (UNIMPLEMENTED, as Triton). A call the
client cancels, or a stream it closes, stops waiting at once; the producer core then stores
a ``cancelled`` answer, so a worker that has not run the request yet skips it. With
``gateway.tls_cert_file`` set the port serves TLS (``gateway.tls``).

The API key (``gateway.api_key``) is required as ``authorization: Bearer <key>`` metadata on
every RPC but the health ones (ServerLive, ServerReady, ModelReady, and gRPC's own
``grpc.health.v1.Health/Check``: ``gateway.grpc_health``), as over HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from plaza import __version__
from plaza.auth import bearer_matches
from plaza.contract import new_correlation_id
from plaza.errors import ConfigError, InvalidInput, PlazaError, Unauthorized, Unsupported
from plaza.gateway import grpc_codec, grpc_health
from plaza.gateway.app import EXTENSIONS
from plaza.gateway.errors import grpc_status
from plaza.gateway.grpc_server import GrpcServer, alpn_h2, methods_of, ping_policy, tcp_keepalive
from plaza.gateway.http_server import body_bound_s
from plaza.gateway.requests import load_config
from plaza.gateway.service import GatewayService
from plaza.gateway.shared_memory import CUDA_UNSUPPORTED
from plaza.gateway.tls import TlsFiles, grpc_credentials, ssl_context
from plaza.sequence_batching import PARAM_ID
from plaza.settings import PlazaSettings
from plaza.tasks import cancel_and_wait

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
"""Triton's service, as tritonclient's definitions describe it."""

STREAM_MAX_INFLIGHT = 1024
"""Requests one ModelStreamInfer stream may have in flight before it stops reading; also
the responses that may wait to be sent on it."""
PARAM_JOB_ID = "job_id"
"""The parameter of a stream's error response that names the job to poll (a timeout)."""
DECOUPLED_REFUSED = "ModelInfer RPC doesn't support models with decoupled transaction policy"
"""Triton's words for a unary call to a decoupled model (status UNIMPLEMENTED)."""

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Handler = Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]]


def _answers_errors(handler: Handler[Req, Resp]) -> Handler[Req, Resp]:
    """Turn a PlazaError (or any other failure) into the call's gRPC status and message."""

    async def wrapped(self: Any, request: Req, context: grpc.aio.ServicerContext) -> Resp:
        try:
            return await handler(self, request, context)
        except PlazaError as exc:
            await context.abort(grpc_status(exc), _error_text(exc))
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            log.exception("gRPC %s failed", handler.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")
        raise AssertionError("context.abort returned")  # pragma: no cover

    wrapped.__name__ = handler.__name__
    wrapped.__doc__ = handler.__doc__
    return wrapped


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """Triton's gRPC inference service on a ``GatewayService``."""

    def __init__(self, service: GatewayService) -> None:
        self.service = service
        key = service.settings.gateway.api_key
        self._key = None if key is None else key.get_secret_value().encode()

    def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        if self._key is None:
            return
        metadata = context.invocation_metadata() or ()
        given = next((v for k, v in metadata if k == "authorization"), "")
        given_bytes = given.encode() if isinstance(given, str) else bytes(given)
        if not bearer_matches(given_bytes, self._key):
            raise Unauthorized("missing or wrong API key (authorization: Bearer metadata)")

    # -- health (open, like the HTTP health routes) ----------------------------------------
    @_answers_errors
    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.service.live())

    @_answers_errors
    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=(await self.service.ready()).ready)

    @_answers_errors
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        ready = await self.service.model_ready(request.name, request.version)
        return pb.ModelReadyResponse(ready=ready)

    # -- metadata ----------------------------------------------------------------------------
    @_answers_errors
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        self._authorize(context)
        return pb.ServerMetadataResponse(
            name="plaza", version=__version__, extensions=list(EXTENSIONS)
        )

    @_answers_errors
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        self._authorize(context)
        model = self.service.model_metadata(request.name, request.version)
        spec, batches = model.spec, model.spec.max_batch_size > 0

        def tensors(items: Any) -> list[pb.ModelMetadataResponse.TensorMetadata]:
            return [
                pb.ModelMetadataResponse.TensorMetadata(
                    name=t.name, datatype=t.datatype, shape=[-1, *t.dims] if batches else t.dims
                )
                for t in items
            ]

        return pb.ModelMetadataResponse(
            name=spec.name,
            versions=[str(v) for v in model.versions],
            platform=spec.platform,
            inputs=tensors(spec.inputs),
            outputs=tensors(spec.outputs),
        )

    @_answers_errors
    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelConfigResponse:
        self._authorize(context)
        doc = self.service.model_config(request.name, request.version)
        config = json_format.ParseDict(doc, mc.ModelConfig(), ignore_unknown_fields=True)
        return pb.ModelConfigResponse(config=config)

    @_answers_errors
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStatisticsResponse:
        self._authorize(context)
        doc = await self.service.statistics(request.name, request.version)
        return json_format.ParseDict(doc, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    # -- repository ----------------------------------------------------------------------------
    @_answers_errors
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryIndexResponse:
        self._authorize(context)
        index = pb.RepositoryIndexResponse()
        for row in await self.service.repository_index(request.ready):
            index.models.add(name=row.name, version=row.version, state=row.state, reason=row.reason)
        return index

    @_answers_errors
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelLoadResponse:
        self._authorize(context)
        params = {
            k: getattr(v, v.WhichOneof("parameter_choice") or "string_param")
            for k, v in request.parameters.items()
        }
        await self.service.load_model(request.model_name, load_config(params))
        return pb.RepositoryModelLoadResponse()

    @_answers_errors
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelUnloadResponse:
        self._authorize(context)
        flag = request.parameters.get("unload_dependents")
        if flag is not None and flag.WhichOneof("parameter_choice") != "bool_param":
            raise InvalidInput("parameter 'unload_dependents' must be a bool_param")
        await self.service.unload_model(request.model_name, flag is not None and flag.bool_param)
        return pb.RepositoryModelUnloadResponse()

    # -- log settings (Triton's logging extension, plaza/log_settings.py) ------------------------
    @_answers_errors
    async def LogSettings(
        self, request: pb.LogSettingsRequest, context: grpc.aio.ServicerContext
    ) -> pb.LogSettingsResponse:
        self._authorize(context)
        changes = {}
        for name, value in request.settings.items():
            kind = value.WhichOneof("parameter_choice")
            # No value (tritonclient's None): left as it is, as Triton does.
            changes[name] = None if kind is None else getattr(value, kind)
        if changes:
            settings = await self.service.update_log_settings(changes)
        else:
            settings = await self.service.get_log_settings()
        answer = pb.LogSettingsResponse()
        for name, value in dataclasses.asdict(settings).items():
            kind = {bool: "bool_param", int: "uint32_param"}.get(type(value), "string_param")
            setattr(answer.settings[name], kind, value)
        return answer

    # -- trace settings (Triton's trace extension, gateway/tracing.py) ----------------------------
    @_answers_errors
    async def TraceSetting(
        self, request: pb.TraceSettingRequest, context: grpc.aio.ServicerContext
    ) -> pb.TraceSettingResponse:
        self._authorize(context)
        model = request.model_name
        if model:
            self.service.model(model)  # NOT_FOUND for a model not served
        tracer = self.service.tracer
        changes = {name: (list(value.value) or None) for name, value in request.settings.items()}
        settings = tracer.update(model, changes) if changes else tracer.settings(model)
        answer = pb.TraceSettingResponse()
        for name, value in settings.wire().items():
            answer.settings[name].value.extend(value if isinstance(value, list) else [value])
        return answer

    # -- system shared memory (Triton's extension, gateway/shared_memory.py) ----------------------
    @_answers_errors
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.SystemSharedMemoryStatusResponse:
        self._authorize(context)
        answer = pb.SystemSharedMemoryStatusResponse()
        for r in self.service.shm.status(request.name):
            answer.regions[r.name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size
                )
            )
        return answer

    @_answers_errors
    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self._authorize(context)
        self.service.shm.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @_answers_errors
    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self._authorize(context)
        self.service.shm.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    # -- CUDA shared memory: not served ------------------------------------------------------
    # Overridden so that both servers refuse them with the same status and words (grpc.aio
    # would otherwise answer the base class's NotImplementedError as its own message).
    @_answers_errors
    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.CudaSharedMemoryStatusResponse:
        self._authorize(context)
        raise Unsupported(CUDA_UNSUPPORTED)

    @_answers_errors
    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.CudaSharedMemoryRegisterResponse:
        self._authorize(context)
        raise Unsupported(CUDA_UNSUPPORTED)

    @_answers_errors
    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self._authorize(context)
        raise Unsupported(CUDA_UNSUPPORTED)

    # -- inference -----------------------------------------------------------------------------
    async def _infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        self.service.model(request.model_name, request.model_version)  # NOT_FOUND first
        shm = self.service.shm
        decoded = grpc_codec.decode_infer_request(request, shm)
        req = decoded.to_request(request.model_name, request.model_version, new_correlation_id())
        wait_s = self.service.sync_timeout(decoded.timeout_us)
        result = await self.service.infer(req, wait_s)
        return grpc_codec.encode_infer_response(result, request.id, decoded.shm_outputs, shm)

    @_answers_errors
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        self._authorize(context)
        if self.service.model(request.model_name, request.model_version).spec.decoupled:
            raise Unsupported(DECOUPLED_REFUSED, model=request.model_name)
        return await self._infer(request)

    async def _stream_answers(
        self, request: pb.ModelInferRequest
    ) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
        """A stream request's answers: an ordinary model's one, a decoupled model's each."""
        model = self.service.model(request.model_name, request.model_version)
        empty_final = grpc_codec.wants_empty_final(request)
        if not model.spec.decoupled:  # its one response is its final one
            response = await self._infer(request)
            grpc_codec.mark_final(response, True)
            yield pb.ModelStreamInferResponse(infer_response=response)
            return
        decoded = grpc_codec.decode_infer_request(request, self.service.shm)
        if decoded.shm_outputs:
            raise InvalidInput(
                "a decoupled model's outputs cannot go to shared memory: each of its "
                "responses would overwrite the one before"
            )
        req = decoded.to_request(request.model_name, request.model_version, new_correlation_id())
        wait_s = self.service.sync_timeout(decoded.timeout_us)
        async with aclosing(self.service.infer_stream(req, wait_s)) as results:
            async for result in results:
                if result.empty and not empty_final:
                    continue
                if result.error is not None:
                    answer = _stream_error(request, result.error.message, final=result.final)
                else:
                    encoded = grpc_codec.encode_infer_response(result, request.id)
                    answer = pb.ModelStreamInferResponse(infer_response=encoded)
                    grpc_codec.mark_final(answer.infer_response, result.final)
                yield answer

    async def ModelStreamInfer(
        self,
        request_iterator: AsyncIterator[pb.ModelInferRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Many requests in flight on one stream; responses in completion order, by id."""
        try:
            self._authorize(context)
        except PlazaError as exc:
            await context.abort(grpc_status(exc), exc.message)
        stream = _Stream(self._stream_answers, STREAM_MAX_INFLIGHT)
        async for response in stream.run(request_iterator):
            yield response


class _Stream:
    """One ModelStreamInfer call: reads requests, runs them concurrently, yields answers.

    The requests of one sequence (a stateful model's, by their ``sequence_id``) run one
    after the other, in the stream's order: Triton's streaming clients send a whole sequence
    without waiting, and run concurrently, its requests could reach Kafka out of order (the
    first publish of a topic, or a full producer buffer, suspends one and not the next).

    Two bounds hold: at most ``max_inflight`` requests run (a request's slot is freed once
    its last answer is sent), and at most ``max_inflight`` answers wait to be sent (a
    request with more, a decoupled model's, waits for room)."""

    def __init__(
        self,
        answer: Callable[[pb.ModelInferRequest], AsyncGenerator[pb.ModelStreamInferResponse, None]],
        max_inflight: int,
    ) -> None:
        self._answer = answer
        self._slots = asyncio.Semaphore(max_inflight)
        self._room = asyncio.Semaphore(max_inflight)
        self._answers: asyncio.Queue[_Queued | None] = asyncio.Queue()
        """Answers to send, and a request's end (no answer: frees its slot); None: the end."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._tails: dict[_SequenceKey, asyncio.Task[None]] = {}
        """Each sequence's latest request in flight: the next one waits for it."""

    async def run(
        self, requests: AsyncIterator[pb.ModelInferRequest]
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        reader = asyncio.create_task(self._read(requests))
        try:
            while (queued := await self._answers.get()) is not None:
                answer, last = queued
                if answer is not None:
                    yield answer
                    self._room.release()  # sent: the answers waiting stay bounded
                if last:
                    self._slots.release()  # the request's last answer is sent
            await reader  # re-raises a failure of the reader
        finally:  # the client went away, or the stream ended: stop every wait
            await cancel_and_wait([reader, *self._tasks])

    async def _read(self, requests: AsyncIterator[pb.ModelInferRequest]) -> None:
        try:
            async for request in requests:
                await self._slots.acquire()  # bounded: one slot per request in flight
                key = _sequence_key(request)
                before = None if key is None else self._tails.get(key)
                task = asyncio.create_task(self._one(request, before))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                if key is not None:
                    self._tails[key] = task
                    task.add_done_callback(functools.partial(self._untail, key))
            while self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            self._answers.put_nowait(None)

    def _untail(self, key: _SequenceKey, task: asyncio.Task[None]) -> None:
        if self._tails.get(key) is task:
            del self._tails[key]

    async def _one(
        self, request: pb.ModelInferRequest, before: asyncio.Task[None] | None = None
    ) -> None:
        if before is not None:
            await asyncio.wait([before])  # its sequence's request before it, answered first
        try:
            async with aclosing(self._answer(request)) as answers:
                async for answer in answers:
                    await self._send(answer)
        except PlazaError as exc:
            await self._send(_stream_error(request, _error_text(exc), exc.details.get("job_id")))
        except Exception as exc:
            log.exception("gRPC stream request failed")
            await self._send(_stream_error(request, f"internal error: {type(exc).__name__}"))
        self._answers.put_nowait((None, True))

    async def _send(self, answer: pb.ModelStreamInferResponse) -> None:
        await self._room.acquire()
        self._answers.put_nowait((answer, False))


_Queued = tuple[pb.ModelStreamInferResponse | None, bool]
"""An answer to send (or None) and whether its request ends there."""


_SequenceKey = tuple[str, int | float | str | bool]
"""A request's ``sequence_id`` as the stream orders by it: its value's type and the value
(int64 7 and uint64 7 are one sequence; a double 7.0 or a bool true is not sequence 7)."""


def _sequence_key(request: pb.ModelInferRequest) -> _SequenceKey | None:
    """The request's ``sequence_id`` parameter, typed (None: it has none, or 0 / "",
    Triton's "no sequence"). One of a type Triton refuses (a double, a bool) is kept in
    order too: a stateful model refuses it (``invalid_input``, ``plaza.sequence_batching.
    sequence_flags``) in its place among the stream's answers; another model ignores it."""
    param = request.parameters.get(PARAM_ID)
    kind = None if param is None else param.WhichOneof("parameter_choice")
    if kind is None:
        return None
    value: int | float | str | bool = getattr(param, kind)
    if isinstance(value, int | str) and not isinstance(value, bool) and not value:
        return None
    return (type(value).__name__, value)


def _error_text(exc: PlazaError) -> str:
    """A gRPC error's message: ``exc``'s, naming the job to poll where it has one (a wait
    that timed out) and does not say it yet: the HTTP front's body has ``job_id`` beside it,
    a gRPC status has only its message."""
    job_id = exc.details.get("job_id")
    if job_id is None or str(job_id) in exc.message:
        return exc.message
    return f"{exc.message} (job_id {job_id})"


def _stream_error(
    request: pb.ModelInferRequest, message: str, job_id: object = None, *, final: bool = True
) -> pb.ModelStreamInferResponse:
    """A stream's per-request error: the message, and the request's id and model, with
    ``triton_final_response`` (Triton sets it on every stream response, error ones too;
    an error raised here ends its request) and the ``job_id`` to poll, where there is one."""
    echo = pb.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    grpc_codec.mark_final(echo, final)
    if job_id is not None:
        echo.parameters[PARAM_JOB_ID].string_param = str(job_id)
    return pb.ModelStreamInferResponse(error_message=message, infer_response=echo)


def server_options(settings: PlazaSettings) -> list[tuple[str, Any]]:
    """grpc.aio's channel options: message sizes from ``gateway.max_body_bytes``, and
    keepalive and ping policy from the ``gateway.grpc_keepalive_*`` and
    ``gateway.grpc_http2_*`` settings (Triton's ``--grpc-keepalive-*`` and
    ``--grpc-http2-*`` flags, passed to grpc-core as Triton passes them); ``SO_REUSEPORT``
    only where ``gateway.workers`` > 1."""
    gw = settings.gateway
    return [
        ("grpc.max_receive_message_length", gw.max_body_bytes),
        ("grpc.max_send_message_length", max(gw.max_body_bytes, 64 * 1024 * 1024)),
        ("grpc.keepalive_time_ms", gw.grpc_keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", gw.grpc_keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(gw.grpc_keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", gw.grpc_http2_max_pings_without_data),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            gw.grpc_http2_min_recv_ping_interval_without_data_ms,
        ),
        ("grpc.http2.max_ping_strikes", gw.grpc_http2_max_ping_strikes),
        # the port is shared with this gateway's other processes only, as by plaza's server
        ("grpc.so_reuseport", int(gw.workers > 1)),
    ]


class Stoppable(Protocol):
    async def stop(self, grace: float | None) -> None: ...


async def start_server(
    service: GatewayService, host: str, port: int, tls: TlsFiles | None = None
) -> tuple[Stoppable, int]:
    """The gRPC front listening on ``host:port`` (0: a free port), on the server that
    ``gateway.grpc_server`` names (``plaza``: the gateway's own, ``gateway.grpc_server``;
    ``grpcio``: grpc.aio); returns it and the port it bound. The gateway's own server
    shares the port (``SO_REUSEPORT``) only with the gateway's other processes
    (``gateway.workers`` > 1): a single gateway refuses a port that another one holds."""
    if service.settings.gateway.grpc_server == "grpcio":
        server, bound = create_server(service, host, port, tls)
        await server.start()
        return server, bound
    methods = methods_of(SERVICE, InferenceServicer(service), pb_grpc.GRPCInferenceServiceServicer)
    methods.update(methods_of(grpc_health.SERVICE, health_servicer(service), object))
    gw = service.settings.gateway
    own = GrpcServer(
        methods,
        max_message_bytes=gw.max_body_bytes,
        max_buffered_bytes=gw.grpc_max_buffered_bytes or None,
        max_message_s=body_bound_s(gw.max_body_s),
        ssl_context=alpn_h2(ssl_context(tls)),
        # it strikes a client's pings as grpc-core does, and sends none of its own: TCP
        # keepalive in their place
        tcp_keepalive=tcp_keepalive(gw.grpc_keepalive_time_ms, gw.grpc_keepalive_timeout_ms),
        pings=ping_policy(gw),
    )
    return own, await own.start(host, port, reuse_port=gw.workers > 1)


def health_servicer(service: GatewayService) -> grpc_health.HealthServicer:
    """gRPC's health service, SERVING when the gateway is ready (``/v2/health/ready``)."""

    async def ready() -> bool:
        return (await service.ready()).ready

    return grpc_health.HealthServicer(ready)


def create_server(
    service: GatewayService, host: str, port: int, tls: TlsFiles | None = None
) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server with the inference service bound to ``host:port`` (not started),
    and the port it bound (``port`` 0: a free one); over TLS when ``tls`` is given."""
    server = grpc.aio.server(options=server_options(service.settings))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(service), server)
    server.add_generic_rpc_handlers((grpc_health.generic_handler(health_servicer(service)),))
    address = f"{host}:{port}"
    try:  # grpcio answers a port it cannot bind with 0, or (newer ones) RuntimeError
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, grpc_credentials(tls))
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise ConfigError(f"the gRPC front cannot listen on {host}:{port}: port in use?")
    return server, bound
