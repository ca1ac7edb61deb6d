"""A START that never runs leaves its sequence not started, as an END does.

A START can leave the batcher unrun two ways: its deadline passes while it waits (the worker
answers it with a timeout), or it was handed out and let go because its caller cancelled it
(``release``). Either way the model never saw it, so the requests after it must not run on
the state of the sequence before it (same id, a sequence its client gave up on), nor on
zeros as if it had started: they are refused as not started (``invalid_input``), as another
worker that never held the sequence refuses them, until a START comes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from plaza.errors import InvalidInput
from plaza.sequence_batching import SequenceBatcher, SequenceFlags
from plaza.sequence_config import SequenceBatching
from tests.fakes import ManualClock as Clock


@dataclass(eq=False)
class Req:
    key: int
    start: bool = False
    end: bool = False


def batcher(clock: Clock, max_sequences: int = 8) -> SequenceBatcher[Req]:
    policy = SequenceBatching(enabled=True, max_idle_us=10_000_000, max_sequences=max_sequences)
    return SequenceBatcher(policy, 4, lambda r: SequenceFlags(r.key, r.start, r.end), clock)


def run(b: SequenceBatcher[Req], req: Req, total: float) -> None:
    """Add ``req``, hand it out and finish it with state ``total``."""
    b.add(req)
    assert b.decide().batch == [req]
    b.finish(req, {"SUM": np.array([total])})


def refused_as_not_started(b: SequenceBatcher[Req], req: Req) -> bool:
    """Whether ``req`` is refused as not started, at once or by the next decision."""
    try:
        b.add(req)
    except InvalidInput as exc:
        return "has not started" in exc.message
    decision = b.decide()
    assert decision.batch == [], "it ran"
    return [(r, "has not started" in e.message) for r, e in decision.refused] == [(req, True)]


def test_a_start_past_its_deadline_does_not_leave_the_old_state() -> None:
    clock = Clock()
    b = batcher(clock)
    run(b, Req(7, start=True), 5.0)
    run(b, Req(7), 11.0)  # the client gives this sequence up, without an END
    restart = Req(7, start=True)
    b.add(restart, deadline=clock.now + 1)
    clock.now += 2
    decision = b.decide()
    assert decision.expired == [restart] and decision.batch == []
    assert refused_as_not_started(b, Req(7))
    again = Req(7, start=True)  # a START begins it anew, from zeros
    b.add(again)
    assert b.decide().batch == [again] and b.step(again).state is None


def test_a_start_past_its_deadline_refuses_those_queued_behind_it() -> None:
    clock = Clock()
    b = batcher(clock)
    run(b, Req(7, start=True), 5.0)
    restart, second, third = Req(7, start=True), Req(7), Req(7, end=True)
    b.add(restart, deadline=clock.now + 1)
    b.add(second)
    b.add(third)
    fresh, fresh_next = Req(9, start=True), Req(9)  # a new id: no state at all before
    b.add(fresh, deadline=clock.now + 1)
    b.add(fresh_next)
    clock.now += 2
    decision = b.decide()
    assert decision.expired == [restart, fresh] and decision.batch == []
    assert [r for r, _ in decision.refused] == [second, third, fresh_next]
    assert all("has not started" in e.message for _, e in decision.refused)
    assert len(b) == 0


def test_a_start_let_go_unrun_does_not_leave_the_old_state() -> None:
    clock = Clock()
    b = batcher(clock)
    run(b, Req(7, start=True), 5.0)
    restart = Req(7, start=True)
    b.add(restart)
    assert b.decide().batch == [restart]
    b.release(restart)  # its caller cancelled it: answered, never run
    assert refused_as_not_started(b, Req(7))


def test_a_new_sequence_whose_start_is_let_go_is_not_run_from_zeros() -> None:
    clock = Clock()
    b = batcher(clock)
    start, queued = Req(8, start=True), Req(8)
    b.add(start)
    b.add(queued)  # waits behind its START
    assert b.decide().batch == [start]
    b.release(start)
    decision = b.decide()
    assert decision.batch == [] and [r for r, _ in decision.refused] == [queued]
    assert refused_as_not_started(b, Req(8))


def test_a_step_let_go_unrun_is_not_a_start_the_sequence_goes_on() -> None:
    clock = Clock()
    b = batcher(clock)
    run(b, Req(7, start=True), 5.0)
    step = Req(7)
    b.add(step)
    b.decide()
    b.release(step)
    after = Req(7)
    b.add(after)
    assert b.decide().batch == [after]
    assert b.step(after).state["SUM"].tolist() == [5.0]  # type: ignore[index]


def test_a_sequence_whose_start_never_ran_is_counted_until_its_idle_time_is_out() -> None:
    clock = Clock()
    b = batcher(clock, max_sequences=1)
    start = Req(1, start=True)
    b.add(start, deadline=clock.now + 1)
    clock.now += 2
    assert b.decide().expired == [start]
    assert b.active == 1  # held as not started: a request after it is refused here
    clock.now += 10
    b.decide()  # idle: released, and counted no more
    assert b.active == 0
    b.add(Req(2, start=True))  # room for another
    with pytest.raises(InvalidInput, match="has not started"):
        b.add(Req(1))
