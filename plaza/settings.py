"""Settings: nested, frozen, built once at start; each component gets only its section.

Every field has a default, an environment variable (``PLAZA_<SECTION>__<FIELD>``, e.g.
``PLAZA_KAFKA__BOOTSTRAP_SERVERS``) and a CLI flag (``--kafka.bootstrap_servers``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from plaza.naming import Names


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaSettings(_Section):
    """How to reach Kafka and how Plaza's topics are made."""

    bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: str = "plaza."
    partitions: int = Field(4, ge=1, description="partitions of each request topic Plaza creates")
    replication_factor: int = Field(1, ge=1)
    min_insync_replicas: int | None = Field(None, ge=1)
    client_id: str = "plaza"
    request_timeout_ms: int = 30_000
    max_request_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="largest request record")
    linger_ms: int = Field(1, ge=0, description="producer linger: small batches of records")
    backlog_check_ttl_ms: int = Field(
        250, ge=0, description="how long a measured backlog (for max_queue_size) is reused"
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None


class RedisSettings(_Section):
    """How to reach Redis and how long results live there."""

    url: str = "redis://127.0.0.1:6379/0"
    password: SecretStr | None = None
    ssl_ca_certs: Path | None = None
    key_prefix: str = "plaza:"
    result_ttl_s: int = Field(3600, ge=1, description="TTL of result and job keys")
    stream_maxlen: int = Field(10_000, ge=1, description="approximate MAXLEN of reply streams")
    reply_stream_ttl_s: int = Field(600, ge=1, description="idle expiry of a reply stream")
    stats_ttl_s: int = Field(
        7 * 86400, ge=1, description="idle expiry of a model version's statistics hash"
    )


class WorkerSettings(_Section):
    """One worker process."""

    model: str = ""
    worker_id: str = ""
    max_pending: int = Field(1024, ge=1, description="records held in memory before pausing fetch")
    fetch_max_records: int = Field(512, ge=1)
    intra_op_threads: int = Field(0, ge=0, description="0: the model's config, else all cores")
    heartbeat_interval_s: float = Field(2.0, gt=0)
    metrics_host: str = Field("127.0.0.1", description="address the worker's /metrics listens on")
    metrics_port: int = Field(
        0, ge=-1, le=65535, description="Prometheus /metrics port; 0: a free one, -1: off"
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"


class GatewaySettings(_Section):
    """The HTTP gateway."""

    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    gateway_id: str = ""
    sync_timeout_s: float = Field(30.0, gt=0, description="sync infer waits this long, then 504")
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    api_key: SecretStr | None = None


class PlazaSettings(BaseSettings):
    """All of Plaza's settings."""

    model_config = SettingsConfigDict(
        env_prefix="PLAZA_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        cli_kebab_case=False,
    )

    repository: Path = Path("model_repository")
    kafka: KafkaSettings = KafkaSettings()
    redis: RedisSettings = RedisSettings()
    worker: WorkerSettings = WorkerSettings()
    gateway: GatewaySettings = GatewaySettings()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @property
    def names(self) -> Names:
        return Names(topic_prefix=self.kafka.topic_prefix, key_prefix=self.redis.key_prefix)
