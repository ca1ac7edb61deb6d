"""The SDK refuses a bad wait before it touches Kafka or Redis (none runs here: a call that
got past the check would fail with Unavailable instead)."""

from __future__ import annotations

import pytest

from plaza.client import PlazaClient
from plaza.errors import InvalidInput
from plaza.stack import free_port
from tests.support import make_settings

BAD = [float("nan"), float("inf"), float("-inf"), -1.0, 0.0, 0, True, "5"]


def unreachable_client() -> PlazaClient:
    return PlazaClient(
        make_settings(f"127.0.0.1:{free_port()}", f"redis://127.0.0.1:{free_port()}/0", "u")
    )


@pytest.mark.parametrize("timeout_s", BAD)
async def test_result_refuses_a_bad_timeout(timeout_s: float) -> None:
    with pytest.raises(InvalidInput) as caught:
        await unreachable_client().result("job", timeout_s=timeout_s)
    assert "timeout_s" in caught.value.message


@pytest.mark.parametrize("interval_s", BAD)
async def test_result_refuses_a_bad_interval(interval_s: float) -> None:
    with pytest.raises(InvalidInput) as caught:
        await unreachable_client().result("job", interval_s=interval_s)
    assert "interval_s" in caught.value.message


@pytest.mark.parametrize("timeout_s", BAD)
async def test_infer_refuses_a_bad_timeout(timeout_s: float) -> None:
    client = unreachable_client()
    with pytest.raises(InvalidInput):
        await client.infer("identity", {}, timeout_s=timeout_s)
    with pytest.raises(InvalidInput):
        async for _ in client.infer_stream("identity", {}, timeout_s=timeout_s):
            pass
