"""One stateful model serving several versions: one worker, one batcher, and each version
with its own sequences, as each version of a Triton model has its own sequence batcher.
The same ``sequence_id`` on two versions is two sequences: a START on one does not reset
the other, an END on one does not end the other, each keeps its own state (in the worker
and under its own Redis key) and its own idle time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from plaza.contract import InferRequest, InferResult
from plaza.errors import InvalidInput
from plaza.modelconfig import parse_model_config
from plaza.naming import Names
from plaza.repository import ModelRepository
from plaza.sequence_batching import SequenceBatcher, SequenceFlags
from plaza.sequence_config import SequenceBatching
from plaza.tensors import Tensor
from plaza.workers.runner import WorkItem
from plaza.workers.sequences import SequenceRuns, decode_state
from tests.fakes import ManualClock as Clock
from tests.support import REPOSITORY

NAMES = Names("t.", "t:")


def _runs() -> SequenceRuns:
    return SequenceRuns(ModelRepository(REPOSITORY).spec("accumulate"), NAMES, keep_s=60)


def _item(
    key: int | str, value: int, version: int, *, start: bool = False, end: bool = False
) -> WorkItem:
    params = {"sequence_id": key, "sequence_start": start, "sequence_end": end}
    x = Tensor.from_numpy("INPUT", np.array([[value]], np.int32))
    req = InferRequest(
        f"{key}-{value}-v{version}", "accumulate", str(version), (x,), parameters=params
    )
    return WorkItem(req, rows=1, version=version)


def _accumulate(item: WorkItem) -> InferResult:
    """What accumulate answers to ``item`` as prepared: SUM_IN (zeros at a START, as the
    worker gives it) plus INPUT, as OUTPUT and as the state SUM_OUT."""
    given = {t.name: int(t.to_numpy().ravel()[0]) for t in item.request.inputs}
    total = given["INPUT"] + given["SUM_IN"]
    outputs = tuple(
        Tensor.from_numpy(name, np.array([[total]], np.int32)) for name in ("OUTPUT", "SUM_OUT")
    )
    return InferResult(item.request.id, "accumulate", str(item.version), outputs=outputs)


def _run(runs: SequenceRuns, *items: WorkItem) -> tuple[list[int], list[tuple[str, bytes | None]]]:
    """Queue ``items``, run the batch the batcher hands out (it must be all of them): each
    one's sum, and the states written to Redis (key, kept bytes; None: deleted)."""
    for item in items:
        runs.batcher.add(item)
    batch = runs.batcher.decide().batch
    assert batch == list(items)
    answers, writes = runs.complete(batch, [_accumulate(i) for i in runs.prepare(batch)])
    sums = [int(a.outputs[0].to_numpy().ravel()[0]) for a in answers]
    return sums, [(w.key, w.state) for w in writes]


def test_a_start_on_one_version_does_not_reset_the_same_id_on_another() -> None:
    runs = _runs()
    assert _run(runs, _item(7, 10, 1, start=True))[0] == [10]
    assert _run(runs, _item(7, 1000, 2, start=True))[0] == [1000]
    sums, writes = _run(runs, _item(7, 1, 1))
    assert sums == [11]  # v1's own sum goes on, not from v2's START
    ((key, kept),) = writes
    assert key == NAMES.sequence_state_key("accumulate", 1, 7)
    assert decode_state(kept or b"")[0]["SUM_IN"].tolist() == [11]
    assert _run(runs, _item(7, 5, 2))[0] == [1005]


def test_an_end_on_one_version_does_not_end_the_same_id_on_another() -> None:
    runs = _runs()
    _run(runs, _item(7, 10, 1, start=True), _item(7, 1000, 2, start=True))
    sums, writes = _run(runs, _item(7, 5, 2, end=True))
    assert sums == [1005]
    assert writes == [(NAMES.sequence_state_key("accumulate", 2, 7), None)]  # v2's key only
    assert runs.batcher.holds((1, 7)) and not runs.batcher.holds((2, 7))
    assert _run(runs, _item(7, 2, 1))[0] == [12]  # v1's sequence goes on
    with pytest.raises(InvalidInput, match="sequence 7 of version 2 has not started"):
        runs.batcher.add(_item(7, 3, 2))


def test_the_same_id_on_two_versions_runs_in_one_batch_with_its_own_state() -> None:
    """Two sequences, so both heads are candidates at once (one request per sequence per
    batch), each with its own state."""
    runs = _runs()
    assert _run(runs, _item(3, 1, 1, start=True), _item(3, 100, 2, start=True))[0] == [1, 100]
    sums, writes = _run(runs, _item(3, 2, 1), _item(3, 200, 2))
    assert sums == [3, 300]
    assert [key for key, _ in writes] == [
        NAMES.sequence_state_key("accumulate", 1, 3),
        NAMES.sequence_state_key("accumulate", 2, 3),
    ]


def test_a_sequence_held_on_one_version_is_not_held_on_another() -> None:
    """The worker reads a state from Redis for a request of a sequence it does not hold
    (``needs_state``): the same id held on another version is not that sequence."""
    runs = _runs()
    _run(runs, _item(7, 10, 1, start=True))
    assert runs.needs_state(_item(7, 1, 1)) is None
    assert runs.needs_state(_item(7, 1, 2)) == (2, 7)
    assert runs.key_of(_item(7, 1, 2)) == (2, 7)
    assert runs.state_keys_for((2, 7)) == (NAMES.sequence_state_key("accumulate", 2, 7),)


def test_the_corrid_control_is_the_sequence_id_alone() -> None:
    config = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }]
sequence_batching {
  control_input [{ name: "C" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }] }]
}
"""
    runs = SequenceRuns(parse_model_config(config, source="t", default_name="m"), NAMES, 60)
    items = [_item(42, 1, 1, start=True), _item(42, 1, 2, start=True)]
    for item in items:
        runs.batcher.add(item)
    prepared = runs.prepare(runs.batcher.decide().batch)
    corrids = [next(t for t in p.request.inputs if t.name == "C").to_numpy() for p in prepared]
    assert [c.tolist() for c in corrids] == [[[42]], [[42]]]


@dataclass
class Req:
    key: int
    version: int
    start: bool = False


def test_each_version_of_a_sequence_goes_idle_on_its_own() -> None:
    """A request of sequence 5 on version 2 keeps version 2's sequence alive, not version
    1's: that one is released once idle, as if alone."""
    clock = Clock()
    policy = SequenceBatching(enabled=True, max_idle_us=1_000_000)
    b = SequenceBatcher(
        policy, 4, lambda r: SequenceFlags(r.key, r.start, version=r.version), clock
    )
    for version in (1, 2):
        first = Req(5, version, start=True)
        b.add(first)
        (got,) = b.decide().batch
        b.finish(got, {})
    clock.now += 0.6
    b.add(Req(5, 2))
    (got,) = b.decide().batch
    b.finish(got, {})
    clock.now += 0.6  # v1 idle 1.2 s, v2 0.6 s
    b.decide()
    assert not b.holds((1, 5)) and b.holds((2, 5))
    with pytest.raises(InvalidInput, match="of version 1 has not started"):
        b.add(Req(5, 1))
    b.add(Req(5, 2))
