"""The fault suite's own audit must see what it is there to catch: a negative control.

Results are written to Redis by hand, as a faulty writer would: a second stream entry for
one id, a wrong answer, a missing one. The audit has to count each of them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import redis.asyncio

from plaza.codec import encode_result, encode_results
from plaza.contract import InferResult
from plaza.naming import STREAM_FIELD_COUNT, STREAM_FIELD_RESULTS
from plaza.stack import Deployment
from plaza.tensors import Tensor
from tests.faults.audit import audit
from tests.faults.harness import value


def answer(correlation_id: str, output: np.ndarray, worker: str = "w1") -> InferResult:
    return InferResult(
        id=correlation_id,
        model="identity",
        version="1",
        outputs=(Tensor.from_numpy("OUTPUT0", output),),
        worker=worker,
    )


@pytest.mark.timeout(30)
async def test_audit_counts_duplicates_wrong_and_missing_answers(
    deployments: Callable[..., Deployment],
    redis_for: Callable[[str], redis.asyncio.Redis],
) -> None:
    dep = deployments()
    r = redis_for(dep.redis_url)
    names = dep.names
    stream = names.results_stream("control")
    expected = {f"req-{i}": value(i) for i in range(4)}
    good, again, off = answer("req-0", value(0)), answer("req-0", value(0), "w2"), value(9)
    await r.set(names.result_key("req-0"), encode_result(good), ex=60)
    await r.set(names.result_key("req-1"), encode_result(answer("req-1", off)), ex=60)
    await r.set(names.result_key("req-2"), encode_result(answer("req-2", value(2))), ex=60)
    for batch in ([good, answer("req-1", off)], [again], [answer("req-2", value(2))]):
        fields = {STREAM_FIELD_COUNT: len(batch), STREAM_FIELD_RESULTS: encode_results(batch)}
        await r.xadd(stream, fields)  # type: ignore[arg-type]

    report = await audit("control", r, names, expected, stream, 0.0)

    # req-0: two stream entries (and the second from another worker): 2 duplicates;
    # req-1: wrong (under its key and in the stream: one id); req-3: never answered.
    assert (report.sent, report.answered, report.duplicates, report.wrong) == (4, 3, 2, 1)
    with pytest.raises(AssertionError):
        report.check()
