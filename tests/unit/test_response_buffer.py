"""The buffer between a decoupled model's thread and the worker's writer (pure logic)."""

from __future__ import annotations

import threading

import pytest

from plaza.contract import InferResult
from plaza.errors import ModelExecutionError
from plaza.workers import responses
from plaza.workers.responses import ResponseBuffer


def _answer(i: int) -> tuple[InferResult, str | None]:
    return InferResult("r", "m", "1", index=i, final=False), "stream"


def test_the_writer_is_woken_once_per_take_and_takes_in_order() -> None:
    wakes: list[int] = []
    buffer = ResponseBuffer(lambda: wakes.append(len(buffer)), lambda: False)
    for i in range(3):
        buffer.add(_answer(i))
    assert wakes == [1] and len(buffer) == 3  # the first into an empty buffer wakes
    assert [r.index for r, _ in buffer.take()] == [0, 1, 2] and len(buffer) == 0
    buffer.add(_answer(3))
    assert wakes == [1, 1]  # empty again: the next one wakes again
    assert buffer.take()[0][0].index == 3 and buffer.take() == []


def test_a_full_buffer_holds_the_model_until_the_writer_takes() -> None:
    buffer = ResponseBuffer(lambda: None, lambda: False, limit=2)
    buffer.add(_answer(0))
    buffer.add(_answer(1))
    added = threading.Event()

    def third() -> None:
        buffer.add(_answer(2))
        added.set()

    sender = threading.Thread(target=third)
    sender.start()
    assert not added.wait(0.2)  # held: the limit is reached
    assert [r.index for r, _ in buffer.take()] == [0, 1]
    assert added.wait(5)  # the take made room
    sender.join(5)
    assert [r.index for r, _ in buffer.take()] == [2]


def test_a_held_send_gives_up_once_the_worker_stops_writing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(responses, "CLOSED_CHECK_S", 0.01)
    stopped = threading.Event()
    buffer = ResponseBuffer(lambda: None, stopped.is_set, limit=1)
    buffer.add(_answer(0))
    failures: list[BaseException] = []

    def held() -> None:
        try:
            buffer.add(_answer(1))
        except ModelExecutionError as exc:
            failures.append(exc)

    sender = threading.Thread(target=held)
    sender.start()
    stopped.set()
    sender.join(5)
    assert not sender.is_alive() and len(failures) == 1
    assert "stopped before the response could be written" in str(failures[0])
    assert [r.index for r, _ in buffer.take()] == [0]  # the one it had is still there
