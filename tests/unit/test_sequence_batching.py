"""Sequence batching: the ``sequence_batching`` block as read (``plaza.sequence_config``),
the request parameters (``sequence_flags``), the sequence batcher on a fake clock, and the
states the worker keeps in Redis for its sequences (``workers/sequences.py``)."""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import pytest

from plaza.contract import ErrorInfo, InferRequest, InferResult
from plaza.errors import ConfigError, InvalidInput, QueueFull
from plaza.modelconfig import ModelSpec, parse_model_config
from plaza.naming import Names
from plaza.repository import ModelRepository
from plaza.sequence_batching import SequenceBatcher, SequenceFlags, sequence_flags
from plaza.sequence_config import CORRID, READY, START, SequenceBatching
from plaza.tensors import Tensor
from plaza.workers.runner import WorkItem
from plaza.workers.sequences import SequenceRuns, decode_state, encode_state, initial_states
from tests.fakes import ManualClock as Clock
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


@pytest.mark.parametrize("platform", ['backend: "python"', 'platform: "pytorch_libtorch"'])
def test_python_and_torch_models_may_batch_sequences(platform: str) -> None:
    text = _BASE.replace('platform: "onnxruntime_onnx"', platform) + _SEQ
    assert parse_model_config(text, source="t", default_name="m").sequence.enabled


def test_the_sample_is_a_sequence_model() -> None:
    spec = ModelRepository(REPOSITORY).spec("accumulate")
    assert {c.kind for c in spec.sequence.controls} == {START, READY}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (_BASE + _SEQ + "dynamic_batching { }", "sequence_batching"),
        (
            _BASE.replace('platform: "onnxruntime_onnx"', 'backend: "plaza_simulated"') + _SEQ,
            "sequence_batching",
        ),
        (_BASE + _SEQ.replace("fp32_false_true: [ 0, 1 ]", "fp32_false_true: [ 0 ]"), "control"),
        (_BASE + _SEQ.replace('input_name: "SIN"', 'input_name: "INPUT"'), "sequence_batching"),
        (_BASE + _SEQ.replace("dims: [ 2 ]", "dims: [ -1 ]"), "state[0].dims"),
        (
            _BASE
            + _SEQ.replace("dims: [ 2 ] }", 'dims: [ 2 ] initial_state [{ data_file: "../f" }] }'),
            "initial_state[0].data_file",
        ),
        (
            _BASE
            + _SEQ.replace(
                "dims: [ 2 ] }", "dims: [ 2 ] initial_state [{ dims: [ 3 ] zero_data: true }] }"
            ),
            "initial_state[0].dims",
        ),
        (
            _BASE
            + _SEQ.replace(
                "dims: [ 2 ] }",
                'dims: [ 2 ] initial_state [{ data_file: "a" }, { data_file: "b" }] }',
            ),
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
        ({"sequence_id": 1.5}, "must be an integer or a string, got double"),
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


def test_a_preferred_size_runs_before_the_queue_delay_is_out() -> None:
    clock = Clock()
    config = SequenceBatching(enabled=True, max_queue_delay_us=1000, preferred_batch_sizes=(2, 3))
    b = SequenceBatcher(config, 4, lambda r: SequenceFlags(r.key, r.start, r.end), clock)
    b.add(Req(1, start=True))
    assert b.decide().batch == []  # one sequence fills no preferred size: it waits
    for key in (2, 3):
        b.add(Req(key, start=True))
    assert [r.key for r in b.decide().batch] == [1, 2, 3]  # 3 waiting: the size 3 runs now
    b.add(Req(4, start=True))
    clock.now += 0.001
    assert [r.key for r in b.decide().batch] == [4]  # the delay is out: whatever waits


def test_preferred_sizes_are_read_and_checked() -> None:
    text = _BASE + _SEQ.replace("oldest {", "oldest { preferred_batch_size: [ 4, 2 ]")
    assert parse_model_config(
        text, source="t", default_name="m"
    ).sequence.preferred_batch_sizes == (
        2,
        4,
    )
    too_big = _BASE + _SEQ.replace("oldest {", "oldest { preferred_batch_size: [ 5 ]")
    with pytest.raises(ConfigError, match="between 1 and max_batch_size"):
        parse_model_config(too_big, source="t", default_name="m")


def test_a_model_that_does_not_batch_takes_no_preferred_size() -> None:
    """Triton refuses a sequence batcher's preferred size past max_batch_size, so any at
    all where that is 0 (Plaza allowed 1)."""
    text = (_BASE + _SEQ.replace("oldest {", "oldest { preferred_batch_size: [ 1 ]")).replace(
        "max_batch_size: 4", "max_batch_size: 0"
    )
    with pytest.raises(ConfigError, match=r"oldest\.preferred_batch_size.*max_batch_size \(0\)"):
        parse_model_config(text, source="t", default_name="m")
    plain = text.replace("preferred_batch_size: [ 1 ]", "")
    assert parse_model_config(plain, source="t", default_name="m").sequence.enabled


def _direct(fields: str) -> SequenceBatching:
    text = _BASE + _SEQ.replace(
        "oldest { max_candidate_sequences: 3 max_queue_delay_microseconds: 500 }",
        f"direct {{ {fields} }}",
    )
    return parse_model_config(text, source="t", default_name="m").sequence


def test_direct_minimum_slot_utilization_is_carried_out_as_triton_does() -> None:
    """A batch waits up to the delay unless the waiting sequences fill that share of
    max_batch_size (4): 0.5 -> two or more run at once. Without a utilization Triton's
    direct batcher does not wait at all, the delay unused."""
    seq = _direct("max_queue_delay_microseconds: 1000 minimum_slot_utilization: 0.5")
    assert (seq.max_queue_delay_us, seq.preferred_batch_sizes) == (1000, (2, 3, 4))
    assert _direct(
        "max_queue_delay_microseconds: 1000 minimum_slot_utilization: 1"
    ).preferred_batch_sizes == (4,)
    assert _direct(
        "max_queue_delay_microseconds: 1000 minimum_slot_utilization: 0.3"
    ).preferred_batch_sizes == (2, 3, 4)  # 1/4 < 0.3 <= 2/4
    unused = _direct("max_queue_delay_microseconds: 1000")
    assert (unused.max_queue_delay_us, unused.preferred_batch_sizes) == (0, ())
    clock = Clock()
    b: SequenceBatcher[Req] = SequenceBatcher(
        seq, 4, lambda r: SequenceFlags(r.key, r.start, r.end), clock
    )
    b.add(Req(1, start=True))
    assert b.decide().batch == []  # a quarter of the slots: it waits
    b.add(Req(2, start=True))
    assert [r.key for r in b.decide().batch] == [1, 2]  # half: runs now


def test_direct_minimum_slot_utilization_out_of_range_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"direct\.minimum_slot_utilization"):
        _direct("max_queue_delay_microseconds: 1000 minimum_slot_utilization: 1.5")


def test_queue_full_names_the_limit_that_applies() -> None:
    """Under direct there is no max_candidate_sequences: the message names Plaza's fixed
    limit and how to change it."""
    seq = dataclasses.replace(_direct(""), max_sequences=1)
    b: SequenceBatcher[Req] = SequenceBatcher(
        seq, 4, lambda r: SequenceFlags(r.key, r.start, r.end), Clock()
    )
    b.add(Req(1, start=True))
    with pytest.raises(QueueFull) as caught:
        b.add(Req(2, start=True))
    assert "oldest.max_candidate_sequences" not in caught.value.message
    assert "fixed limit under sequence_batching.direct" in caught.value.message
    assert "oldest { max_candidate_sequences }" in caught.value.message
    oldest = parse_model_config(_BASE + _SEQ, source="t", default_name="m").sequence
    assert oldest.max_sequences_field == "sequence_batching.oldest.max_candidate_sequences"


def test_a_string_corrid_is_refused_by_name() -> None:
    """Triton takes a TYPE_STRING CORRID for string sequence ids; Plaza passes the id as a
    number only, and says so at load rather than failing each request."""
    text = _BASE + _SEQ.replace("TYPE_UINT64", "TYPE_STRING")
    with pytest.raises(ConfigError, match=r"control\[0\]\.data_type.*TYPE_STRING is not supported"):
        parse_model_config(text, source="t", default_name="m")


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
    r, middle = Req(5, start=True), Req(5)
    b.add(r)
    b.decide()
    b.finish(r, None)
    b.add(middle)
    b.decide()
    b.release(middle)  # answered already: the sequence goes on, its state untouched
    nxt = Req(5)  # (a START let go leaves it not started: test_sequence_start_unrun.py)
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


def test_a_sequence_resumed_goes_on_from_the_state_it_left() -> None:
    clock = Clock()
    b = batcher(clock, max_sequences=2)
    nxt = Req(9)
    assert not b.holds((0, 9))
    b.resume((0, 9), {"SIN": np.array([4.0, 5.0])}, nxt)
    assert b.holds((0, 9)) and b.active == 1
    b.add(nxt)
    (got,) = b.decide().batch
    step = b.step(got)
    assert not step.start and step.state is not None and step.state["SIN"].tolist() == [4.0, 5.0]
    b.resume((0, 9), {"SIN": np.array([0.0, 0.0])}, Req(9))  # held here: what runs here wins
    b.finish(got, {"SIN": np.array([6.0, 7.0])})
    again = Req(9)
    b.add(again)
    b.decide()
    assert b.step(again).state["SIN"].tolist() == [6.0, 7.0]  # type: ignore[index]
    b.resume((0, 10), {}, Req(10))
    with pytest.raises(QueueFull, match="2 sequences"):
        b.resume((0, 11), {}, Req(11))


def _accumulate_runs() -> tuple[SequenceRuns, ModelSpec]:
    spec = ModelRepository(REPOSITORY).spec("accumulate")
    return SequenceRuns(spec, Names("t.", "t:"), keep_s=60), spec


def _item(
    key: int | str, value: int, *, start: bool = False, end: bool = False, sent_us: int = 0
) -> WorkItem:
    params = {"sequence_id": key, "sequence_start": start, "sequence_end": end}
    x = Tensor.from_numpy("INPUT", np.array([[value]], np.int32))
    req = InferRequest(f"{key}-{value}", "accumulate", "", (x,), parameters=params, sent_us=sent_us)
    return WorkItem(req, rows=1, version=1)


def _answer(item: WorkItem, total: int | None) -> InferResult:
    if total is None:
        return InferResult(item.request.id, "accumulate", "1", error=ErrorInfo("model_error", "x"))
    outputs = tuple(
        Tensor.from_numpy(name, np.array([[total]], np.int32)) for name in ("OUTPUT", "SUM_OUT")
    )
    return InferResult(item.request.id, "accumulate", "1", outputs=outputs)


def test_each_answer_carries_its_sequences_state_to_keep() -> None:
    runs, spec = _accumulate_runs()
    first = _item(3, 5, start=True, sent_us=int(time.time() * 1e6))
    failed, ends = _item("s", 1, start=True), _item(4, 2, end=True)
    kept = encode_state({"SUM_IN": np.array([7], np.int32)}, time.time())
    assert runs.resume((1, 4), kept, ends, sent=time.time())  # the state Redis kept
    for it in (first, failed, ends):
        runs.batcher.add(it)
    batch = runs.batcher.decide().batch
    assert batch == [first, failed, ends]
    assert runs.batcher.step(ends).state["SUM_IN"].tolist() == [7]  # type: ignore[index]
    runs.prepare(batch)  # what the model gets; the answers belong to the batch as handed out
    answers, writes = runs.complete(
        batch, [_answer(batch[0], 5), _answer(batch[1], None), _answer(batch[2], 9)]
    )
    assert [t.name for t in answers[0].outputs] == ["OUTPUT"]  # the state is not sent back
    by_index = {w.index: w for w in writes}
    assert by_index[0].key == "t:sequence:accumulate:1:i:3"
    state, made, sent = decode_state(by_index[0].state or b"")
    assert state["SUM_IN"].tolist() == [5] and abs(made - time.time()) < 60
    assert sent == first.request.sent_us / 1e6 and sent > 0  # its request's, as stamped
    assert by_index[1].key == "t:sequence:accumulate:1:s:s"  # a failed START: zeros next
    assert decode_state(by_index[1].state or b"")[0] == {}
    assert by_index[2].state is None  # its END: the kept state goes
    # kept past the idle time as long as the answers are: a late owner still takes it up
    assert {w.ttl_ms for w in writes} == {spec.sequence.max_idle_us // 1000 + 60_000}


def test_a_failed_step_keeps_the_state_before_it() -> None:
    runs, _ = _accumulate_runs()
    # as if from Redis
    runs.batcher.resume((1, 6), {"SUM_IN": np.array([3], np.int32)}, _item(6, 1))
    step = _item(6, 1)
    runs.batcher.add(step)
    batch = runs.batcher.decide().batch
    runs.prepare(batch)  # what the model gets; the answers belong to the batch as handed out
    _, writes = runs.complete(batch, [_answer(batch[0], None)])
    assert writes == []  # Redis keeps the state before it, as the batcher does


def test_a_state_is_kept_as_bytes_and_read_back() -> None:
    state = {"A": np.arange(6, dtype=np.float32).reshape(2, 3), "B": np.array([True, False])}
    back, made, sent = decode_state(encode_state(state, 1234.5, 1230.25))
    assert {n: (a.dtype, a.tolist()) for n, a in back.items()} == {
        n: (a.dtype, a.tolist()) for n, a in state.items()
    }
    assert (made, sent) == (1234.5, 1230.25)
    assert decode_state(encode_state(None, 0.0)) == ({}, 0.0, 0.0)
    # a state kept before the send time was: two fields, read with the send time unknown
    older = msgspec.msgpack.encode([99.0, {}])
    assert decode_state(older) == ({}, 99.0, 0.0)


def test_a_sequence_whose_next_request_came_after_its_idle_time_is_not_taken_up() -> None:
    runs, spec = _accumulate_runs()
    idle_s = spec.sequence.max_idle_us / 1e6
    kept = encode_state({"SUM_IN": np.array([3], np.int32)}, 1000.0)
    assert not runs.resume((1, 5), kept, _item(5, 1), sent=1000.0 + idle_s + 0.5)
    assert not runs.batcher.holds((1, 5))  # refused as not started, as on its own worker
    # sent in time, taken up however long it then waited in Kafka for a new owner
    assert runs.resume((1, 5), kept, _item(5, 1), sent=1000.0 + idle_s - 0.5)
    assert runs.batcher.holds((1, 5))


def test_idle_is_judged_by_the_senders_clocks_not_the_workers() -> None:
    """The state was made by a worker whose clock runs 30 s behind the gateway's: its next
    request, sent 0.4 s after the one that made it, goes on; one sent past the idle time
    after it does not, whatever the worker's clock said."""
    runs, spec = _accumulate_runs()
    idle_s = spec.sequence.max_idle_us / 1e6
    assert idle_s < 30
    kept = encode_state({"SUM_IN": np.array([3], np.int32)}, at=970.0, sent=1000.0)
    assert runs.resume((1, 7), kept, _item(7, 1), sent=1000.4)
    assert runs.batcher.holds((1, 7))
    later = encode_state({"SUM_IN": np.array([3], np.int32)}, at=1030.0, sent=1000.0)
    assert not runs.resume((1, 8), later, _item(8, 1), sent=1000.0 + idle_s + 0.1)


def test_which_requests_need_their_sequences_state() -> None:
    runs, _ = _accumulate_runs()
    assert runs.needs_state(_item(1, 1)) == (1, 1)  # not held here, not a START: v1's 1
    assert runs.needs_state(_item(1, 1, start=True)) is None
    runs.batcher.add(_item(2, 1, start=True))
    assert runs.needs_state(_item(2, 1)) is None  # held
    bad = WorkItem(InferRequest("x", "accumulate", "", _item(1, 1).request.inputs), 1, 1)
    assert runs.needs_state(bad) is None and runs.key_of(bad) is None  # refused as before


_FROM_FILE = _SEQ.replace(
    "dims: [ 2 ] }",
    'dims: [ 2 ] initial_state [{ data_type: TYPE_FP32 dims: [ 2 ] data_file: "sin.bin" }] }',
).replace("max_queue_delay_microseconds: 500", "max_queue_delay_microseconds: 0")


def test_a_state_may_start_from_a_data_file(tmp_path: Path) -> None:
    spec = parse_model_config(_BASE + _FROM_FILE, source="t", default_name="m")
    assert spec.sequence.states[0].initial_file == "sin.bin"
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "sin.bin").write_bytes(np.array([1.5, -2], "<f4").tobytes())
    initial = initial_states(spec, tmp_path)
    assert initial["SIN"].tolist() == [1.5, -2.0]
    runs = SequenceRuns(spec, Names("t.", "t:"), keep_s=60, initial=initial)
    start = _item(4, 1, start=True)
    runs.batcher.add(start)
    (prepared,) = runs.prepare(runs.batcher.decide().batch)
    given = {t.name: t.to_numpy() for t in prepared.request.inputs}
    assert given["SIN"].tolist() == [[1.5, -2.0]]  # not zeros, at its START


def test_a_missing_or_misfit_initial_state_file_is_a_config_error(tmp_path: Path) -> None:
    spec = parse_model_config(_BASE + _FROM_FILE, source="t", default_name="m")
    with pytest.raises(ConfigError, match=r"sin\.bin"):
        initial_states(spec, tmp_path)
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "sin.bin").write_bytes(b"\0" * 12)
    with pytest.raises(ConfigError, match="holds 12 bytes; FP32 \\[2\\] is 8"):
        initial_states(spec, tmp_path)


def test_on_a_cluster_a_sequence_is_taken_up_from_its_last_answer_found_at_intake() -> None:
    """Where answers carry their states (a Redis Cluster's writer), a request found
    answered at intake, of a sequence not held here, points its next request at the state
    stored with that answer, then at the sequence's own key; once, and never for a
    sequence held here or a partition moved away."""
    spec = ModelRepository(REPOSITORY).spec("accumulate")
    names = Names("t.", "t:")
    runs = SequenceRuns(spec, names, keep_s=60, answer_states=True)
    own = names.sequence_state_key("accumulate", 1, 5)
    assert runs.state_keys_for((1, 5)) == (own,)
    runs.skipped(_item(5, 1))
    runs.skipped(_item(5, 2))  # the later answer of the two
    assert runs.state_keys_for((1, 5)) == (names.answer_state_key("5-2"), own)
    assert runs.state_keys_for((1, 5)) == (own,)  # asked once
    runs.batcher.resume((1, 6), {}, _item(6, 1))
    runs.skipped(_item(6, 3))  # held here: what runs here goes on
    assert runs.state_keys_for((1, 6)) == (names.sequence_state_key("accumulate", 1, 6),)
    moved = _item(7, 1)
    runs.skipped(moved)
    runs.forget({moved.partition})
    assert runs.state_keys_for((1, 7)) == (names.sequence_state_key("accumulate", 1, 7),)
    plain = SequenceRuns(spec, names, keep_s=60)  # standalone Redis: one script, nothing kept
    plain.skipped(_item(5, 1))
    assert plain.state_keys_for((1, 5)) == (own,)
