"""Bad input never kills a worker: a corpus of malformed records and the exact outcome of each.

``admit`` is the worker's first look at a record. Each case below states what must happen:
an error answer with a stable code (the id is readable), or the dead-letter topic (it is not).
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from plaza.modelconfig import parse_model_config
from plaza.workers.admission import DeadLetter, Rejected, admit
from plaza.workers.runner import WorkItem

SPEC = parse_model_config(
    """
    name: "m" platform: "onnxruntime_onnx" max_batch_size: 8
    input [ { name: "a" data_type: TYPE_FP32 dims: [ 4 ] },
            { name: "s" data_type: TYPE_STRING dims: [ 1 ] optional: true } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """,
    source="m/config.pbtxt",
    default_name="m",
)
VERSIONS = [1, 2]
LIMIT = 4096


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
        "reply_stream": "out",
    }
    body.update(fields)
    return msgpack.packb({k: v for k, v in body.items() if v is not ...})


def judge(value: bytes | None) -> Any:
    return admit(value, SPEC, VERSIONS, max_bytes=LIMIT, worker_id="w")


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
]


@pytest.mark.parametrize(("case", "value", "code", "words"), REJECTED, ids=[c[0] for c in REJECTED])
def test_invalid_request_is_answered_with_a_stable_code(
    case: str, value: bytes, code: str, words: str
) -> None:
    verdict = judge(value)
    assert isinstance(verdict, Rejected), case
    assert verdict.result.id == "r1" and verdict.reply_stream == "out"
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
]


@pytest.mark.parametrize(("case", "value", "code"), DEAD, ids=[c[0] for c in DEAD])
def test_unanswerable_record_goes_to_the_dead_letter_topic(
    case: str, value: bytes | None, code: str
) -> None:
    verdict = judge(value)
    assert isinstance(verdict, DeadLetter), case
    assert verdict.error.code == code


def test_corpus_has_at_least_twenty_kinds() -> None:
    assert len(REJECTED) + len(DEAD) >= 20


def test_valid_request_is_admitted_with_its_rows_and_version() -> None:
    verdict = judge(record(inputs=[tensor(shape=(3, 4))], version="1"))
    assert isinstance(verdict, WorkItem)
    assert (verdict.rows, verdict.version, verdict.request.id) == (3, 1, "r1")
    newest = judge(record())
    assert isinstance(newest, WorkItem) and newest.version == 2
