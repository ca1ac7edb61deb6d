"""A START that never runs leaves no state of the sequence before it usable, whichever way
it failed to run.

The batcher unstarts a sequence whose START expired in its queue or was handed out and let
go (``tests/unit/test_sequence_start_unrun.py``). A START can also fail to run without ever
being handed out: a suspect (a record delivered before) runs alone, outside the batches,
and may expire, be found answered (its caller cancelled it) or be dead-lettered first. Its
release must unstart the sequence held here all the same, or the request after it runs on
the state of the sequence before it (the same id, left without an END).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plaza.errors import InvalidInput
from plaza.sequence_batching import SequenceBatcher, SequenceFlags
from plaza.sequence_config import SequenceBatching


@dataclass(eq=False)
class Req:
    key: int
    start: bool = False
    end: bool = False
    bad: bool = False


def flags(req: Req) -> SequenceFlags:
    if req.bad:
        raise InvalidInput("names no sequence")
    return SequenceFlags(req.key, req.start, req.end)


def batcher() -> SequenceBatcher[Req]:
    policy = SequenceBatching(enabled=True, max_idle_us=10_000_000, max_sequences=8)
    return SequenceBatcher(policy, 4, flags, clock=lambda: 100.0)


def run(b: SequenceBatcher[Req], req: Req, total: float) -> None:
    b.add(req)
    assert b.decide().batch == [req]
    b.finish(req, {"SUM": np.array([total])})


def test_a_start_released_without_being_handed_out_unstarts_its_sequence() -> None:
    b = batcher()
    run(b, Req(7, start=True), 5.0)
    run(b, Req(7), 11.0)  # the client gives this sequence up, without an END
    b.release(Req(7, start=True))  # a suspect START: never handed out, never run
    after = Req(7)
    b.add(after)
    decision = b.decide()
    assert decision.batch == []
    assert [(r, "has not started" in e.message) for r, e in decision.refused] == [(after, True)]
    again = Req(7, start=True)  # a START that runs begins it anew, from zeros
    b.add(again)
    assert b.decide().batch == [again] and b.step(again).state is None


def test_a_request_released_unrun_that_is_not_a_start_leaves_its_sequence_going() -> None:
    b = batcher()
    run(b, Req(7, start=True), 5.0)
    b.release(Req(7))  # a suspect step that will not run
    b.release(Req(7, bad=True))  # one whose parameters name no sequence: nothing to do
    b.release(Req(8, start=True))  # a START of a sequence not held here: nothing to do
    after = Req(7)
    b.add(after)
    assert b.decide().batch == [after]
    assert b.step(after).state["SUM"].tolist() == [5.0]  # type: ignore[index]
    assert b.active == 1
