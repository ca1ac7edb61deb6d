"""``oldest.max_candidate_sequences`` is each version's limit, as each version of a Triton
model has its own sequence batcher: a worker serving versions 1 and 2 with a limit of 2
holds two sequences of each at once, and a third of one version is ``queue_full`` while
the other version still has its own room. The sequence batcher on a fake clock."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from plaza.contract import InferRequest
from plaza.errors import QueueFull
from plaza.modelconfig import parse_model_config
from plaza.naming import Names
from plaza.sequence_batching import SequenceBatcher, SequenceFlags
from plaza.sequence_config import SequenceBatching
from plaza.tensors import Tensor
from plaza.workers.runner import WorkItem
from plaza.workers.sequences import SequenceRuns, encode_state
from tests.fakes import ManualClock as Clock


@dataclass(eq=False)
class Req:
    key: int
    version: int
    start: bool = False
    end: bool = False


def _batcher(clock: Clock, max_sequences: int = 2) -> SequenceBatcher[Req]:
    policy = SequenceBatching(enabled=True, max_idle_us=1_000_000, max_sequences=max_sequences)
    return SequenceBatcher(
        policy, 8, lambda r: SequenceFlags(r.key, r.start, r.end, r.version), clock
    )


def _run_all(b: SequenceBatcher[Req]) -> None:
    for item in b.decide().batch:
        b.finish(item, {})


def test_each_version_holds_its_own_max_candidate_sequences() -> None:
    b = _batcher(Clock())
    for version in (1, 2):
        for key in (1, 2):
            b.add(Req(key, version, start=True))
    assert b.active == 4
    for version in (1, 2):
        with pytest.raises(QueueFull, match=f"2 sequences of version {version} are active"):
            b.add(Req(3, version, start=True))
    b.add(Req(1, 3, start=True))  # a third version has its own room too


def test_an_end_makes_room_on_its_own_version_only() -> None:
    b = _batcher(Clock())
    for version in (1, 2):
        for key in (1, 2):
            b.add(Req(key, version, start=True))
    _run_all(b)
    b.add(Req(1, 1, end=True))
    _run_all(b)
    assert not b.holds((1, 1))
    with pytest.raises(QueueFull, match="of version 2"):
        b.add(Req(3, 2, start=True))
    b.add(Req(3, 1, start=True))
    with pytest.raises(QueueFull, match="of version 1"):
        b.add(Req(4, 1, start=True))


def test_idle_release_and_removal_make_room_on_their_own_version() -> None:
    clock = Clock()
    b = _batcher(clock)
    for key in (1, 2):
        b.add(Req(key, 1, start=True))
    _run_all(b)
    clock.now += 0.6
    for key in (1, 2):
        b.add(Req(key, 2, start=True))
    _run_all(b)
    clock.now += 0.6  # version 1's sequences idle 1.2 s, version 2's 0.6 s
    b.decide()
    assert b.active == 2
    b.add(Req(3, 1, start=True))
    with pytest.raises(QueueFull, match="of version 2"):
        b.add(Req(3, 2, start=True))
    assert b.remove_if(lambda r: r.version == 2 and r.key == 1) == []
    b.add(Req(3, 2, start=True))  # the partition moved away: version 2 has room again


def test_resume_counts_against_its_own_version() -> None:
    b = _batcher(Clock())
    for key in (1, 2):
        b.add(Req(key, 1, start=True))
    with pytest.raises(QueueFull, match="of version 1"):
        b.resume((1, 9), {}, Req(9, 1))
    for key in (8, 9):
        b.resume((2, key), {}, Req(key, 2))
    assert b.holds((2, 8)) and b.holds((2, 9)) and not b.holds((1, 9))
    with pytest.raises(QueueFull, match="of version 2"):
        b.add(Req(1, 2, start=True))


def test_a_restart_of_a_held_sequence_takes_no_more_room() -> None:
    """A START run alone (``adopt``) of a sequence still held after its END (a request
    queued behind the END) starts it again in place: its version holds one sequence
    there, not two."""
    b = _batcher(Clock())
    b.add(Req(1, 1, start=True))
    _run_all(b)
    b.add(Req(1, 1, end=True))
    b.add(Req(1, 1))  # behind the END: keeps the sequence held once the END ran
    (end,) = b.decide().batch
    b.finish(end, None)
    assert b.holds((1, 1))
    b.adopt(Req(1, 1, start=True))
    b.add(Req(2, 1, start=True))
    with pytest.raises(QueueFull, match="2 sequences of version 1"):
        b.add(Req(3, 1, start=True))


_CONFIG = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 4
version_policy { all { } }
input [{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }]
sequence_batching {
  control_input [
    { name: "S" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }] }
  ]
  oldest { max_candidate_sequences: 2 }
}
"""


def test_a_worker_takes_sequences_up_per_version() -> None:
    """The worker's sequences (``SequenceRuns``) with the limit read from the config: a
    sequence taken up from Redis on version 2 is not refused for version 1's."""
    spec = parse_model_config(_CONFIG, source="t", default_name="m")
    runs = SequenceRuns(spec, Names("t.", "t:"), keep_s=60)

    def item(key: int, version: int, start: bool = False) -> WorkItem:
        params: dict[str, str | int | float | bool] = {
            "sequence_id": key,
            "sequence_start": start,
        }
        x = Tensor.from_numpy("INPUT", np.array([[1]], np.int32))
        req = InferRequest(f"{key}-v{version}", "m", str(version), (x,), parameters=params)
        return WorkItem(req, rows=1, version=version)

    for key in (1, 2):
        runs.batcher.add(item(key, 1, start=True))
    stored, now = encode_state({}, 0.0, 0.0), 0.0
    assert runs.resume((2, 1), stored, item(1, 2), now)
    assert runs.resume((2, 2), stored, item(2, 2), now)
    with pytest.raises(QueueFull, match="2 sequences of version 2"):
        runs.resume((2, 3), stored, item(3, 2), now)
    with pytest.raises(QueueFull, match="2 sequences of version 1"):
        runs.batcher.add(item(3, 1, start=True))
