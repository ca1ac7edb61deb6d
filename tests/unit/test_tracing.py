"""Triton's trace extension in the gateway (``gateway/tracing.py``): the settings as Triton
writes them, a model's on top of the global ones, sampling, and the trace file; and the
envelope fields a traced request and its result carry."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from plaza.codec import decode_request, decode_result, encode_request, encode_result
from plaza.contract import InferRequest, InferResult
from plaza.errors import InvalidInput
from plaza.gateway.tracing import Tracer, TraceSettings
from tests.support import wait_for

ON = {"trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_file": "t.jsonl"}


def test_settings_in_tritons_wire_form() -> None:
    assert TraceSettings().wire() == {
        "trace_level": ["OFF"],
        "trace_rate": "1000",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": "",
        "trace_mode": "triton",
    }


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"trace_level": ["TENSORS"]}, "OFF or TIMESTAMPS"),
        ({"trace_rate": "0"}, ">= 1"),
        ({"trace_rate": "often"}, "an integer"),
        ({"trace_count": "-2"}, ">= -1"),
        ({"trace_file": "../etc/x"}, "bare file name"),
        ({"trace_file": ".."}, "bare file name"),
        ({"trace_mode": "opentelemetry"}, "'triton'"),
        ({"trace_color": "red"}, "unknown trace setting"),
    ],
)
def test_bad_settings_are_refused(tmp_path: Path, changes: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        Tracer(tmp_path).update("", changes)


def test_a_models_settings_lie_on_the_global_ones(tmp_path: Path) -> None:
    tracer = Tracer(tmp_path)
    tracer.update("", ON)
    tracer.update("m", {"trace_rate": ["1"], "trace_count": "2"})
    assert tracer.settings("m").trace_rate == 1 and tracer.settings("m").trace_file == "t.jsonl"
    assert tracer.settings("other").trace_rate == 2
    traced = "t.jsonl"  # sample answers the file a trace goes to, "" for none
    assert [tracer.sample("m") for _ in range(4)] == [traced, traced, "", ""]  # count 2
    assert tracer.settings("m").trace_count == 0 and tracer.settings().trace_count == -1
    assert [tracer.sample("other") for _ in range(4)] == ["", traced, "", traced]  # 1 in 2
    tracer.update("m", {"trace_count": None, "trace_rate": None})  # back to the global ones
    assert tracer.settings("m") == tracer.settings()
    tracer.update("", {"trace_level": None})  # Triton's default: OFF
    assert not tracer.sample("other")


def test_traces_are_written_as_json_lines_in_time_order(tmp_path: Path) -> None:
    tracer = Tracer(tmp_path / "traces")
    tracer.update("", {**ON, "log_frequency": "2"})
    worker = {"QUEUE_START": 20, "COMPUTE_START": 30, "COMPUTE_END": 40}
    tracer.record("m", "1", "r1", 10, 50, worker)
    assert not (tmp_path / "traces" / "t.jsonl").exists()  # held until 2 are taken
    tracer.record("m", "1", "r2", 11, 51, {})
    tracer.close()  # the writer thread has appended what it was handed
    lines = (tmp_path / "traces" / "t.jsonl").read_bytes().splitlines()
    first = orjson.loads(lines[0])
    assert (first["model_name"], first["model_version"], first["request_id"]) == ("m", "1", "r1")
    assert [t["name"] for t in first["timestamps"]] == [
        "REQUEST_START",
        "QUEUE_START",
        "COMPUTE_START",
        "COMPUTE_END",
        "REQUEST_END",
    ]
    assert len(lines) == 2


async def test_traces_are_written_when_trace_count_is_used_up(tmp_path: Path) -> None:
    """As Triton: the count reaching 0 writes what was collected, whatever log_frequency
    (0 here: else only a full buffer or the gateway's stop would)."""
    tracer = Tracer(tmp_path)
    tracer.update("", {**ON, "trace_rate": "1", "trace_count": "3"})
    path = tmp_path / "t.jsonl"
    for i in range(2):
        tracer.record("m", "1", f"r{i}", 10, 50, {}, trace_file=tracer.sample("m"))
    assert not path.exists()  # count 1 left: held
    tracer.record("m", "1", "r2", 12, 52, {}, trace_file=tracer.sample("m"))
    assert tracer.settings().trace_count == 0 and not tracer.sample("m")

    def written() -> int:
        return len(path.read_bytes().splitlines()) if path.exists() else 0

    await wait_for(lambda: written() == 3, 10, "the 3 traces in the file before close")
    tracer.close()
    assert written() == 3


def test_several_gateway_processes_refuse_changes(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"gateway\.workers"):
        Tracer(tmp_path, refusal="trace settings: gateway.workers is 2").update("", ON)


def test_the_envelope_carries_the_trace_flag_and_the_stamps() -> None:
    req = InferRequest(id="a", model="m", version="", inputs=(), trace=True)
    assert decode_request(encode_request(req)).trace
    assert not decode_request(
        encode_request(InferRequest(id="a", model="m", version="", inputs=()))
    ).trace
    res = InferResult(id="a", model="m", version="1", trace_ns={"COMPUTE_START": 5})
    assert decode_result(encode_result(res)).trace_ns == {"COMPUTE_START": 5}


def test_traces_past_the_writers_bound_are_dropped_and_counted(tmp_path: Path) -> None:
    tracer = Tracer(tmp_path / "traces", max_queued=1)
    tracer.update("", ON)  # log_frequency 0: held until a flush
    tracer.record("m", "1", "r1", 10, 50, {})
    tracer.record("m", "1", "r2", 11, 51, {})
    tracer.close()  # two lines for a writer that may be one behind: dropped
    assert tracer.dropped == 2
    assert not (tmp_path / "traces" / "t.jsonl").exists()
    tracer.record("m", "1", "r3", 12, 52, {})
    tracer.close()  # one fits
    assert len((tmp_path / "traces" / "t.jsonl").read_bytes().splitlines()) == 1
