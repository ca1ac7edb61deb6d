"""The parts of Triton's pb_utils API that model.py files use beyond tensors and requests:
the logger's levels, BYTES serialisation, preferred memory, a tensor's Triton type, the
BLS stream's ``cancel()``, Triton names Plaza does not build, and the error codes that a BLS
caller reads back. Pure: no process, no Kafka."""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator

import numpy as np
import pytest

from plaza.errors import InvalidInput, ModelExecutionError
from plaza.workers.backends import pb_utils
from plaza.workers.backends.python_errors import answer_error, plaza_code, triton_code


def test_the_logger_has_tritons_levels_and_logs_at_each(caplog: pytest.LogCaptureFixture) -> None:
    logger = pb_utils.Logger
    assert (logger.INFO, logger.WARNING, logger.ERROR, logger.VERBOSE) == (0, 1, 2, 3)
    assert logger.LogLevel.VERBOSE is logger.VERBOSE
    caplog.set_level(logging.DEBUG, logger="triton_python_backend_utils")
    logger.log("plain")
    for level in (logger.INFO, logger.WARNING, logger.ERROR, logger.VERBOSE):
        logger.log(f"at {level.name}", level)
    got = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert got == [
        ("INFO", "plain"),
        ("INFO", "at INFO"),
        ("WARNING", "at WARNING"),
        ("ERROR", "at ERROR"),
        ("DEBUG", "at VERBOSE"),
    ]
    with pytest.raises(pb_utils.TritonModelException, match=r"level 9 is not Logger\.INFO"):
        logger.log("x", 9)


def _layout(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def test_serialize_byte_tensor_encodes_elements_as_triton_does() -> None:
    mixed = np.array([[1, 300], [2.5, b"\x00raw"], ["d\u00e9", None]], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(mixed)
    assert encoded.dtype == np.uint8
    assert encoded.tobytes() == _layout(
        b"1", b"300", b"2.5", b"\x00raw", "d\u00e9".encode(), b"None"
    )
    fixed = pb_utils.serialize_byte_tensor(np.array([b"ab", b"c"]))
    assert fixed.tobytes() == _layout(b"ab", b"c")
    text = pb_utils.serialize_byte_tensor(np.array(["ab", "\u00e9"]))
    assert text.tobytes() == _layout(b"ab", "\u00e9".encode())
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_)).size == 0


@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.uint8, np.bool_])
def test_serialize_byte_tensor_refuses_a_numeric_array(dtype: type) -> None:
    with pytest.raises(pb_utils.TritonModelException, match="not a BYTES tensor"):
        pb_utils.serialize_byte_tensor(np.array([7], dtype=dtype))


def test_preferred_memory_is_accepted_and_unused() -> None:
    assert (pb_utils.TRITONSERVER_MEMORY_GPU, pb_utils.TRITONSERVER_MEMORY_CPU) == (0, 1)
    memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
    request = pb_utils.InferenceRequest(model_name="m", preferred_memory=memory)
    assert request.model_name == "m"
    gpu = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU)
    assert (gpu.preferred_memory_type, gpu.preferred_device_id) == (0, 0)


@pytest.mark.parametrize(
    ("array", "number"),
    [
        (np.zeros(2, np.bool_), 1),
        (np.zeros(2, np.uint8), 2),
        (np.zeros(2, np.int32), 8),
        (np.zeros(2, np.int64), 9),
        (np.zeros(2, np.float16), 10),
        (np.zeros(2, np.float32), 11),
        (np.zeros(2, np.float64), 12),
        (np.array([b"a"], np.object_), 13),
        (np.array(["a"]), 13),
    ],
)
def test_a_tensor_tells_its_triton_data_type(array: np.ndarray, number: int) -> None:
    assert pb_utils.Tensor("x", array).triton_dtype() == number


def test_triton_names_plaza_lacks_say_not_supported_and_typos_name_the_attribute() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="not supported by Plaza"):
        _ = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE  # type: ignore[attr-defined]
    assert not hasattr(pb_utils, "InferenceTrace")  # an AttributeError too, for hasattr
    with pytest.raises(AttributeError, match="has no attribute 'get_inptu_tensor_by_name'") as typo:
        _ = pb_utils.get_inptu_tensor_by_name  # type: ignore[attr-defined]
    assert not isinstance(typo.value, pb_utils.TritonModelException)
    assert pb_utils.MetricKind.GAUGE == pb_utils.MetricFamily.GAUGE
    assert pb_utils.TRITON_STRING_TO_NUMPY["TYPE_FP32"] is np.float32


class _Stream:
    """A BLS stream transport's generator that records how far it got."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.started = False
        self.closed = False

    def __call__(
        self, request: pb_utils.InferenceRequest, timeout_s: float
    ) -> Iterator[pb_utils.InferenceResponse]:
        self.started = True
        try:
            for i in range(self.count):
                yield pb_utils.InferenceResponse([pb_utils.Tensor("N", np.array([i]))])
        finally:
            self.closed = True


def _exec_with(stream: _Stream) -> pb_utils.ResponseIterator:
    def call(request: pb_utils.InferenceRequest, timeout_s: float) -> pb_utils.InferenceResponse:
        raise AssertionError("a decoupled exec takes the stream")

    pb_utils.set_bls_call(call, stream)
    try:
        return pb_utils.InferenceRequest(model_name="other").exec(decoupled=True)
    finally:
        pb_utils.set_bls_call(None)


def test_cancel_closes_a_decoupled_execs_stream_and_ends_it() -> None:
    stream = _Stream(5)
    responses = _exec_with(stream)
    first = next(responses)
    assert first.output_tensors()[0].as_numpy().tolist() == [0]
    responses.cancel()
    assert stream.closed  # the transport's stream was told at once
    assert list(responses) == []
    responses.cancel()  # again: nothing more happens


def test_cancel_before_the_first_response_never_starts_a_lazy_stream() -> None:
    stream = _Stream(5)
    responses = _exec_with(stream)
    responses.cancel()
    assert list(responses) == [] and not stream.started


def test_cancel_after_the_last_response_changes_nothing() -> None:
    stream = _Stream(2)
    responses = _exec_with(stream)
    assert len(list(responses)) == 2 and stream.closed
    responses.cancel()
    assert list(responses) == []


TRITON_CODES = [
    pb_utils.TritonError.UNKNOWN,
    pb_utils.TritonError.INTERNAL,
    pb_utils.TritonError.NOT_FOUND,
    pb_utils.TritonError.INVALID_ARG,
    pb_utils.TritonError.UNAVAILABLE,
    pb_utils.TritonError.UNSUPPORTED,
    pb_utils.TritonError.ALREADY_EXISTS,
    pb_utils.TritonError.CANCELLED,
]


@pytest.mark.parametrize("code", TRITON_CODES)
def test_every_triton_code_survives_the_round_trip(code: int) -> None:
    """A model's error code, as a Plaza code on the wire, reads back as itself."""
    plaza = plaza_code(code)
    assert triton_code(plaza) == code
    assert answer_error(plaza, "m").code == plaza  # what the worker writes for it


def test_codes_plaza_has_keep_their_names_the_others_are_model_errors() -> None:
    assert [plaza_code(c) for c in TRITON_CODES] == [
        "model_error_unknown",
        "model_error",
        "model_error_not_found",
        "invalid_input",
        "unavailable",
        "model_error_unsupported",
        "model_error_already_exists",
        "cancelled",
    ]
    assert isinstance(answer_error("model_error_not_found", "m"), ModelExecutionError)
    assert triton_code("unsupported") == pb_utils.TritonError.UNSUPPORTED  # the SDK's refusal
    assert isinstance(answer_error("invalid_input", "m"), InvalidInput)
    assert triton_code("model_not_found") == pb_utils.TritonError.NOT_FOUND
