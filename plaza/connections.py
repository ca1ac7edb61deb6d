"""Connections to Kafka and Redis, built from settings in one place.

Security settings (SASL/TLS for Kafka, password/TLS for Redis) are passed through here, so
every producer, consumer, admin client and Redis client of Plaza honours them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    IllegalSaslStateError,
    InvalidConfigurationError,
    InvalidPartitionsError,
    InvalidReplicationAssignmentError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    KafkaConfigurationError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    PolicyViolationError,
    SaslAuthenticationFailed,
    SecurityDisabled,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnsupportedSaslMechanismError,
    for_code,
)
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from plaza.errors import ConfigError, PlazaError, Unavailable
from plaza.settings import KafkaSettings, RedisSettings

log = logging.getLogger(__name__)


def kafka_security(k: KafkaSettings) -> dict[str, Any]:
    """The aiokafka options for ``k``'s SASL/TLS settings, checked now: ConfigError naming
    the setting for an incomplete or unusable one (aiokafka would fail later, with a
    traceback that names none, or ignore it)."""
    k.check_security()
    opts: dict[str, Any] = {"security_protocol": k.security_protocol}
    if k.security_protocol in ("SSL", "SASL_SSL"):
        opts["ssl_context"] = _kafka_ssl_context(k)
    if k.security_protocol.startswith("SASL"):
        if not k.sasl_username or k.sasl_password is None:
            raise ConfigError(
                f"kafka.security_protocol {k.security_protocol} needs kafka.sasl_username "
                "and kafka.sasl_password"
            )
        opts["sasl_mechanism"] = k.sasl_mechanism or "PLAIN"
        opts["sasl_plain_username"] = k.sasl_username
        opts["sasl_plain_password"] = k.sasl_password.get_secret_value()
    return opts


def _kafka_ssl_context(k: KafkaSettings) -> ssl.SSLContext:
    if k.ssl_keyfile and not k.ssl_certfile:
        raise ConfigError("kafka.ssl_keyfile is set without kafka.ssl_certfile (its certificate)")
    for name, path in (
        ("ssl_cafile", k.ssl_cafile),
        ("ssl_certfile", k.ssl_certfile),
        ("ssl_keyfile", k.ssl_keyfile),
    ):
        if path is not None and not path.is_file():
            raise ConfigError(f"kafka.{name} {str(path)!r} is not a readable file")
    try:
        ctx = ssl.create_default_context(cafile=str(k.ssl_cafile) if k.ssl_cafile else None)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"kafka.ssl_cafile {str(k.ssl_cafile)!r} is not usable: {exc}") from exc
    if k.ssl_certfile:
        key = str(k.ssl_keyfile) if k.ssl_keyfile else None
        try:
            ctx.load_cert_chain(str(k.ssl_certfile), key)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"kafka.ssl_certfile {str(k.ssl_certfile)!r} (with kafka.ssl_keyfile "
                f"{key!r}) is not usable: {exc}"
            ) from exc
    return ctx


def key_partition(key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
    """The partition of a record Plaza publishes (aiokafka's ``partitioner``): a keyed record
    (a request, keyed by its correlation id) goes to the partition its key's CRC-32 picks,
    so a retry under the same id follows the first send; an unkeyed one to any available.

    Kafka's default partitioner hashes keys with murmur2, which aiokafka computes in Python
    (about 4 µs a record, on every request a gateway or the SDK publishes); CRC-32 is
    zlib's C (0.1 µs). Nothing in Plaza depends on a request's partition, except a
    sequence's, which the publisher places by murmur2 itself (``plaza.publisher``)."""
    if key is None:
        return random.choice(available or all_partitions)
    return all_partitions[zlib.crc32(key) % len(all_partitions)]


RETRY_BACKOFF_MS = 500
"""How long every aiokafka client Plaza builds waits before it retries a failed request,
connection or metadata update (aiokafka's default: 100 ms). While a broker is down each
retry loop (metadata, fetch, group coordinator, producer) logs an error a round: 500 ms
makes that a fifth, and adds at most half a second to the recovery once the broker is
back. (aiokafka 0.14 has no ``reconnect_backoff_ms``: its connection retries are paced by
this setting too.)"""


def kafka_producer(k: KafkaSettings) -> AIOKafkaProducer:
    """An idempotent producer with acks=all: no duplicates or reordering from retries.
    It publishes to partitions added to a topic once its metadata is refreshed (every
    ``kafka.metadata_max_age_ms``)."""
    return AIOKafkaProducer(
        bootstrap_servers=k.bootstrap_servers,
        client_id=k.client_id,
        acks="all",
        enable_idempotence=True,
        partitioner=key_partition,
        linger_ms=k.linger_ms,
        max_request_size=k.max_request_bytes + 64 * 1024,
        max_batch_size=max(16384, min(k.max_request_bytes, 1024 * 1024)),
        request_timeout_ms=k.request_timeout_ms,
        retry_backoff_ms=RETRY_BACKOFF_MS,
        metadata_max_age_ms=k.metadata_max_age_ms,
        **kafka_security(k),
    )


def kafka_consumer(k: KafkaSettings, group_id: str | None, **overrides: Any) -> AIOKafkaConsumer:
    """A consumer in ``group_id`` (None: in no group, offsets only) with manual commits,
    starting at the earliest offset. Its metadata is refreshed every
    ``kafka.metadata_max_age_ms``: partitions added to a subscribed topic (or a topic
    deleted and made again) are assigned only then."""
    opts: dict[str, Any] = {
        "bootstrap_servers": k.bootstrap_servers,
        "client_id": k.client_id,
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "isolation_level": "read_committed",
        "fetch_max_bytes": max(52428800, k.max_request_bytes * 2),
        "max_partition_fetch_bytes": max(1048576, k.max_request_bytes + 64 * 1024),
        "request_timeout_ms": k.request_timeout_ms,
        "retry_backoff_ms": RETRY_BACKOFF_MS,
        "metadata_max_age_ms": k.metadata_max_age_ms,
        "session_timeout_ms": k.session_timeout_ms,
        "heartbeat_interval_ms": 1_000,
        "max_poll_interval_ms": 300_000,
        **kafka_security(k),
    }
    opts.update(overrides)
    return AIOKafkaConsumer(**opts)


def kafka_admin(k: KafkaSettings) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(
        bootstrap_servers=k.bootstrap_servers,
        client_id=f"{k.client_id}-admin",
        request_timeout_ms=k.request_timeout_ms,
        retry_backoff_ms=RETRY_BACKOFF_MS,
        **kafka_security(k),
    )


# Kafka's answers that the same settings will get again however often they are retried:
# credentials, permissions, or topic settings the cluster refuses. With each, the settings
# it most likely concerns (an operator's first place to look).
_REFUSALS: dict[type[KafkaError], str] = {
    AuthenticationFailedError: "kafka.sasl_username, kafka.sasl_password",
    SaslAuthenticationFailed: "kafka.sasl_username, kafka.sasl_password",
    AuthenticationMethodNotSupported: "kafka.sasl_mechanism",
    UnsupportedSaslMechanismError: "kafka.sasl_mechanism",
    IllegalSaslStateError: "kafka.security_protocol, kafka.sasl_mechanism",
    SecurityDisabled: "kafka.security_protocol",
    TopicAuthorizationFailedError: "the Kafka ACLs of kafka.sasl_username",
    GroupAuthorizationFailedError: "the Kafka ACLs of kafka.sasl_username",
    ClusterAuthorizationFailedError: "the Kafka ACLs of kafka.sasl_username",
    TransactionalIdAuthorizationFailed: "the Kafka ACLs of kafka.sasl_username",
    InvalidReplicationFactorError: "kafka.replication_factor",
    InvalidReplicationAssignmentError: "kafka.replication_factor",
    InvalidPartitionsError: "kafka.partitions",
    InvalidConfigurationError: "kafka.min_insync_replicas, kafka.max_request_bytes",
    PolicyViolationError: "kafka.partitions, kafka.replication_factor, the broker's policy",
    InvalidTopicError: "kafka.topic_prefix",
    KafkaConfigurationError: "the kafka settings",
}


def kafka_failure(k: KafkaSettings, exc: KafkaError) -> PlazaError:
    """The Plaza error for aiokafka's ``exc``: ConfigError (not retriable: a supervisor
    must not restart into it forever) when Kafka refuses the settings themselves,
    Unavailable (retriable) when it does not answer or fails in a way that may pass
    (no controller or leader yet, a timeout)."""
    for refused, settings in _REFUSALS.items():
        if isinstance(exc, refused):
            return ConfigError(
                f"Kafka at {k.bootstrap_servers} refused Plaza's settings ({settings}): {exc}"
            )
    if isinstance(exc, (KafkaConnectionError, KafkaTimeoutError)):
        return Unavailable(f"Kafka did not answer at {k.bootstrap_servers}: {exc}")
    return Unavailable(f"Kafka at {k.bootstrap_servers} failed: {exc}")


def topic_failure(k: KafkaSettings, topic: str, code: int, message: str | None) -> PlazaError:
    """:func:`kafka_failure` for a topic that Kafka would not create (error ``code`` of a
    CreateTopics answer)."""
    what = f"cannot create topic {topic}" + (f": {message}" if message else "")
    return kafka_failure(k, for_code(code)(what))


@contextlib.contextmanager
def kafka_answers(k: KafkaSettings) -> Iterator[None]:
    """Translate aiokafka's errors raised in the block by :func:`kafka_failure`, naming
    ``kafka.bootstrap_servers``: a Kafka that cannot be reached at startup, or that refuses
    the settings, is one line for the operator (``plaza gateway``, ``plaza worker``), never
    an aiokafka traceback."""
    try:
        yield
    except KafkaError as exc:
        raise kafka_failure(k, exc) from exc


async def ensure_topics(k: KafkaSettings, topics: list[str]) -> None:
    """Create the topics that do not exist yet (idempotent; safe to race). Unavailable
    when Kafka does not answer; the admin client is closed either way."""
    admin = kafka_admin(k)
    try:
        with kafka_answers(k):
            await admin.start()
            await _create_missing(admin, k, topics)
    finally:
        await admin.close()


async def _create_missing(admin: AIOKafkaAdminClient, k: KafkaSettings, topics: list[str]) -> None:
    existing = set(await admin.list_topics())
    configs = {"max.message.bytes": str(k.max_request_bytes + 64 * 1024)}
    if k.min_insync_replicas:
        configs["min.insync.replicas"] = str(k.min_insync_replicas)
    missing = [
        NewTopic(t, k.partitions, k.replication_factor, topic_configs=configs)
        for t in topics
        if t not in existing
    ]
    if not missing:
        return
    response = await admin.create_topics(missing)
    for topic_error in response.topic_errors:
        topic, code = topic_error[0], topic_error[1]
        if code not in (0, TopicAlreadyExistsError.errno):
            raise topic_failure(k, topic, code, topic_error[2] if len(topic_error) > 2 else None)


def redis_client(r: RedisSettings) -> aioredis.Redis:
    """A pooled asyncio Redis client; bytes in, bytes out.

    With ``redis.cluster`` it is a ``redis.asyncio.RedisCluster`` that finds every node
    from the one ``redis.url`` names. It is typed as ``Redis`` because it answers the same
    commands Plaza sends (single-key commands, non-transactional pipelines, scripts whose
    keys share one hash slot); the few callers that send several keys at once ask
    :func:`is_cluster` and split their work by slot there.
    """
    opts: dict[str, Any] = {
        "decode_responses": False,
        "health_check_interval": 30,
        # After a Redis restart every pooled connection is dead: retry on a fresh one.
        "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
    }
    if r.password:
        opts["password"] = r.password.get_secret_value()
    if r.ssl_ca_certs:
        opts["ssl_ca_certs"] = str(_redis_ca_file(r.url, r.ssl_ca_certs))
    if r.cluster:
        return cast(aioredis.Redis, _Cluster.from_url(r.url, **opts))
    return aioredis.Redis.from_url(r.url, **opts)


async def redis_answers(redis: aioredis.Redis, r: RedisSettings) -> None:
    """PING ``redis`` (built from ``r``) once, for a process that must not start without it:
    ConfigError when Redis refuses the credentials (``redis.password``, or those in
    ``redis.url``), Unavailable when it does not answer. One line for the operator, never a
    process that starts and then fails every write."""
    where = r.url.rsplit("@", 1)[-1]  # never echo a password given in the URL
    try:
        await redis.ping()
        await warn_if_evicting(redis)
    except AuthenticationError as exc:
        raise ConfigError(
            f"Redis at {where} refused the credentials (redis.password or redis.url): {exc}"
        ) from exc
    except ResponseError as exc:
        if "NOAUTH" not in str(exc) and "WRONGPASS" not in str(exc):
            raise Unavailable(f"Redis at {where} failed: {exc}") from exc
        raise ConfigError(
            f"Redis at {where} wants credentials (redis.password or redis.url): {exc}"
        ) from exc
    except (RedisError, OSError) as exc:
        raise Unavailable(f"Redis did not answer at {where}: {exc}") from exc


EVICTION_CHECK_S = 2.0
"""How long the start-up look at Redis' eviction policy may take (then it is skipped)."""


async def warn_if_evicting(redis: aioredis.Redis) -> None:
    """Log a warning when Redis may evict any key at maxmemory (an
    ``allkeys-*`` ``maxmemory-policy``): job markers and results then vanish (jobs poll as
    unknown) and worker registrations too (models flap not ready). Plaza needs
    ``noeviction`` or a ``volatile-*`` policy (docs/deploy.md). A Redis that refuses CONFIG
    (a managed one) or does not answer is not checked."""
    try:
        async with asyncio.timeout(EVICTION_CHECK_S):
            answer: dict[Any, Any] = await redis.config_get("maxmemory-policy")
    except Exception as exc:  # CONFIG refused, Redis away: nothing to say
        log.debug("could not read Redis' maxmemory-policy: %s", exc)
        return
    policy = _text_value(answer.get(b"maxmemory-policy", answer.get("maxmemory-policy")))
    if policy.startswith("allkeys-"):
        log.warning(
            "Redis' maxmemory-policy is %s: at maxmemory it evicts any key, so job markers "
            "and results vanish (jobs poll as unknown) and models flap not ready; set "
            "noeviction (or a volatile-* policy), see docs/deploy.md",
            policy,
        )


def _text_value(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")


class _ClusterPipeline(ClusterPipeline):
    """redis-py refuses PING in a cluster pipeline (it has no key to route by); a readiness
    check pipelines one with its single-key commands, so send it to whichever node."""

    def ping(self, **kwargs: Any) -> Any:
        return self.execute_command("PING", **kwargs)


class _Cluster(RedisCluster):
    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> Any:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # refused there, as in redis-py
        return _ClusterPipeline(self, transaction)  # type: ignore[abstract]  # as redis-py does


def is_cluster(redis: object) -> bool:
    """Whether ``redis`` (from :func:`redis_client`) talks to a Redis Cluster, where every
    multi-key command and script must touch keys of one hash slot only."""
    return isinstance(redis, RedisCluster)


async def keyed_command(redis: aioredis.Redis, key: str, *args: str | bytes | int) -> Any:
    """Send the command ``args``, whose only key is ``key``; on a Redis Cluster straight to
    the node that serves ``key``'s hash slot (MOVED and ASK are still followed).

    For XREAD and XREADGROUP (their keys follow a STREAMS keyword) redis-py's cluster client
    asks its default node for ``COMMAND GETKEYS`` before every call: a default node that
    stops answering would stop every stream read, even of streams on the nodes still up."""
    if not is_cluster(redis):
        return await redis.execute_command(*args)  # type: ignore[no-untyped-call]
    cluster = cast(RedisCluster, redis)
    tries_left = _KEYED_ATTEMPTS
    while True:
        # A node picked by the caller is not retried by redis-py: run the topology refresh
        # an error asked for (a no-op otherwise), then pick the key's node again.
        await cluster.initialize()
        try:
            node = cluster.get_node_from_key(key)
            return await cluster.execute_command(*args, target_nodes=node)
        except (RedisConnectionError, RedisTimeoutError):
            tries_left -= 1
            if not tries_left:
                raise


_KEYED_ATTEMPTS = 3
"""Tries of a command :func:`keyed_command` sends to a cluster node (a failed-over node)."""


def _redis_ca_file(url: str, ca_certs: Path) -> Path:
    """``ssl_ca_certs``, checked now: redis-py would fail only on the first command, and with
    a TypeError for a plain ``redis://`` URL (its plain connections take no TLS options)."""
    if urlsplit(url).scheme != "rediss":
        where = url.rsplit("@", 1)[-1]  # never echo a password given in the URL
        raise ConfigError(
            f"redis.ssl_ca_certs is set but redis.url {where!r} is not rediss:// (TLS): "
            "use a rediss:// URL, or unset ssl_ca_certs"
        )
    if not ca_certs.is_file():
        raise ConfigError(f"redis.ssl_ca_certs {str(ca_certs)!r} is not a readable file")
    return ca_certs
