"""One Plaza on a Kafka and a Redis: its addresses, prefixes, topic layout and repository.

A :class:`Deployment` is the single description that both sides read: :meth:`settings`
for an SDK client in this process, :meth:`env` for a worker or gateway subprocess. The two
always say the same thing, so a test's client and its workers meet on the same topics.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from plaza.naming import Names
from plaza.settings import KafkaSettings, PlazaSettings, RedisSettings

ENV_PREFIX = "PLAZA_"


def new_prefix(name: str) -> str:
    """``name`` plus a short random suffix: a prefix no other deployment uses."""
    return f"{name}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, slots=True)
class Deployment:
    """Where one Plaza runs and how it is laid out.

    ``prefix`` keeps its topics (``<prefix>.``) and Redis keys (``<prefix>:``) apart from
    every other deployment on the same services. ``None`` means "Plaza's default" for the
    optional settings.
    """

    bootstrap: str
    """Kafka bootstrap servers, ``host:port[,host:port...]``."""
    redis_url: str
    """``redis://[:password@]host:port/db``."""
    repository: Path
    """The model repository its workers and gateway read."""
    prefix: str = "plaza"
    """Topic prefix ``<prefix>.`` and key prefix ``<prefix>:`` (``plaza``: the defaults),
    unless ``kafka_topic_prefix`` or ``redis_key_prefix`` says otherwise."""
    partitions: int = 4
    """Partitions of each request topic it creates."""
    replication_factor: int = 1
    """Replicas of each topic it creates."""
    min_insync_replicas: int | None = None
    """min.insync.replicas of the topics it creates (None: the broker's)."""
    stream_maxlen: int | None = None
    """Approximate MAXLEN of its reply streams (None: Plaza's default)."""
    heartbeat_interval_s: float | None = 0.5
    """Worker registry heartbeat (short, so readiness waits end quickly)."""
    log_level: str | None = None
    """Log level of its processes (None: Plaza's default, INFO)."""
    model_config_name: str = ""
    """Triton's ``--model-config-name`` for its processes (empty: config.pbtxt)."""
    disable_auto_complete_config: bool = False
    """Triton's ``--disable-auto-complete-config`` for its processes."""
    kafka_topic_prefix: str | None = None
    """Its topic prefix as written (``kafka.topic_prefix``, ``plaza up`` passes an exported
    one on); None: ``<prefix>.``."""
    redis_key_prefix: str | None = None
    """Its Redis key prefix as written (``redis.key_prefix``); None: ``<prefix>:``."""

    @property
    def names(self) -> Names:
        """Its topic and key names."""
        return Names(topic_prefix=self.topic_prefix, key_prefix=self.key_prefix)

    @property
    def topic_prefix(self) -> str:
        """Of every topic and consumer group it names."""
        if self.kafka_topic_prefix is not None:
            return self.kafka_topic_prefix
        return f"{self.prefix}."

    @property
    def key_prefix(self) -> str:
        """Of every Redis key and stream it names."""
        if self.redis_key_prefix is not None:
            return self.redis_key_prefix
        return f"{self.prefix}:"

    def settings(self) -> PlazaSettings:
        """Settings for an SDK client (``PlazaClient``) of this deployment."""
        kafka = KafkaSettings(
            bootstrap_servers=self.bootstrap,
            topic_prefix=self.topic_prefix,
            partitions=self.partitions,
            replication_factor=self.replication_factor,
            min_insync_replicas=self.min_insync_replicas,
        )
        maxlen = {} if self.stream_maxlen is None else {"stream_maxlen": self.stream_maxlen}
        redis = RedisSettings(url=self.redis_url, key_prefix=self.key_prefix, **maxlen)
        return PlazaSettings(
            repository=self.repository,
            kafka=kafka,
            redis=redis,
            model_config_name=self.model_config_name,
            disable_auto_complete_config=self.disable_auto_complete_config,
        )

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a worker or gateway subprocess of this deployment.

        One rule: every ``PLAZA_*`` variable of the calling process is dropped, so the
        subprocess runs exactly the deployment described here, whatever the caller's shell
        exports; anything else (PATH, PYTHONPATH, ...) is inherited. ``extra`` adds or
        overrides variables (``PLAZA_WORKER__WORKER_ID="w1"``) after that.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        env.update(self._plaza_env())
        env["PYTHONUNBUFFERED"] = "1"  # log lines reach the file as they are written
        env.update(extra)
        return env

    def _plaza_env(self) -> dict[str, str]:
        env = {
            "PLAZA_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
            "PLAZA_KAFKA__TOPIC_PREFIX": self.topic_prefix,
            "PLAZA_KAFKA__PARTITIONS": str(self.partitions),
            "PLAZA_KAFKA__REPLICATION_FACTOR": str(self.replication_factor),
            "PLAZA_REDIS__URL": self.redis_url,
            "PLAZA_REDIS__KEY_PREFIX": self.key_prefix,
            "PLAZA_REPOSITORY": str(self.repository),
            "PLAZA_MODEL_CONFIG_NAME": self.model_config_name,
            "PLAZA_DISABLE_AUTO_COMPLETE_CONFIG": str(self.disable_auto_complete_config),
        }
        optional = {
            "PLAZA_KAFKA__MIN_INSYNC_REPLICAS": self.min_insync_replicas,
            "PLAZA_REDIS__STREAM_MAXLEN": self.stream_maxlen,
            "PLAZA_WORKER__HEARTBEAT_INTERVAL_S": self.heartbeat_interval_s,
            "PLAZA_LOG_LEVEL": self.log_level,
        }
        env.update({k: str(v) for k, v in optional.items() if v is not None})
        return env
