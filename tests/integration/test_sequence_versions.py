"""A stateful model serving two versions through the whole stack: the sample ``accumulate``
with ``version_policy { all {} }``, one worker and one batcher for both versions, two
clients each running a sequence with the same ``sequence_id``, one on each version. As in
Triton, where each version has its own sequence batcher, they are two sequences: a START
on one does not reset the other, an END on one does not end the other, and Redis keeps
each one's state under its own key; and each version holds its own
``max_candidate_sequences``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from plaza.client import PlazaClient
from plaza.errors import InvalidInput, QueueFull
from plaza.settings import PlazaSettings
from tests.support import REPOSITORY, running_worker

pytestmark = pytest.mark.timeout(120)


def _two_versions(root: Path, max_sequences: int = 0) -> Path:
    """A repository holding accumulate's model as its versions 1 and 2, both served
    (``max_sequences``: its ``max_candidate_sequences`` instead of the sample's)."""
    (root / "accumulate").mkdir()
    for version in ("1", "2"):
        (root / "accumulate" / version).symlink_to(REPOSITORY / "accumulate" / "1")
    config = (REPOSITORY / "accumulate" / "config.pbtxt").read_text()
    if max_sequences:
        sample = "max_candidate_sequences: 256"
        assert sample in config
        config = config.replace(sample, f"max_candidate_sequences: {max_sequences}")
    (root / "accumulate" / "config.pbtxt").write_text(config + "\nversion_policy { all { } }\n")
    return root


async def test_the_same_sequence_id_on_two_versions_is_two_sequences(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"repository": _two_versions(tmp_path)})
    async with (
        running_worker(settings, "accumulate") as worker,
        PlazaClient(settings) as client,
    ):

        async def step(version: str, value: int, start: bool = False, end: bool = False) -> int:
            params = {"sequence_id": 7, "sequence_start": start, "sequence_end": end}
            x = {"INPUT": np.array([[value]], np.int32)}
            result = await client.infer("accumulate", x, version=version, parameters=params)
            assert result.version == version
            return int(result.outputs[0].to_numpy()[0, 0])

        x = [await step("1", 10, start=True)]  # client X, on version 1
        y = [await step("2", 1000, start=True)]  # client Y, on version 2: not X's reset
        x.append(await step("1", 1))
        y.append(await step("2", 5, end=True))  # ends Y's sequence, not X's
        v1, v2 = (worker.names.sequence_state_key("accumulate", v, 7) for v in (1, 2))
        kept = (await worker.redis.exists(v1), await worker.redis.exists(v2))
        x.append(await step("1", 2, end=True))
        with pytest.raises(InvalidInput, match="sequence 7 of version 2 has not started"):
            await step("2", 3)
    assert x == [10, 11, 13]
    assert y == [1000, 1005]
    assert kept == (1, 0)  # X's state under version 1's key; Y's END dropped only its own


async def test_each_version_holds_its_own_max_candidate_sequences(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    """With ``max_candidate_sequences: 2``, one worker holds two sequences of version 1 and
    two of version 2 at once; a third new one on either is ``queue_full``."""
    settings = settings.model_copy(update={"repository": _two_versions(tmp_path, 2)})
    async with running_worker(settings, "accumulate"), PlazaClient(settings) as client:

        async def start(version: str, key: int) -> int:
            params = {"sequence_id": key, "sequence_start": True}
            x = {"INPUT": np.array([[key]], np.int32)}
            result = await client.infer("accumulate", x, version=version, parameters=params)
            return int(result.outputs[0].to_numpy()[0, 0])

        sums = [await start(v, key) for v in ("1", "2") for key in (1, 2)]
        for version in ("1", "2"):
            with pytest.raises(QueueFull, match=f"2 sequences of version {version}"):
                await start(version, 3)
    assert sums == [1, 2, 1, 2]
