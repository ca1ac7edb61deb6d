"""The request envelope and result entry: Plaza's wire contract as Python values.

docs/protocol.md describes the same contract for producers in other languages; the codec
(``plaza.codec``) turns these values into msgpack and back.

They are frozen ``msgspec.Struct`` types, not dataclasses: a worker builds several per
request, and a Struct is built in a fifth of a dataclass's time (docs/benchmarks.md, goal 3).
``msgspec.structs.replace`` copies one with fields changed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

import msgspec

from plaza.tensors import Tensor

ENVELOPE_VERSION = 1
"""Version of the request and result maps; a worker refuses versions it does not speak."""

Scalar = str | int | float | bool

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The range of a 64-bit signed integer: what a response parameter's int may hold (gRPC's
``int64_param``)."""


def new_correlation_id() -> str:
    """A fresh correlation id: 128 random bits as 32 hex digits (the form of a uuid4's
    ``hex``). Random, not counted, since an id is what reads a result. ``os.urandom``
    directly: a fifth of ``uuid.uuid4().hex``'s cost, paid on every request a front or
    the SDK makes."""
    return os.urandom(16).hex()


NO_PARAMETERS: Mapping[str, Scalar] = MappingProxyType({})
"""The parameters of a result that has none: one shared, read-only empty mapping, so a
result costs no dict of its own for them."""


class ReplyTo(msgspec.Struct, frozen=True):
    """Where a worker writes a request's result.

    The result is always stored under the per-correlation-id result key (that key is also
    what makes writes idempotent); ``stream`` adds an entry to a Redis stream as well.
    """

    stream: str | None = None
    """Full Redis stream name (a gateway's reply stream or a pipeline's own), or None."""


class InferRequest(msgspec.Struct, frozen=True):
    """One inference request, as published to a model's Kafka topic."""

    id: str
    """Correlation id: unique per request; the result is keyed by it."""
    model: str
    version: str
    """Model version as a decimal string; "" means the version policy's default (latest)."""
    inputs: tuple[Tensor, ...]
    outputs: tuple[str, ...] = ()
    """Requested output names; empty means every output of the model."""
    reply: ReplyTo = ReplyTo()
    deadline_ms: int | None = None
    """Absolute deadline, Unix epoch milliseconds; None uses the model's queue policy."""
    priority: int = 0
    """Priority level (1 is highest, as in Triton); 0 uses the model's default level."""
    parameters: dict[str, Scalar] = msgspec.field(default_factory=dict)
    created_ms: int = 0
    """When the request was made, Unix epoch milliseconds (for queue-time metrics)."""
    sent_us: int = 0
    """When it was handed to Kafka, Unix epoch microseconds (0: not known). Set by the
    publisher; a worker counts the model's ``max_queue_delay_microseconds`` from here."""
    classification: dict[str, int] = msgspec.field(default_factory=dict)
    """Triton's classification extension: output name -> how many of its top classes come
    back (as BYTES strings ``value:index[:label]``) in place of its values."""
    trace: bool = False
    """Triton's trace extension: the worker stamps the moments of this request's stages in
    its result (``InferResult.trace_ns``)."""


Status = Literal["ok", "error"]


class ErrorInfo(msgspec.Struct, frozen=True):
    """A per-request error: stable code, human message."""

    code: str
    message: str


class InferResult(msgspec.Struct, frozen=True):
    """One request's answer, as written to Redis by a worker."""

    id: str
    model: str
    version: str
    outputs: tuple[Tensor, ...] = ()
    error: ErrorInfo | None = None
    timing_us: dict[str, int] = msgspec.field(default_factory=dict)
    """queue / compute_input / compute_infer / compute_output durations, microseconds."""
    worker: str = ""
    trace_ns: dict[str, int] = msgspec.field(default_factory=dict)
    """A traced request's stages in the worker (Triton's names: QUEUE_START,
    COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END), Unix epoch ns."""
    index: int = 0
    """Which of its request's responses this is, from 0: a decoupled model (Triton's
    ``model_transaction_policy { decoupled: true }``) may answer one request many times."""
    final: bool = True
    """The request's last response: nothing more comes for its id. Every answer of an
    ordinary model is final; a decoupled model's are not until it says so."""
    empty: bool = False
    """A final response that carries no response of its own (a decoupled model that
    closed its request without data: Triton's empty final response); no outputs."""
    parameters: Mapping[str, Scalar] = NO_PARAMETERS
    """The response's parameters, as its model attached them (Triton's Python backend:
    ``InferenceResponse(parameters={...})``, values bool, int or str); the fronts send
    them back as the inference response's ``parameters``."""

    @property
    def status(self) -> Status:
        return "error" if self.error else "ok"

    def output(self, name: str) -> Tensor:
        for tensor in self.outputs:
            if tensor.name == name:
                return tensor
        raise KeyError(name)

    def as_numpy(self) -> dict[str, Any]:
        """Outputs by name as numpy arrays."""
        return {t.name: t.to_numpy() for t in self.outputs}
