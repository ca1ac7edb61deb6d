"""Bad input never kills a worker: a corpus of malformed records and the exact outcome of each.

``admit`` is the worker's first look at a record. Each case below states what must happen:
an error answer with a stable code (the id is readable), or the dead-letter topic (it is not).
``admit`` never raises: a record that crashed the intake would crash every worker that takes
its partition next (a record that crashes the backend instead is the worker's business: see
tests/faults/test_poison_record.py).
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from plaza.modelconfig import parse_model_config
from plaza.naming import Names
from plaza.workers.admission import DeadLetter, Rejected, admit, wait_began
from plaza.workers.runner import WorkItem

SPEC = parse_model_config(
    """
    name: "m" platform: "onnxruntime_onnx" max_batch_size: 8
    input [ { name: "a" data_type: TYPE_FP32 dims: [ 4 ] },
            { name: "s" data_type: TYPE_STRING dims: [ 1 ] optional: true },
            { name: "t" data_type: TYPE_STRING dims: [ -1 ] optional: true } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """,
    source="m/config.pbtxt",
    default_name="m",
)
VERSIONS = [1, 2]
LIMIT = 4096
NAMES = Names()
STREAM = NAMES.reply_stream("gw-1")


def tensor(name: str = "a", datatype: str = "FP32", shape: Any = (1, 4), data: Any = None):
    if data is None:
        data = np.zeros(int(np.prod(shape)), "<f4").tobytes()
    return {"name": name, "datatype": datatype, "shape": list(shape), "data": data}


def record(**fields: Any) -> bytes:
    body = {
        "v": 1,
        "id": "r1",
        "model": "m",
        "version": "",
        "inputs": [tensor()],
        "reply_stream": STREAM,
    }
    body.update(fields)
    return msgpack.packb({k: v for k, v in body.items() if v is not ...})


def judge(value: bytes | None, names: Names = NAMES) -> Any:
    return admit(value, SPEC, VERSIONS, max_bytes=LIMIT, names=names, worker_id="w")


def with_bytes(shape: Any, data: bytes, name: str = "t") -> bytes:
    """A valid request plus one BYTES input."""
    return record(inputs=[tensor(), tensor(name, "BYTES", shape, data)])


REJECTED = [  # (case, record, error code, words in the message)
    (
        "wrong datatype",
        record(inputs=[tensor(datatype="FP64", data=b"\0" * 32)]),
        "invalid_input",
        "datatype",
    ),
    ("missing batch dim", record(inputs=[tensor(shape=(4,))]), "invalid_input", "[batch]"),
    ("wrong dims", record(inputs=[tensor(shape=(1, 5))]), "invalid_input", "dims"),
    ("batch too big", record(inputs=[tensor(shape=(9, 4))]), "invalid_input", "batch size 9"),
    (
        "empty batch",
        record(inputs=[tensor(shape=(0, 4), data=b"")]),
        "invalid_input",
        "batch size 0",
    ),
    ("short data", record(inputs=[tensor(data=b"\0" * 15)]), "invalid_input", "needs 16"),
    ("long data", record(inputs=[tensor(data=b"\0" * 17)]), "invalid_input", "needs 16"),
    ("missing input", record(inputs=[]), "invalid_input", "missing input 'a'"),
    (
        "extra input",
        record(inputs=[tensor(), tensor(name="zzz")]),
        "invalid_input",
        "unknown input",
    ),
    ("duplicate input", record(inputs=[tensor(), tensor()]), "invalid_input", "twice"),
    ("unknown output", record(outputs=["nope"]), "invalid_input", "unknown output"),
    (
        "bad BYTES data",
        record(inputs=[tensor(), tensor("s", "BYTES", (1, 1), b"\x09\0\0\0ab")]),
        "invalid_input",
        "BYTES",
    ),
    (
        "inputs disagree on batch",
        record(inputs=[tensor(), tensor("s", "BYTES", (2, 1), b"\1\0\0\0a\1\0\0\0b")]),
        "invalid_input",
        "disagree",
    ),
    ("unknown version", record(version="7"), "model_not_found", "no served version '7'"),
    ("non-numeric version", record(version="latest"), "model_not_found", "served version"),
    ("other model", record(model="other"), "model_not_found", "not 'other'"),
    ("envelope version 2", record(v=2), "unsupported_envelope_version", "version 2"),
    ("no envelope version", record(v=...), "unsupported_envelope_version", "version None"),
    (
        "unknown datatype",
        record(inputs=[tensor(datatype="FP8")]),
        "bad_envelope",
        "unknown datatype",
    ),
    (
        "negative dim",
        record(inputs=[tensor(shape=(1, -4), data=b"")]),
        "bad_envelope",
        "non-negative",
    ),
    ("data not bytes", record(inputs=[tensor(data="zeros")]), "bad_envelope", "must be bytes"),
    ("inputs not a list", record(inputs={"a": 1}), "bad_envelope", "'inputs' must be a list"),
    ("bad deadline", record(deadline_ms="soon"), "bad_envelope", "deadline_ms"),
    ("no model", record(model=...), "bad_envelope", "model name"),
    (
        "oversize payload",
        record(parameters={"pad": "x" * LIMIT}),
        "payload_too_large",
        "limit 4096",
    ),
    # Shapes that declare far more elements than the data holds: checked before allocating.
    ("huge BYTES shape", with_bytes((1, 2**40), b""), "invalid_input", "1099511627776 elements"),
    ("BYTES shape past int64", with_bytes((1, 2**64 - 1), b""), "invalid_input", "elements"),
    ("huge BYTES rows x dims", with_bytes((8, 2**62), b"\0" * 8), "invalid_input", "at most 2"),
    ("BYTES count past data", with_bytes((1, 3), b"\0" * 8), "invalid_input", "at most 2"),
    ("BYTES trailing bytes", with_bytes((1, 1), b"\1\0\0\0ab"), "invalid_input", "trailing"),
    ("BYTES length past data", with_bytes((1, 1), b"\xff" * 4), "invalid_input", "runs past"),
    ("BYTES named input", with_bytes((1, 5), b""), "invalid_input", "input 't'"),
    (
        "huge FP32 batch",
        record(inputs=[tensor(shape=(2**62, 4), data=b"")]),
        "invalid_input",
        "batch",
    ),
    (
        "FP32 shape past int64",
        record(inputs=[tensor(shape=(1, 2**64 - 1), data=b"")]),
        "invalid_input",
        "dims",
    ),
    ("zero-size dim", record(inputs=[tensor(shape=(1, 0), data=b"")]), "invalid_input", "dims"),
    ("scalar shape", record(inputs=[tensor(shape=(), data=b"\0" * 4)]), "invalid_input", "[batch]"),
    ("extra dim", record(inputs=[tensor(shape=(1, 4, 1))]), "invalid_input", "[batch]"),
    ("unicode digit version", record(version="\u00b2"), "model_not_found", "served version"),
    # Envelope fields of the wrong type.
    ("tensor not a map", record(inputs=[7]), "bad_envelope", "must be a map"),
    ("empty tensor name", record(inputs=[tensor(name="")]), "bad_envelope", "name must be"),
    ("shape not a list", record(inputs=[{**tensor(), "shape": "1,4"}]), "bad_envelope", "shape"),
    ("bool in shape", record(inputs=[tensor(shape=(True, 4))]), "bad_envelope", "shape"),
    ("float in shape", record(inputs=[{**tensor(), "shape": [1.0, 4]}]), "bad_envelope", "shape"),
    ("outputs not a list", record(outputs="y"), "bad_envelope", "'outputs'"),
    ("output name not a string", record(outputs=[1]), "bad_envelope", "'outputs'"),
    ("version not a string", record(version=2), "bad_envelope", "'version'"),
    ("priority not an int", record(priority="high"), "bad_envelope", "'priority'"),
    ("priority a bool", record(priority=True), "bad_envelope", "'priority'"),
    ("parameters not a map", record(parameters=[1]), "bad_envelope", "'parameters'"),
    ("created_ms not an int", record(created_ms=1.5), "bad_envelope", "'created_ms'"),
    ("model not a string", record(model=5), "bad_envelope", "model name"),
]

HOSTILE_STREAMS = [  # (case, record, words): answered on the result key only
    ("stream at any key", record(reply_stream="victim"), "not allowed"),
    ("result key as stream", record(reply_stream=NAMES.result_key("x")), "not allowed"),
    ("bare stream prefix", record(reply_stream=NAMES.reply_stream("")), "not allowed"),
    ("other deployment", record(reply_stream=Names(key_prefix="b:").reply_stream("g")), "allowed"),
    ("hostile and invalid", record(reply_stream="victim", version="7"), "not allowed"),
    ("hostile and undecodable", record(reply_stream="victim", v=2), "version 2"),
]


@pytest.mark.parametrize(("case", "value", "code", "words"), REJECTED, ids=[c[0] for c in REJECTED])
def test_invalid_request_is_answered_with_a_stable_code(
    case: str, value: bytes, code: str, words: str
) -> None:
    verdict = judge(value)
    assert isinstance(verdict, Rejected), case
    assert verdict.result.id == "r1" and verdict.reply_stream == STREAM
    assert verdict.result.error is not None
    assert verdict.result.error.code == code
    assert words in verdict.result.error.message


DEAD = [
    ("no value", None, "bad_envelope"),
    ("not msgpack", b"\xc1\xc1", "bad_envelope"),
    ("msgpack but not a map", msgpack.packb([1, 2, 3]), "bad_envelope"),
    ("no correlation id", record(id=...), "bad_envelope"),
    ("empty correlation id", record(id=""), "bad_envelope"),
    ("oversize without id", b"\xc1" * (LIMIT + 1), "payload_too_large"),
    ("empty value", b"", "bad_envelope"),
    ("truncated msgpack", record()[:-3], "bad_envelope"),
    ("msgpack nil", msgpack.packb(None), "bad_envelope"),
    ("non-string map keys", msgpack.packb({1: 2}), "bad_envelope"),
    ("correlation id not a string", record(id=5), "bad_envelope"),
    ("correlation id a list", record(id=["r1"]), "bad_envelope"),
]


@pytest.mark.parametrize(("case", "value", "code"), DEAD, ids=[c[0] for c in DEAD])
def test_unanswerable_record_goes_to_the_dead_letter_topic(
    case: str, value: bytes | None, code: str
) -> None:
    verdict = judge(value)
    assert isinstance(verdict, DeadLetter), case
    assert verdict.error.code == code


@pytest.mark.parametrize(
    ("case", "value", "words"), HOSTILE_STREAMS, ids=[c[0] for c in HOSTILE_STREAMS]
)
def test_reply_stream_outside_the_prefixes_is_refused(case: str, value: bytes, words: str) -> None:
    verdict = judge(value)
    assert isinstance(verdict, Rejected), case
    assert verdict.reply_stream is None  # a worker never writes a stream it was not given
    assert verdict.result.id == "r1" and verdict.result.error is not None
    assert words in verdict.result.error.message


def test_results_stream_and_reply_stream_are_allowed() -> None:
    for stream in (NAMES.results_stream("pipeline"), NAMES.reply_stream("sdk-1")):
        verdict = judge(record(reply_stream=stream))
        assert isinstance(verdict, WorkItem) and verdict.request.reply.stream == stream


class _BrokenNames(Names):
    """Names whose stream check blows up: an exception admission did not foresee."""

    def is_reply_stream(self, name: str) -> bool:
        raise MemoryError("simulated")


def test_an_unforeseen_exception_becomes_an_error_answer() -> None:
    verdict = judge(record(), _BrokenNames())
    assert isinstance(verdict, Rejected)
    assert verdict.result.error is not None and verdict.result.error.code == "invalid_input"
    assert "MemoryError" in verdict.result.error.message
    dead = judge(record(id=...), _BrokenNames())
    assert isinstance(dead, DeadLetter)


def test_corpus_has_at_least_fifty_kinds() -> None:
    assert len(REJECTED) + len(HOSTILE_STREAMS) + len(DEAD) >= 50


def test_valid_request_is_admitted_with_its_rows_and_version() -> None:
    verdict = judge(record(inputs=[tensor(shape=(3, 4))], version="1"))
    assert isinstance(verdict, WorkItem)
    assert (verdict.rows, verdict.version, verdict.request.id) == (3, 1, "r1")
    newest = judge(record())
    assert isinstance(newest, WorkItem) and newest.version == 2


def _sent(sent_us: int) -> Any:
    verdict = judge(record(sent_us=sent_us))
    assert isinstance(verdict, WorkItem)
    return verdict.request


@pytest.mark.parametrize(
    ("sent_ago_s", "began_ago_s"),
    [
        (0.0005, 0.0005),  # 0.5 ms in Kafka: the wait began when it was sent
        (0.5, 0.002),  # longer than the delay: due at once, never earlier than one delay back
        (-3.0, 0.0),  # the producer's clock runs ahead: as if sent just now
    ],
)
def test_the_wait_begins_when_the_request_was_sent(sent_ago_s: float, began_ago_s: float) -> None:
    now_mono, now_wall = 1000.0, 1_700_000_000.0
    req = _sent(int((now_wall - sent_ago_s) * 1e6))
    began = wait_began(req, now_mono, now_wall, max_wait_s=0.002)
    assert began == pytest.approx(now_mono - began_ago_s, abs=2e-6)


def test_a_request_without_a_sent_time_waits_from_now() -> None:
    assert wait_began(_sent(0), 1000.0, 1_700_000_000.0, max_wait_s=0.002) == 1000.0
