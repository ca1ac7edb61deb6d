"""``plaza.retry.refused_for_good``: which of Redis' error replies no retry cures."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError

from plaza.resp_channel import CommandError
from plaza.retry import refused_for_good


def test_a_refusal_of_the_call_itself_is_for_good() -> None:
    assert refused_for_good(CommandError("ERR Protocol error: invalid bulk length"))
    assert refused_for_good(ResponseError("ERR string exceeds maximum allowed size"))
    assert refused_for_good(CommandError("WRONGTYPE Operation against a key"))


def test_a_state_of_the_server_that_passes_is_not() -> None:
    for passing in (
        CommandError("OOM command not allowed when used memory > 'maxmemory'."),
        CommandError("READONLY You can't write against a read only replica."),
        CommandError("LOADING Redis is loading the dataset in memory"),
        CommandError("MISCONF Redis is configured to save RDB snapshots"),
        CommandError("NOSCRIPT No matching script."),
        OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        ReadOnlyError("You can't write against a read only replica."),
        RedisConnectionError("connection to Redis lost"),
        TimeoutError("timed out"),
    ):
        assert not refused_for_good(passing), passing
