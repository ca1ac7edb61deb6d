"""Pure logic of Redis' failures: their wording, the OOM log, the unmarked jobs, the
eviction policy warning (fakes stand in for Redis' answers only)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ResponseError

from plaza import connections, retry
from plaza.producer import UnmarkedJobs
from plaza.retry import out_of_memory, redis_failure, until_done


def test_a_failure_is_worded_by_what_redis_did() -> None:
    assert redis_failure(OutOfMemoryError("no room")).startswith("Redis is out of memory")
    script_oom = ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
    assert out_of_memory(script_oom)
    refused = redis_failure(ResponseError("NOGROUP No such key"))
    assert refused.startswith("Redis refused") and "did not answer" not in refused
    assert redis_failure(RedisConnectionError("closed")).startswith("Redis did not answer")


async def test_an_out_of_memory_redis_is_logged_as_such_once_a_while(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retry, "FIRST_DELAY_S", 0.0)
    monkeypatch.setattr(retry._OomLog, "last", -float("inf"))
    left = [OutOfMemoryError("full")] * 3

    async def call() -> int:
        if left:
            raise left.pop()
        return 7

    with caplog.at_level(logging.WARNING, "plaza.retry"):
        assert await until_done(call, "writing 1 results") == 7
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and r.name == "plaza.retry"  # not a stray client's
    ]
    assert len(errors) == 1 and "Redis is out of memory (maxmemory)" in errors[0]


def test_unmarked_jobs_are_bounded_and_forgotten_when_their_marker_would_be() -> None:
    jobs = UnmarkedJobs(limit=2)
    jobs.add("a", 60)
    jobs.add("b", 60)
    jobs.add("c", 60)
    assert "a" not in jobs and "b" in jobs and "c" in jobs  # the oldest went first
    jobs.add("d", 0)
    assert "d" not in jobs  # its marker would have expired already
    jobs.discard("c")
    assert "c" not in jobs


class FakeConfig:
    def __init__(self, answer: dict[Any, Any] | Exception) -> None:
        self.answer = answer

    async def config_get(self, name: str) -> dict[Any, Any]:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "warned"),
    [
        ({b"maxmemory-policy": b"allkeys-lru"}, True),
        ({"maxmemory-policy": "allkeys-random"}, True),
        ({b"maxmemory-policy": b"noeviction"}, False),
        ({b"maxmemory-policy": b"volatile-lru"}, False),
        (ResponseError("unknown command 'CONFIG'"), False),  # a managed Redis
    ],
)
async def test_an_evicting_redis_is_warned_of(
    answer: dict[Any, Any] | Exception,
    warned: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake: Any = FakeConfig(answer)
    with caplog.at_level(logging.WARNING, "plaza.connections"):
        await connections.warn_if_evicting(fake)
    lines = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert len(lines) == (1 if warned else 0)
