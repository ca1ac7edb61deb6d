"""Trace settings a client cannot set (``gateway/tracing.py``): numbers that are not ASCII
integers in Triton's ranges are InvalidInput (400 / INVALID_ARGUMENT), never an error of the
gateway's own; and a trace goes to the file that was set when its request came, each file
written on its own, so that a change of settings or one bad file loses no other traces."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from plaza.errors import InvalidInput
from plaza.gateway.tracing import Tracer

ON = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": "a.jsonl"}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("trace_rate", "--5"),
        ("trace_rate", "-"),
        ("trace_rate", "²"),  # a digit to str.isdigit, not to int()
        ("trace_rate", "١٢"),  # Arabic-Indic digits: int() reads them, Triton does not
        ("trace_rate", "1e3"),
        ("trace_rate", "0x10"),
        ("trace_rate", "+5"),
        ("trace_rate", ""),
        ("trace_rate", 5.0),
        ("trace_rate", True),
        ("trace_count", ["1", "2"]),
        ("log_frequency", {"n": 1}),
    ],
)
def test_what_is_not_an_integer_is_refused(tmp_path: Path, name: str, value: object) -> None:
    with pytest.raises(InvalidInput, match="must be an integer"):
        Tracer(tmp_path).update("", {name: value})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("trace_rate", "4294967296"),  # a uint32 in Triton
        ("trace_rate", "0"),
        ("trace_count", "2147483648"),  # an int32
        ("trace_count", "-2"),
        ("log_frequency", 2**32),
        ("log_frequency", "-1"),
        ("trace_rate", "1" + "0" * 30),
        ("trace_rate", "9" * 5000),  # past int()'s 4,300 digits
        ("trace_rate", 10**30),
    ],
)
def test_what_is_out_of_tritons_range_is_refused(tmp_path: Path, name: str, value: object) -> None:
    with pytest.raises(InvalidInput, match=r"must be >= -?\d+ and <= \d+"):
        Tracer(tmp_path).update("", {name: value})


def test_the_ends_of_each_range_are_taken(tmp_path: Path) -> None:
    tracer = Tracer(tmp_path)
    tracer.update("", {"trace_rate": " 4294967295 ", "trace_count": "-1", "log_frequency": 0})
    tracer.update("m", {"trace_rate": ["1"], "trace_count": "2147483647", "log_frequency": "00"})
    assert tracer.settings().wire()["trace_rate"] == "4294967295"
    own = tracer.settings("m")
    assert (own.trace_rate, own.trace_count, own.log_frequency) == (1, 2**31 - 1, 0)


def lines(path: Path) -> list[str]:
    """The request ids of the traces in ``path``."""
    return [orjson.loads(line)["request_id"] for line in path.read_bytes().splitlines()]


def test_a_trace_goes_to_the_file_set_when_its_request_came(tmp_path: Path) -> None:
    tracer = Tracer(tmp_path)
    tracer.update("", ON)
    tracer.update("m2", {"trace_file": "b.jsonl"})
    in_flight = tracer.sample("m1")  # m1's request comes while the file is a.jsonl
    assert in_flight == "a.jsonl"
    tracer.record("m2", "1", "r-m2", 1, 2, {}, tracer.sample("m2"))
    tracer.update("", {"trace_file": ""})  # tracing turned off by clearing the file
    tracer.record("m1", "1", "r-m1", 1, 2, {}, trace_file=in_flight)  # m1's request ends
    tracer.record("m2", "1", "r-m2b", 3, 4, {}, tracer.sample("m2"))
    tracer.close()
    assert lines(tmp_path / "a.jsonl") == ["r-m1"]
    assert lines(tmp_path / "b.jsonl") == ["r-m2", "r-m2b"]


def test_a_trace_recorded_with_no_file_to_go_to_is_not_kept(tmp_path: Path) -> None:
    """``record`` without the sampled file takes the model's file now: none, once it is
    cleared. The other models' traces are written all the same."""
    tracer = Tracer(tmp_path)
    tracer.update("", ON)
    tracer.update("m2", {"trace_file": "b.jsonl"})
    assert tracer.sample("m1") and tracer.sample("m2")
    tracer.record("m2", "1", "r-m2", 1, 2, {})
    tracer.update("", {"trace_file": ""})
    tracer.record("m1", "1", "r-m1", 1, 2, {})
    assert tracer.sample("m2")
    tracer.record("m2", "1", "r-m2b", 3, 4, {})
    tracer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.jsonl"]
    assert lines(tmp_path / "b.jsonl") == ["r-m2", "r-m2b"]


def test_a_file_that_cannot_be_written_loses_only_its_own_traces(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").mkdir()  # opening it to append fails
    tracer = Tracer(tmp_path)
    tracer.update("", ON)
    tracer.update("m2", {"trace_file": "bad.jsonl"})
    for model in ("m1", "m2", "m1"):
        tracer.record(model, "1", f"r-{model}", 1, 2, {}, tracer.sample(model))
    tracer.close()  # one batch holds both files' traces
    assert lines(tmp_path / "a.jsonl") == ["r-m1", "r-m1"]
    assert list((tmp_path / "bad.jsonl").iterdir()) == []
