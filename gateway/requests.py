"""What both fronts (HTTP, gRPC) do with a decoded request: Triton's request parameters and
the Plaza request they become.

Triton's ``timeout`` (microseconds) and ``priority`` are consumed here: the timeout shortens
the sync wait and sets the request's deadline (0, Triton's default, is no timeout), the
priority picks its level. An output's
``classification`` (Triton's classification extension) becomes the request's
``classification`` counts. The other parameters travel to the worker as they are. The
shared memory parameters are the fronts' own, on an input or an output
(``plaza.gateway.shared_memory``): on the request itself they are refused, and so is
``classification`` anywhere but on an output.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from plaza.contract import InferRequest, Scalar
from plaza.errors import InvalidInput
from plaza.gateway.shared_memory import ShmRef
from plaza.model_control import FILE_OVERRIDES_REFUSED
from plaza.tensors import Tensor

PARAM_TIMEOUT = "timeout"
PARAM_PRIORITY = "priority"
PARAM_CLASSIFICATION = "classification"
UNSUPPORTED_PARAMS = ("shared_memory_region", "classification")
"""Parameter name prefixes of Triton extensions Plaza does not serve."""


@dataclass(frozen=True, slots=True)
class FrontRequest:
    """A request as a front decoded it, before it becomes an ``InferRequest``."""

    inputs: tuple[Tensor, ...]
    outputs: tuple[str, ...] = ()
    """Requested output names; empty: every output."""
    timeout_us: int | None = None
    """``parameters.timeout`` (microseconds, Triton's): shortens the wait, sets a deadline.
    None when absent or 0 (Triton's "no timeout")."""
    priority: int = 0
    parameters: dict[str, Scalar] = field(default_factory=dict)
    """The parameters the worker receives (``timeout`` and ``priority`` taken out)."""
    classification: dict[str, int] = field(default_factory=dict)
    """Outputs to classify: name -> how many top classes (``output_classes``)."""
    shm_outputs: dict[str, ShmRef] = field(default_factory=dict)
    """Outputs to write to shared memory (the gRPC front's; HTTP keeps them on its body)."""

    @classmethod
    def from_parameters(
        cls,
        inputs: tuple[Tensor, ...],
        outputs: tuple[str, ...],
        params: Mapping[str, Scalar],
        consumed: frozenset[str] = frozenset(),
        classification: Mapping[str, int] | None = None,
        shm_outputs: Mapping[str, ShmRef] | None = None,
    ) -> FrontRequest:
        """Take Triton's ``timeout`` and ``priority`` (and the front's own ``consumed``
        keys) out of ``params``; InvalidInput when they are not non-negative integers."""
        taken = consumed | {PARAM_TIMEOUT, PARAM_PRIORITY}
        return cls(
            inputs=inputs,
            outputs=outputs,
            timeout_us=non_negative_int(params, PARAM_TIMEOUT) or None,  # 0: no timeout
            priority=non_negative_int(params, PARAM_PRIORITY) or 0,
            parameters={k: v for k, v in params.items() if k not in taken},
            classification=dict(classification or {}),
            shm_outputs=dict(shm_outputs or {}),
        )

    def to_request(self, model: str, version: str, correlation_id: str) -> InferRequest:
        """The Plaza request; the deadline is now + ``timeout_us`` when one was given,
        in whole milliseconds rounded up (a sub-millisecond timeout is not no time)."""
        now_ms = int(time.time() * 1000)
        deadline = now_ms + (self.timeout_us + 999) // 1000 if self.timeout_us else None
        return InferRequest(
            id=correlation_id,
            model=model,
            version=version,
            inputs=self.inputs,
            outputs=self.outputs,
            deadline_ms=deadline,
            priority=self.priority,
            parameters=self.parameters,
            created_ms=now_ms,
            classification=self.classification,
        )


def non_negative_int(params: Mapping[str, Scalar], key: str) -> int | None:
    """``params[key]`` as a non-negative int (None when absent); InvalidInput otherwise."""
    value = params.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInput(f"parameter {key!r} must be a non-negative integer, got {value!r}")
    return value


def output_classes(params: Mapping[str, Scalar], name: str) -> int | None:
    """An output's ``classification`` parameter: how many top classes to return (None:
    its values, as usual); InvalidInput unless an integer >= 1. The other parameters are
    checked by ``refuse_unsupported``."""
    value = params.get(PARAM_CLASSIFICATION)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise InvalidInput(f"output {name!r}: 'classification' must be an integer >= 1")
    rest = {k: v for k, v in params.items() if k != PARAM_CLASSIFICATION}
    refuse_unsupported(rest, f"output {name!r}")
    return value


def refuse_unsupported(params: Mapping[str, Scalar], where: str) -> None:
    """InvalidInput for a parameter of an extension Plaza does not serve."""
    for key in params:
        if key.startswith(UNSUPPORTED_PARAMS):
            raise InvalidInput(f"{where} parameter {key!r} is not supported by Plaza")


def load_config(params: Mapping[str, object]) -> str:
    """The config override of a load request's parameters ("" for none).

    Triton's ``config`` is a model config in its JSON form, as a string. File overrides
    (``file:<path>`` parameters) are refused: a model's files must be in the repository
    every worker reads.
    """
    for key in params:
        if key.startswith("file:"):
            raise InvalidInput(f"load parameter {key!r}: {FILE_OVERRIDES_REFUSED}")
    config = params.get("config", "")
    if not isinstance(config, str):
        raise InvalidInput("load parameter 'config' must be a string (a model config as JSON)")
    return config
