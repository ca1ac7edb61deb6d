"""Sequence batching: the ``sequence_batching`` block as read (``plaza.sequence_config``),
the request parameters (``sequence_flags``), and the sequence batcher on a fake clock."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest

from plaza.errors import ConfigError, InvalidInput, QueueFull
from plaza.modelconfig import parse_model_config
from plaza.repository import ModelRepository
from plaza.sequence_batching import SequenceBatcher, SequenceFlags, sequence_flags
from plaza.sequence_config import CORRID, READY, START, SequenceBatching
from tests.support import REPOSITORY

_BASE = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }]
"""
_SEQ = """
sequence_batching {
  max_sequence_idle_microseconds: 2000000
  control_input [
    { name: "S" control [{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }] },
    { name: "C" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }] }
  ]
  state [{ input_name: "SIN" output_name: "SOUT" data_type: TYPE_FP32 dims: [ 2 ] }]
  oldest { max_candidate_sequences: 3 max_queue_delay_microseconds: 500 }
}
"""


def test_the_block_is_read() -> None:
    seq = parse_model_config(_BASE + _SEQ, source="t", default_name="m").sequence
    assert seq.enabled and (seq.max_idle_us, seq.max_queue_delay_us, seq.max_sequences) == (
        2_000_000,
        500,
        3,
    )
    assert [(c.name, c.kind, c.datatype, c.true_value) for c in seq.controls] == [
        ("S", START, "FP32", 1.0),
        ("C", CORRID, "UINT64", 1),
    ]
    assert seq.model_inputs == ("S", "C", "SIN") and seq.state_outputs == ("SOUT",)
    plain = parse_model_config(_BASE, source="t", default_name="m")
    assert not plain.sequence.enabled


def test_the_sample_is_a_sequence_model() -> None:
    spec = ModelRepository(REPOSITORY).spec("accumulate")
    assert {c.kind for c in spec.sequence.controls} == {START, READY}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (_BASE + _SEQ + "dynamic_batching { }", "sequence_batching"),
        (_BASE.replace("onnxruntime_onnx", "pytorch_libtorch") + _SEQ, "sequence_batching"),
        (_BASE + _SEQ.replace("fp32_false_true: [ 0, 1 ]", "fp32_false_true: [ 0 ]"), "control"),
        (_BASE + _SEQ.replace('input_name: "SIN"', 'input_name: "INPUT"'), "sequence_batching"),
        (_BASE + _SEQ.replace("dims: [ 2 ]", "dims: [ -1 ]"), "state[0].dims"),
        (
            _BASE
            + _SEQ.replace("dims: [ 2 ] }", 'dims: [ 2 ] initial_state [{ data_file: "f" }] }'),
            "initial_state",
        ),
        (_BASE + _SEQ.replace("TYPE_UINT64", "TYPE_FP32"), "data_type"),
        (_BASE + _SEQ + "response_cache { enable: true }", "response_cache"),
    ],
)
def test_what_plaza_cannot_carry_out_is_refused(text: str, field: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(field)):
        parse_model_config(text, source="t", default_name="m")


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({}, "needs a sequence_id"),
        ({"sequence_id": 0}, "between 1 and"),
        ({"sequence_id": ""}, "needs a sequence_id"),
        ({"sequence_id": 1.5}, "needs a sequence_id"),
        ({"sequence_id": 3, "sequence_start": 1}, "true or false"),
    ],
)
def test_bad_sequence_parameters(params: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        sequence_flags(params, "m")


def test_sequence_parameters() -> None:
    assert sequence_flags({"sequence_id": "a", "sequence_end": True}, "m") == SequenceFlags(
        "a", False, True
    )


@dataclass(eq=False)
class Req:
    key: int
    start: bool = False
    end: bool = False
    origin: str = "p0"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def batcher(clock: Clock, max_batch: int = 4, **policy: int) -> SequenceBatcher[Req]:
    config = SequenceBatching(enabled=True, **policy)  # type: ignore[arg-type]
    return SequenceBatcher(config, max_batch, lambda r: SequenceFlags(r.key, r.start, r.end), clock)


def test_a_batch_holds_one_request_of_each_sequence_oldest_first() -> None:
    clock = Clock()
    b = batcher(clock, max_batch=2)
    a1, a2, c1, d1 = Req(1, start=True), Req(1), Req(2, start=True), Req(3, start=True)
    for i, r in enumerate((a1, a2, c1, d1)):
        b.add(r, arrival=clock.now + i)
    first = b.decide()
    assert first.batch == [a1, c1]  # a2 waits for a1; d1 for room
    assert b.decide().batch == [d1]
    assert b.decide().batch == []  # a2: its sequence is running
    b.finish(a1, {"SIN": np.array([5.0])})
    second = b.decide()
    assert second.batch == [a2]
    assert b.step(a2).state is not None and b.step(a2).state["SIN"].tolist() == [5.0]  # type: ignore[index]
    assert b.step(a2).start is False


def test_a_start_runs_from_zeros_and_an_end_closes_the_sequence() -> None:
    clock = Clock()
    b = batcher(clock)
    first = Req(7, start=True)
    b.add(first)
    (got,) = b.decide().batch
    assert b.step(got).state is None and b.step(got).start
    b.finish(got, {"SIN": np.array([1.0])})
    last = Req(7, end=True)
    b.add(last)
    assert b.decide().batch == [last]
    b.finish(last, {"SIN": np.array([2.0])})
    assert b.active == 0
    with pytest.raises(InvalidInput, match="has not started"):
        b.add(Req(7))


def test_a_request_queued_behind_an_end_is_refused_a_start_is_not() -> None:
    clock = Clock()
    b = batcher(clock)
    end, late, restart = Req(4, start=True, end=True), Req(4), Req(4, start=True)
    for r in (end, late, restart):
        b.add(r)
    assert b.decide().batch == [end]
    b.finish(end, None)
    decision = b.decide()
    assert [r for r, _ in decision.refused] == [late]
    assert decision.batch == [restart]
    assert "has not started" in decision.refused[0][1].message


def test_idle_sequences_are_released_and_the_count_is_bounded() -> None:
    clock = Clock()
    b = batcher(clock, max_idle_us=1_000_000, max_sequences=2)
    for key in (1, 2):
        r = Req(key, start=True)
        b.add(r)
        b.decide()
        b.finish(r, None)
    with pytest.raises(QueueFull, match="2 sequences"):
        b.add(Req(3, start=True))
    assert b.decide().wake_at is not None  # idle time runs out with nothing arriving
    clock.now += 1.5
    b.decide()
    assert b.active == 0
    with pytest.raises(InvalidInput, match="idle"):
        b.add(Req(1))
    b.add(Req(3, start=True))  # room again


def test_the_queue_delay_waits_for_more_sequences() -> None:
    clock = Clock()
    b = batcher(clock, max_batch=3, max_queue_delay_us=1000)
    b.add(Req(1, start=True))
    waiting = b.decide()
    assert waiting.batch == [] and waiting.wake_at == pytest.approx(clock.now + 0.001)
    b.add(Req(2, start=True))
    clock.now += 0.001
    assert len(b.decide().batch) == 2


def test_a_revoked_partition_takes_its_sequences_with_it() -> None:
    clock = Clock()
    b = batcher(clock)
    kept, moved, moved_next = (
        Req(1, start=True),
        Req(2, start=True, origin="p1"),
        Req(2, origin="p1"),
    )
    for r in (kept, moved, moved_next):
        b.add(r)
    assert b.remove_if(lambda r: r.origin == "p1") == [moved, moved_next]
    assert b.active == 1 and len(b) == 1
    with pytest.raises(InvalidInput, match="has not started"):
        b.add(Req(2))


def test_released_and_adopted_requests() -> None:
    clock = Clock()
    b = batcher(clock)
    r = Req(5, start=True)
    b.add(r)
    b.decide()
    b.release(r)  # answered already: the sequence goes on, its state untouched
    nxt = Req(5)
    b.add(nxt)
    assert b.decide().batch == [nxt]
    b.finish(nxt, {"SIN": np.array([3.0])})
    suspect = Req(5)
    step = b.adopt(suspect)
    assert step.state is not None and step.state["SIN"].tolist() == [3.0]
    with pytest.raises(InvalidInput, match="has not started"):
        b.adopt(Req(6))


def test_a_failed_start_still_restarts_the_state() -> None:
    clock = Clock()
    b = batcher(clock)
    first, restart, after = Req(8, start=True), Req(8, start=True), Req(8)
    b.add(first)
    b.decide()
    b.finish(first, {"SIN": np.array([9.0])})
    b.add(restart)
    b.decide()
    b.finish(restart, None)  # the model failed on it
    b.add(after)
    b.decide()
    assert b.step(after).state is None


def test_a_backend_called_directly_gets_the_control_and_state_inputs() -> None:
    from plaza.loadgen.inputs import model_inputs

    spec = ModelRepository(REPOSITORY).spec("accumulate")
    feeds = model_inputs(spec, 3, 1, np.random.default_rng(0))
    assert {n: a.shape for n, a in feeds.items()} == {
        "INPUT": (3, 1),
        "START": (3, 1),
        "READY": (3, 1),
        "SUM_IN": (3, 1),
    }
    assert feeds["START"].tolist() == [[1]] * 3 and not feeds["SUM_IN"].any()
