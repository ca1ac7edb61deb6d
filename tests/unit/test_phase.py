"""tests.support.phase: a hung block fails the test by name, with the hung task's stack."""

from __future__ import annotations

import asyncio

import pytest

from tests.support import phase


async def _hangs_here() -> None:
    await asyncio.Event().wait()


async def test_a_hung_block_fails_naming_its_phase_and_where_it_waits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(pytest.fail.Exception, match=r"the thing did not finish in 0\.05 s"):
        async with phase("the thing", 0.05):
            await _hangs_here()
    assert "_hangs_here" in capsys.readouterr().out


async def test_a_block_in_time_passes_through() -> None:
    async with phase("quick", 5):
        await asyncio.sleep(0)
