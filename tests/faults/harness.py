"""The fault suite's common ground: one test's deployment, bounded waits, request values.

The rest of the harness, one concept a module:

- ``processes``: ``plaza worker`` / ``plaza gateway`` as real OS subprocesses (``kill9`` is a
  real SIGKILL), logs in files, readiness by condition;
- ``traffic``: a paced load published with ``publish_many`` (a chunk Kafka did not take is
  sent again with the same ids), and a tail of the result stream that notes when each
  answer first arrived;
- ``audit``: waiting until the worker group committed everything, then counting answers
  per correlation id from the result keys and the result stream.

Every wait is a bounded loop on a condition; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from plaza.naming import Names
from plaza.settings import KafkaSettings, PlazaSettings, RedisSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = REPO_ROOT / "model_repository"
MODEL = "identity"
POLL_S = 0.02
"""Poll interval inside the bounded wait loops."""


async def wait_for(
    predicate: Callable[[], Awaitable[bool] | bool],
    limit_s: float,
    what: str,
    detail: Callable[[], str] | None = None,
) -> float:
    """Poll ``predicate`` until true; returns the seconds it took, fails after ``limit_s``."""
    start = time.monotonic()
    while True:
        value = predicate()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return time.monotonic() - start
        if time.monotonic() - start > limit_s:
            extra = f"\n{detail()}" if detail else ""
            raise AssertionError(f"timed out after {limit_s:.0f}s waiting for {what}{extra}")
        await asyncio.sleep(POLL_S)


@dataclass(frozen=True)
class Deployment:
    """Where one test's Plaza runs: its Kafka, its Redis, its own topic and key prefixes."""

    bootstrap: str
    redis_url: str
    prefix: str
    partitions: int = 4
    replication_factor: int = 1
    min_insync_replicas: int | None = None

    @property
    def names(self) -> Names:
        return Names(topic_prefix=f"{self.prefix}.", key_prefix=f"{self.prefix}:")

    @property
    def topic(self) -> str:
        return self.names.request_topic(MODEL)

    @property
    def group(self) -> str:
        return self.names.consumer_group(MODEL)

    def settings(self) -> PlazaSettings:
        """Settings for the SDK in the test process (the same deployment as the env)."""
        return PlazaSettings(
            repository=REPOSITORY,
            kafka=KafkaSettings(
                bootstrap_servers=self.bootstrap,
                topic_prefix=self.names.topic_prefix,
                partitions=self.partitions,
                replication_factor=self.replication_factor,
                min_insync_replicas=self.min_insync_replicas,
            ),
            redis=RedisSettings(
                url=self.redis_url, key_prefix=self.names.key_prefix, stream_maxlen=100_000
            ),
        )

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a Plaza subprocess: ours only (inherited PLAZA_* dropped)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLAZA_")}
        env.update(
            PLAZA_KAFKA__BOOTSTRAP_SERVERS=self.bootstrap,
            PLAZA_KAFKA__TOPIC_PREFIX=self.names.topic_prefix,
            PLAZA_KAFKA__PARTITIONS=str(self.partitions),
            PLAZA_KAFKA__REPLICATION_FACTOR=str(self.replication_factor),
            PLAZA_REDIS__URL=self.redis_url,
            PLAZA_REDIS__KEY_PREFIX=self.names.key_prefix,
            PLAZA_REDIS__STREAM_MAXLEN="100000",
            PLAZA_REPOSITORY=str(REPOSITORY),
            PLAZA_WORKER__INTRA_OP_THREADS="1",
            PLAZA_WORKER__HEARTBEAT_INTERVAL_S="0.5",
            PLAZA_WORKER__DEVICE="cpu",
            PYTHONUNBUFFERED="1",
        )
        if self.min_insync_replicas is not None:
            env["PLAZA_KAFKA__MIN_INSYNC_REPLICAS"] = str(self.min_insync_replicas)
        env.update(extra)
        return env


def value(i: int) -> np.ndarray[Any, Any]:
    """Request ``i``'s input (and, for identity, its expected output): distinct per i."""
    return np.array([[i, i + 0.5]], dtype=np.float32)
