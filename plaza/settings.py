"""Settings: nested, frozen, built once at start; each component gets only its section.

Every field has a default, an environment variable (``PLAZA_<SECTION>__<FIELD>``, e.g.
``PLAZA_KAFKA__BOOTSTRAP_SERVERS``) and a CLI flag (``--kafka.bootstrap_servers``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from plaza.errors import ConfigError
from plaza.naming import CONFIG_NAME_PATTERN, Names


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaSettings(_Section):
    """How to reach Kafka and how Plaza's topics are made."""

    bootstrap_servers: str = Field(
        "127.0.0.1:9092", description="Kafka brokers, host:port[,host:port]"
    )
    topic_prefix: str = Field("plaza.", description="prefix of every topic and consumer group")
    partitions: int = Field(4, ge=1, description="partitions of each request topic Plaza creates")
    replication_factor: int = Field(1, ge=1, description="replicas of each topic Plaza creates")
    min_insync_replicas: int | None = Field(
        None, ge=1, description="min.insync.replicas of the topics Plaza creates"
    )
    client_id: str = Field("plaza", description="Kafka client id")
    request_timeout_ms: int = Field(
        30_000, gt=0, description="Kafka request timeout; also bounds a publish"
    )
    session_timeout_ms: int = Field(
        10_000,
        ge=3000,
        description="consumer group session timeout: a worker that dies without leaving its "
        "group holds its partitions this long (within the broker's group.min/max."
        "session.timeout.ms; heartbeats go every second)",
    )
    max_request_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="largest request record")
    linger_ms: int = Field(
        0, ge=0, description="producer linger (records sent while one is in flight batch anyway)"
    )
    metadata_max_age_ms: int = Field(
        30_000,
        ge=1000,
        description="how often clients refresh Kafka metadata: partitions added to a topic "
        "(or a topic recreated) are fetched from and published to within this",
    )
    backlog_check_ttl_ms: int = Field(
        250, ge=0, description="how long a measured backlog (for max_queue_size) is reused"
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT",
        description="Kafka security protocol: the sasl_ settings need SASL_PLAINTEXT or "
        "SASL_SSL, the ssl_ ones SSL or SASL_SSL (one given that it would ignore is an error)",
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="SASL mechanism (PLAIN when unset)"
    )
    sasl_username: str | None = Field(None, description="SASL user")
    sasl_password: SecretStr | None = Field(None, description="SASL password (secret)")
    ssl_cafile: Path | None = Field(None, description="CA bundle for Kafka TLS")
    ssl_certfile: Path | None = Field(None, description="client certificate for Kafka TLS")
    ssl_keyfile: Path | None = Field(None, description="client key for Kafka TLS")

    @field_validator("ssl_cafile", "ssl_certfile", "ssl_keyfile", mode="before")
    @classmethod
    def _empty_path_is_unset(cls, value: object) -> object:
        """An empty value (an empty environment variable) sets no file: pydantic would
        make it Path("."), which would count as a TLS setting given."""
        return None if value == "" else value

    def check_security(self) -> None:
        """ConfigError naming the SASL or TLS settings that ``security_protocol`` would
        ignore (a SASL password with PLAINTEXT would connect in plain text, unseen), and the
        protocols that use every security setting given."""
        sasl = [name for name in _SASL_SETTINGS if _is_set(getattr(self, name))]
        tls = [name for name in _TLS_SETTINGS if _is_set(getattr(self, name))]
        protocol = self.security_protocol
        uses_sasl, uses_tls = protocol.startswith("SASL"), protocol.endswith("SSL")
        ignored = (sasl if not uses_sasl else []) + (tls if not uses_tls else [])
        if not ignored:
            return
        # The protocols that use every setting given and keep what the chosen one does.
        fitting = [
            p
            for p in ("SSL", "SASL_PLAINTEXT", "SASL_SSL")
            if (p.startswith("SASL") or not (sasl or uses_sasl))
            and (p.endswith("SSL") or not (tls or uses_tls))
        ]
        named = ", ".join(f"kafka.{name}" for name in ignored)
        verb, them = ("is", "it") if len(ignored) == 1 else ("are", "them")
        raise ConfigError(
            f"{named} {verb} set but kafka.security_protocol is {protocol}, which ignores "
            f"{them}: set kafka.security_protocol to {' or '.join(fitting)} (or unset {them})"
        )


_SASL_SETTINGS = ("sasl_mechanism", "sasl_username", "sasl_password")
_TLS_SETTINGS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")


def _is_set(value: object) -> bool:
    """A security setting given a value (an empty string, from an empty environment
    variable, is none)."""
    if isinstance(value, SecretStr):
        return value.get_secret_value() != ""
    return value is not None and value != ""


REDIS_URL_SCHEMES = ("redis://", "rediss://", "unix://")
"""The URL schemes redis-py connects with (``redis.from_url``)."""


class RedisSettings(_Section):
    """How to reach Redis and how long results live there."""

    url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL (rediss:// for TLS)")

    @field_validator("url")
    @classmethod
    def _redis_scheme(cls, value: str) -> str:
        """A URL redis-py connects with: any other would fail only at the first
        connection. The URL is not quoted back: it may hold a password."""
        if not value.lower().startswith(REDIS_URL_SCHEMES):
            schemes = ", ".join(REDIS_URL_SCHEMES)
            raise ValueError(f"a Redis URL starts with one of {schemes}")
        return value

    cluster: bool = Field(
        False, description="Redis Cluster: url names any one node (db 0); see docs/deploy.md"
    )
    password: SecretStr | None = Field(None, description="Redis password (secret)")
    ssl_ca_certs: Path | None = Field(None, description="CA bundle for Redis TLS")
    key_prefix: str = Field("plaza:", description="prefix of every Redis key and stream")
    result_ttl_s: int = Field(
        3600, ge=1, description="TTL of result keys (job markers: producer.max_queued_s)"
    )
    max_result_bytes: int = Field(
        128 * 1024 * 1024,
        ge=1024,
        le=512 * 1024 * 1024,
        description="largest encoded result a worker or ensemble runner stores; one over "
        "it, or over Redis' own proto-max-bulk-len (512 MiB by default) where that is "
        "smaller, is answered with a payload_too_large error in its place",
    )
    stream_maxlen: int = Field(10_000, ge=1, description="approximate MAXLEN of reply streams")
    reply_stream_ttl_s: int = Field(600, ge=1, description="idle expiry of a reply stream")
    stats_ttl_s: int = Field(
        7 * 86400, ge=1, description="idle expiry of a model version's statistics hash"
    )


class ProducerSettings(_Section):
    """The producer core that the gateway and the SDK publish through."""

    max_inflight_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="input bytes of requests in flight (published, not yet answered); "
        "a request past it is refused at once (queue_full, 503); one larger than all of it "
        "could never fit (payload_too_large, 413)",
    )
    max_queued_s: int = Field(
        86400,
        ge=1,
        description="longest an async job is expected to wait in Kafka; its job marker "
        "lives this (or until its deadline) plus redis.result_ttl_s",
    )
    stop_timeout_s: float = Field(
        10.0,
        gt=0,
        description="how long a stop gives the Kafka producer to flush what it holds (a "
        "broker that is down never takes it: the stop takes all of this)",
    )


class ResponseCacheSettings(_Section):
    """Triton's response cache, in Redis, for models with ``response_cache { enable: true }``
    (``plaza.response_cache``): its bounds, per cached model."""

    ttl_s: int = Field(600, ge=1, description="how long a cached answer lives (Redis TTL)")
    max_entry_bytes: int = Field(
        256 * 1024,
        ge=1024,
        description="an answer whose cache entry would be larger is not cached",
    )
    max_entries: int = Field(
        1024,
        ge=1,
        description="cache slots of one model (direct mapped: each holds one answer); a model's "
        "cache holds at most max_entries * max_entry_bytes",
    )


Quantiles = tuple[tuple[float, float], ...]
"""(quantile, its allowed rank error) pairs of a latency summary."""


def parse_quantiles(text: str) -> Quantiles:
    """``"0.5:0.05,0.99:0.001"`` -> ((0.5, 0.05), (0.99, 0.001)), as Triton's
    ``summary_quantiles`` reads them; ValueError says what is wrong (Triton logs a bad pair
    and skips it: a setting here is refused, so a typo cannot drop a quantile unseen)."""
    pairs: list[tuple[float, float]] = []
    for part in (p.strip() for p in text.split(",")):
        quantile, colon, error = part.partition(":")
        try:
            if not colon:
                raise ValueError
            q, e = float(quantile), float(error)
        except ValueError:
            raise ValueError(f"{part!r} is not <quantile>:<error>") from None
        if not (0.0 <= q <= 1.0 and 0.0 < e < 1.0):
            raise ValueError(f"{part!r}: the quantile must be in [0, 1], its error in (0, 1)")
        pairs.append((q, e))
    return tuple(pairs)


class WorkerSettings(_Section):
    """One worker process."""

    model: str = Field(
        "", description="the model this worker serves (required unless host.models is set)"
    )
    model_config_json: str = Field(
        "",
        description="a config override in Triton's JSON form (a load's parameters.config); "
        "empty: the repository's config.pbtxt",
    )
    worker_id: str = Field("", description="worker id; default host-pid-random")
    generation: int | None = Field(
        None,
        description="the model table's generation this worker serves, named in its registry "
        "entry, where a load waits for a worker of its generation (set by plaza up "
        "--process-per-model's supervisor; a worker of one model only); none: it names none, and "
        "counts for any",
    )
    max_pending: int = Field(1024, ge=1, description="records held in memory before pausing fetch")
    max_pending_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="bytes of records held in memory before pausing fetch (one record over "
        "it is still taken when nothing else is held)",
    )
    fetch_max_records: int = Field(512, ge=1, description="records taken per fetch")
    queue_delay_from: Literal["sent", "fetched"] = Field(
        "sent",
        description="where a model's max_queue_delay_microseconds counts from: sent (when the "
        "producer handed the request to Kafka, its sent_us; never earlier than one delay "
        "before the fetch, so skewed clocks only shorten the wait) or fetched (when this "
        "worker fetched it, the delay then adding to the Kafka hop)",
    )
    max_deliveries: int = Field(
        3,
        ge=1,
        description="deliveries of one record without an answer (worker crashes) before it "
        "is dead-lettered with a poison_record error",
    )
    delivery_ttl_s: int = Field(
        600,
        ge=1,
        description="how long an unanswered record's delivery count is kept (at most "
        "redis.result_ttl_s)",
    )
    # ONNX Runtime session options (docs/benchmarks.md, "ONNX Runtime settings", has the
    # measurements that chose these defaults).
    intra_op_threads: int = Field(
        0,
        ge=0,
        description="a model's intra_op_thread_count parameter wins when > 0; 0: all cores",
    )
    ort_intra_op_spinning: bool = Field(
        False,
        description="ONNX Runtime session.intra_op.allow_spinning: intra-op threads busy-wait "
        "for work after each run (off: they sleep, leaving the cores to the rest of the stack)",
    )
    ort_inter_op_spinning: bool = Field(
        False,
        description="ONNX Runtime session.inter_op.allow_spinning (inter-op threads; the "
        "worker runs sessions sequentially, so this matters only to parallel graphs)",
    )
    heartbeat_interval_s: float = Field(
        2.0, gt=0, description="registry heartbeat and stats flush interval"
    )
    commit_interval_ms: int = Field(
        50,
        ge=0,
        le=10_000,
        description="least time between two of the worker's offset commits under load: the "
        "batches written meanwhile share one (a stop or a rebalance commits at once; 0: "
        "after every write). Measured in docs/benchmarks.md",
    )
    max_waiting_responses: int = Field(
        4096,
        ge=1,
        le=1_000_000,
        description="a decoupled model's responses that may wait for the worker's writer, "
        "which writes all that wait in one Redis call; past it the model's send waits. "
        "Measured in docs/benchmarks.md (1: a call per response)",
    )
    metrics_host: str = Field("127.0.0.1", description="address the worker's /metrics listens on")
    summary_latencies: bool = Field(
        False,
        description="Triton's summary_latencies: serve nv_inference_request_summary_us and its "
        "four phases' summaries (quantiles over the last 60 s) on the worker's /metrics",
    )
    summary_quantiles: str = Field(
        "0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001",
        description="Triton's summary_quantiles: the summaries' <quantile>:<error> pairs, "
        "comma-separated",
    )
    metrics_port: int = Field(
        0, ge=-1, le=65535, description="Prometheus /metrics port; 0: a free one, -1: off"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="auto: the GPU with most free memory, else cpu; cuda: that GPU, and the "
        "worker refuses to start (bad_config) when no GPU is visible; cpu: the CPU",
    )

    @field_validator("summary_quantiles")
    @classmethod
    def _quantiles_parse(cls, value: str) -> str:
        parse_quantiles(value)
        return value


class HostSettings(_Section):
    """A model host: one worker process serving several models on one device."""

    models: str = Field(
        "",
        description="comma-separated models this process serves, each with its own batcher "
        "and consumer-group membership ('*': every model in the repository); empty: "
        "worker.model alone",
    )
    execution_slots: int = Field(
        0,
        ge=0,
        description="executions the device runs at once, over all models but Python backend "
        "ones (which take no slot); 0: the largest instance_group count of the others",
    )
    resources: str = Field(
        "",
        description="rate limiter budget, NAME:COUNT[,NAME:COUNT]; a resource not named "
        "gets the largest count any served model asks for",
    )
    follow_model_table: bool = Field(
        False,
        description="serve what the model table says is loaded (modes explicit and poll), "
        "among host.models ('*': any model of the repository): start a model's unit when it "
        "is loaded, reload it when its generation changes, drain and stop it when unloaded",
    )
    follow_interval_s: float = Field(
        1.0, gt=0, description="how often a host following the model table re-reads it"
    )
    memory_budget_bytes: int = Field(
        0,
        ge=0,
        description="bytes the models on this host may hold (parameter memory_bytes, else "
        "their files, corrected by the measured growth at load); a load that does not fit "
        "evicts the least recently used idle model first; 0: no budget. Needs "
        "follow_model_table",
    )
    load_wait_s: float = Field(
        60.0,
        gt=0,
        description="how long a load waits for room in the memory budget before the host "
        "logs an error and tries it again on later rounds (waits doubling to 30 s)",
    )
    drain_limit_s: float = Field(
        60.0,
        gt=0,
        description="an unloaded model's unit serves its queued requests this long at most "
        "before it stops",
    )

    def model_names(self) -> list[str]:
        """``models`` as a list."""
        return [m.strip() for m in self.models.split(",") if m.strip()]


class GatewaySettings(_Section):
    """The gateway: its HTTP and gRPC fronts."""

    host: str = Field("127.0.0.1", description="address the gateway listens on")
    http_port: int = Field(8000, ge=0, le=65535, description="KServe v2 HTTP port")
    grpc_port: int = Field(8001, ge=0, le=65535, description="KServe v2 gRPC port (0: a free one)")
    grpc_server: Literal["plaza", "grpcio"] = Field(
        "plaza",
        description="the gRPC front's server: plaza (the gateway's own, over its own HTTP/2, "
        "gateway/grpc_server.py; chosen by measurement, docs/benchmarks.md) or grpcio "
        "(grpc.aio, serving the same services)",
    )
    metrics_port: int = Field(
        8002, ge=-1, le=65535, description="Prometheus metrics port of the gateway (-1: off)"
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="gateway processes sharing the HTTP and gRPC ports (SO_REUSEPORT); "
        "process i serves its metrics on metrics_port + i",
    )
    gateway_id: str = Field("", description="names the reply stream; default a random id")
    sync_timeout_s: float = Field(30.0, gt=0, description="sync infer waits this long, then 504")
    max_body_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="request body limit (HTTP 413 beyond), and gRPC's max receive message size",
    )
    max_body_s: float = Field(
        300.0,
        ge=0,
        description="the longest one request body (a gRPC request message) may take to come "
        "in, from its first bytes: a client slower than this (a 16 MiB body in 300 s is "
        "about 56 KB/s) gets 408 (gRPC: DEADLINE_EXCEEDED); 0: no bound (Triton's)",
    )
    grpc_max_buffered_bytes: int = Field(
        0,
        ge=0,
        description="the most bytes of request messages one gRPC connection holds before their "
        "calls' handlers take them (messages still arriving, a stream's queued ones); past it "
        "its calls' stream windows are held back but the oldest half-received message's "
        "(flow control, not an error) (0: 4 x max_body_bytes)",
    )
    grpc_keepalive_time_ms: int = Field(
        7_200_000,
        ge=1000,
        description="Triton's --grpc-keepalive-time: grpcio pings an idle connection after this "
        "long; the plaza server sends TCP keepalive probes after it instead",
    )
    grpc_keepalive_timeout_ms: int = Field(
        20_000,
        ge=1000,
        description="Triton's --grpc-keepalive-timeout: grpcio closes a connection whose ping "
        "is not answered this long; the plaza server's TCP keepalive probes are this far apart",
    )
    grpc_keepalive_permit_without_calls: bool = Field(
        False,
        description="Triton's --grpc-keepalive-permit-without-calls (grpcio): keepalive pings "
        "may come and go on a connection without calls",
    )
    grpc_http2_max_pings_without_data: int = Field(
        2,
        ge=0,
        description="Triton's --grpc-http2-max-pings-without-data (grpcio): pings grpcio sends "
        "while no data is sent (0: no limit)",
    )
    grpc_http2_min_recv_ping_interval_without_data_ms: int = Field(
        300_000,
        ge=0,
        description="Triton's --grpc-http2-min-recv-ping-interval-without-data: a client's "
        "pings closer than this while no data is sent are strikes (grpcio and the plaza "
        "server)",
    )
    grpc_http2_max_ping_strikes: int = Field(
        2,
        ge=0,
        description="Triton's --grpc-http2-max-ping-strikes (grpcio): past this many strikes "
        "the connection is closed (GOAWAY too_many_pings) (0: no limit)",
    )
    api_key: SecretStr | None = Field(None, description="bearer token required when set (secret)")
    tls_cert_file: Path | None = Field(
        None, description="PEM certificate chain: HTTPS and gRPC over TLS when set"
    )
    tls_key_file: Path | None = Field(None, description="PEM private key of tls_cert_file")
    tls_client_ca_file: Path | None = Field(
        None, description="PEM CA: when set, clients must present a certificate it signed"
    )
    models: str = Field(
        "",
        description="comma-separated models to serve from the start ('*': all); empty: every "
        "model in mode none, none in mode explicit",
    )
    model_control_mode: Literal["none", "explicit", "poll"] = Field(
        "none",
        description="Triton's model control: none (all at start, no load/unload), explicit "
        "(the repository API loads and unloads), poll (the repository is re-read)",
    )
    repository_poll_s: float = Field(
        15.0, gt=0, description="poll mode: seconds between two reads of the repository"
    )
    load_timeout_s: float = Field(
        120.0, gt=0, description="a load waits this long for a worker of the model to serve it"
    )
    allow_client_shm: bool = Field(
        False,
        description="Triton's --allow-client-shm: clients on the gateway's host may register "
        "system shared memory regions for their tensors (one gateway process only)",
    )
    max_shm_regions: int = Field(
        64, ge=1, le=4096, description="system shared memory regions registered at once, at most"
    )
    trace_dir: Path = Field(
        Path("var/traces"),
        description="Triton's trace extension: the folder a trace_file (a bare name) is written in",
    )

    def model_names(self) -> list[str]:
        """``models`` as a list."""
        return [m.strip() for m in self.models.split(",") if m.strip()]


class PlazaSettings(BaseSettings):
    """All of Plaza's settings."""

    model_config = SettingsConfigDict(
        env_prefix="PLAZA_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        cli_kebab_case=False,
    )

    repository: Path = Field(Path("model_repository"), description="the model repository folder")
    model_config_name: str = Field(
        "",
        pattern=CONFIG_NAME_PATTERN,
        description="Triton's --model-config-name: a model's configs/<name>.pbtxt, where it has "
        "one, is its config in place of config.pbtxt; empty: config.pbtxt",
    )
    disable_auto_complete_config: bool = Field(
        False,
        description="Triton's --disable-auto-complete-config: configs are used as written (no "
        "ONNX model's completed from its file, no Python model's auto_complete_config run)",
    )
    kafka: KafkaSettings = KafkaSettings()
    redis: RedisSettings = RedisSettings()
    producer: ProducerSettings = ProducerSettings()
    response_cache: ResponseCacheSettings = ResponseCacheSettings()
    worker: WorkerSettings = WorkerSettings()
    host: HostSettings = HostSettings()
    gateway: GatewaySettings = GatewaySettings()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="log level")

    @model_validator(mode="after")
    def _kafka_security_is_used(self) -> PlazaSettings:
        # A ConfigError, not a ValueError: it is not one field's value that is wrong, and it
        # reads as the same bad_config line that kafka_security gives a bare KafkaSettings.
        self.kafka.check_security()
        return self

    @property
    def names(self) -> Names:
        return Names(topic_prefix=self.kafka.topic_prefix, key_prefix=self.redis.key_prefix)
