"""Counting at the end of a fault test: drained, then answers per correlation id."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import redis.asyncio
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from plaza.codec import decode_result, decode_results
from plaza.contract import InferResult
from plaza.naming import STREAM_FIELD_RESULTS, Names
from plaza.stack import Deployment, wait_for
from tests.faults.harness import request_topic, worker_group

if TYPE_CHECKING:
    from tests.faults.traffic import ResultTail


async def committed_lag(deployment: Deployment) -> int:
    """Records of the request topic that the worker group has not committed yet."""
    topic, group = request_topic(deployment), worker_group(deployment)
    tps = [TopicPartition(topic, p) for p in range(deployment.partitions)]
    admin = AIOKafkaAdminClient(bootstrap_servers=deployment.bootstrap, request_timeout_ms=5000)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=deployment.bootstrap, group_id=None, request_timeout_ms=5000
    )
    try:
        await admin.start()
        await consumer.start()
        committed = await admin.list_consumer_group_offsets(group, partitions=tps)
        ends = await consumer.end_offsets(tps)
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
        with contextlib.suppress(Exception):
            await admin.close()
    return sum(
        max(0, ends[tp] - max(0, committed[tp].offset if tp in committed else 0)) for tp in tps
    )


async def wait_drained(deployment: Deployment, limit_s: float = 60.0) -> None:
    """Until the group has committed every record: no replay (no late duplicate) can follow."""

    async def drained() -> bool:
        try:
            return await committed_lag(deployment) == 0
        except Exception:  # a coordinator moving after a broker fault: ask again
            return False

    await wait_for(drained, limit_s, f"group {worker_group(deployment)} to commit everything")


async def wait_all_answered(
    tail: ResultTail,
    expected: int,
    deployment: Deployment,
    log: Callable[[], str],
    limit_s: float = 120.0,
) -> None:
    """Until ``expected`` answers reached the result stream and the group committed them."""
    await wait_for(
        lambda: tail.answered >= expected,
        limit_s,
        "every answer",
        lambda: f"{tail.answered}/{expected} answered\n{log()}",
    )
    await wait_drained(deployment)


@dataclass
class FaultReport:
    """What one fault test counted, per correlation id, at the end."""

    name: str
    sent: int
    answered: int
    duplicates: int
    wrong: int
    recover_s: float
    details: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return (
            f"FAULT {self.name}: sent={self.sent} answered={self.answered} "
            f"duplicates={self.duplicates} wrong={self.wrong} "
            f"recover_s={self.recover_s:.1f}"
        )

    def detail_line(self) -> str:
        return f"FAULT {self.name} details: " + " ".join(
            f"{k}={v}" for k, v in self.details.items()
        )

    def check(self) -> None:
        """Every request answered exactly once, every answer correct."""
        assert self.answered == self.sent, self.line()
        assert self.duplicates == 0, self.line()
        assert self.wrong == 0, self.line()


def correct(result: InferResult, expected: np.ndarray[Any, Any]) -> bool:
    """An ok identity answer whose OUTPUT0 equals the request's INPUT0 (shape, dtype, values)."""
    if result.error is not None:
        return False
    try:
        out = result.output("OUTPUT0").to_numpy()
    except KeyError:
        return False
    return out.dtype == expected.dtype and np.array_equal(out, expected)


async def read_result_keys(
    r: redis.asyncio.Redis, names: Names, ids: Iterable[str]
) -> dict[str, InferResult]:
    """GET every id's result key (pipelined, 1000 a round trip); missing ids are absent."""
    ids = list(ids)
    found: dict[str, InferResult] = {}
    for start in range(0, len(ids), 1000):
        part = ids[start : start + 1000]
        pipe = r.pipeline(transaction=False)
        for rid in part:
            pipe.get(names.result_key(rid))
        for rid, raw in zip(part, await pipe.execute(), strict=True):
            if raw is not None:
                found[rid] = decode_result(raw)
    return found


async def read_stream(r: redis.asyncio.Redis, stream: str) -> tuple[list[InferResult], int]:
    """Every result in ``stream`` (XRANGE, 1000 entries a page) and the number of entries."""
    results: list[InferResult] = []
    entries = 0
    start = "-"
    while True:
        page: Any = await r.xrange(stream, min=start, max="+", count=1000)
        if not page:
            return results, entries
        for _entry_id, fields in page:
            entries += 1
            results.extend(decode_results(fields[STREAM_FIELD_RESULTS]))
        start = "(" + page[-1][0].decode()


async def audit(
    name: str,
    r: redis.asyncio.Redis,
    names: Names,
    expected: Mapping[str, np.ndarray[Any, Any]],
    stream: str | None,
    recover_s: float,
    **details: Any,
) -> FaultReport:
    """Count answers per correlation id: from the result keys and (if any) the result stream.

    answered: ids with an answer under their key (and, with a stream, in the stream too);
    duplicates: extra stream answers for an id, plus stream answers that differ from their
    key's; wrong: ids with an answer (key or stream) that is an error or not equal to the
    input, plus ids answered that were never sent.
    """
    keys = await read_result_keys(r, names, expected)
    wrong = {rid for rid, res in keys.items() if not correct(res, expected[rid])}
    answered = set(keys)
    duplicates = 0
    if stream is not None:
        results, entries = await read_stream(r, stream)
        per_id = Counter(res.id for res in results)
        duplicates = sum(n - 1 for n in per_id.values())
        for res in results:
            if res.id not in expected or not correct(res, expected[res.id]):
                wrong.add(res.id)
            if res.id in keys and _differs(res, keys[res.id]):
                duplicates += 1  # a second, different answer for the same id
        answered &= set(per_id)
        details = {
            "key_answers": len(keys),
            "stream_answers": len(per_id),
            "stream_duplicates": sum(n - 1 for n in per_id.values()),
            "stream_entries": entries,
            **details,
        }
    return FaultReport(
        name, len(expected), len(answered), duplicates, len(wrong), recover_s, details
    )


def _differs(a: InferResult, b: InferResult) -> bool:
    if (a.error is None) != (b.error is None) or a.worker != b.worker:
        return True
    return any(
        not np.array_equal(x.to_numpy(), y.to_numpy())
        for x, y in zip(a.outputs, b.outputs, strict=False)
    )
