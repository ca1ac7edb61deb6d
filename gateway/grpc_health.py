"""gRPC's standard health service (``grpc.health.v1.Health``) on the gateway's gRPC port.

What Kubernetes' gRPC probes, ``grpc_health_probe`` and load balancers ask, as Triton also
serves it next to its own ServerLive/ServerReady: ``Check`` with the service ``""`` (the
whole server) or ``inference.GRPCInferenceService`` answers SERVING when the gateway is
ready (Kafka and Redis answer, every loaded model has a live worker: the same test as
``/v2/health/ready``) and NOT_SERVING otherwise; any other service name is NOT_FOUND.
``Watch`` is UNIMPLEMENTED, as in Triton. Open like the other health calls: no API key.

The two messages and the service are described here (field numbers and names from gRPC's
``health.proto``) in a descriptor pool of this module's own, so neither the
``grpcio-health-checking`` package nor its generated code is needed, and a process that
loads that package too sees no clash.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import ServiceDescriptor

PACKAGE = "grpc.health.v1"
SERVED = ("", "inference.GRPCInferenceService")
"""The service names ``Check`` answers for: the server as a whole, and Triton's service."""


def _describe() -> ServiceDescriptor:
    f = descriptor_pb2.FileDescriptorProto(
        name="plaza/grpc_health_v1.proto", package=PACKAGE, syntax="proto3"
    )
    field = descriptor_pb2.FieldDescriptorProto
    request = f.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    response = f.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        status.value.add(name=name, number=number)
    response.field.add(
        name="status",
        number=1,
        type=field.TYPE_ENUM,
        type_name=f".{PACKAGE}.HealthCheckResponse.ServingStatus",
        label=field.LABEL_OPTIONAL,
    )
    service = f.service.add(name="Health")
    for name, streams in (("Check", False), ("Watch", True)):
        service.method.add(
            name=name,
            input_type=f".{PACKAGE}.HealthCheckRequest",
            output_type=f".{PACKAGE}.HealthCheckResponse",
            server_streaming=streams,
        )
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(f.SerializeToString())
    return pool.FindServiceByName(f"{PACKAGE}.Health")


SERVICE = _describe()
"""``grpc.health.v1.Health``, as a protobuf service descriptor."""
HealthCheckRequest: Any = message_factory.GetMessageClass(
    SERVICE.methods_by_name["Check"].input_type
)
HealthCheckResponse: Any = message_factory.GetMessageClass(
    SERVICE.methods_by_name["Check"].output_type
)
SERVING = 1
NOT_SERVING = 2


class HealthServicer:
    """``Check`` over a readiness test (``GatewayService.ready``'s verdict)."""

    def __init__(self, ready: Callable[[], Awaitable[bool]]) -> None:
        self._ready = ready

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request.service not in SERVED:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        status = SERVING if await self._ready() else NOT_SERVING
        return HealthCheckResponse(status=status)


def generic_handler(servicer: HealthServicer) -> grpc.GenericRpcHandler:
    """The service for grpc.aio's ``add_generic_rpc_handlers``."""
    check = grpc.unary_unary_rpc_method_handler(
        servicer.Check,
        request_deserializer=HealthCheckRequest.FromString,
        response_serializer=HealthCheckResponse.SerializeToString,
    )
    return grpc.method_handlers_generic_handler(f"{PACKAGE}.Health", {"Check": check})
