"""Triton's statistics extension at the gateway: what the workers published, summed.

``GET /v2/models/stats``, ``/v2/models/{m}/stats`` and ``/v2/models/{m}/versions/{v}/stats``
answer Triton's ``{"model_stats": [...]}``. The gateway runs no model: every worker adds
its counters to one Redis hash per model version with its heartbeat (``plaza.statistics``),
so a hash already holds the sum over the version's workers and reading is one pipelined
``HGETALL`` per version. A version no worker has served yet reports zeros.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis

from plaza.errors import Unavailable
from plaza.naming import Names
from plaza.statistics import ModelStatistics

if TYPE_CHECKING:
    from plaza.model_control import LoadedModel


def stats_targets(models: Mapping[str, LoadedModel], version: str = "") -> list[tuple[str, str]]:
    """(model, version) pairs to report, sorted: every served version, or just ``version``."""
    return [
        (name, str(v))
        for name, model in sorted(models.items())
        for v in sorted(model.versions)
        if not version or str(v) == version
    ]


async def read_statistics(
    redis: aioredis.Redis,
    names: Names,
    models: Mapping[str, LoadedModel],
    version: str = "",
) -> dict[str, Any]:
    """Triton's statistics body for ``models`` (all their versions, or ``version``)."""
    targets = stats_targets(models, version)
    pipe = redis.pipeline(transaction=False)
    for model, v in targets:
        pipe.hgetall(names.model_stats_key(model, v))
    try:
        hashes = await pipe.execute() if targets else []
    except Exception as exc:
        raise Unavailable(f"Redis did not answer: {exc}") from exc
    return {
        "model_stats": [
            ModelStatistics.from_fields(raw).to_triton(model, v)
            for (model, v), raw in zip(targets, hashes, strict=True)
        ]
    }
