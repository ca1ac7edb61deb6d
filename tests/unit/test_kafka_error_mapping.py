"""Kafka's errors become Plaza's by what they mean for a retry: a refusal of the settings
(credentials, permissions, topic settings the cluster cannot honour) is a ConfigError, so a
process exits 1 and its supervisor stops restarting it; a Kafka out of reach or between
controllers is Unavailable, exit 75, tried again. Pure mapping: errors are fed in by class
and by CreateTopics error code."""

from __future__ import annotations

import pytest
from aiokafka import errors as kafka

from plaza.connections import kafka_answers, kafka_failure, topic_failure
from plaza.errors import ConfigError, Unavailable
from plaza.settings import KafkaSettings

K = KafkaSettings(bootstrap_servers="kafka-0:9092")

REFUSALS = [
    (kafka.InvalidReplicationFactorError, "kafka.replication_factor"),
    (kafka.InvalidPartitionsError, "kafka.partitions"),
    (kafka.InvalidConfigurationError, "kafka.min_insync_replicas"),
    (kafka.TopicAuthorizationFailedError, "ACLs"),
    (kafka.ClusterAuthorizationFailedError, "ACLs"),
    (kafka.GroupAuthorizationFailedError, "ACLs"),
    (kafka.SaslAuthenticationFailed, "kafka.sasl_password"),
    (kafka.AuthenticationFailedError, "kafka.sasl_password"),
    (kafka.UnsupportedSaslMechanismError, "kafka.sasl_mechanism"),
    (kafka.PolicyViolationError, "policy"),
]

PASSING = [
    kafka.KafkaConnectionError,
    kafka.KafkaTimeoutError,
    kafka.RequestTimedOutError,
    kafka.NotControllerError,
    kafka.LeaderNotAvailableError,
    kafka.BrokerNotAvailableError,
    kafka.NoBrokersAvailable,
    kafka.UnknownError,
]


@pytest.mark.parametrize(("error", "setting"), REFUSALS)
def test_a_refusal_of_the_settings_is_a_config_error(
    error: type[kafka.KafkaError], setting: str
) -> None:
    failure = kafka_failure(K, error("refused"))
    assert isinstance(failure, ConfigError) and not failure.retriable
    assert failure.code == "bad_config"
    assert "kafka-0:9092" in failure.message and setting in failure.message


@pytest.mark.parametrize("error", PASSING)
def test_a_kafka_that_may_answer_later_is_unavailable(error: type[kafka.KafkaError]) -> None:
    failure = kafka_failure(K, error("not now"))
    assert isinstance(failure, Unavailable) and failure.retriable


@pytest.mark.parametrize(
    "error", [error for error, _ in REFUSALS if getattr(error, "errno", None) is not None]
)
def test_a_topic_refused_by_code_is_a_config_error(error: type[kafka.BrokerResponseError]) -> None:
    failure = topic_failure(K, "plaza.infer.m", error.errno, "Unable to replicate")
    assert isinstance(failure, ConfigError), failure
    assert "cannot create topic plaza.infer.m: Unable to replicate" in failure.message


@pytest.mark.parametrize(
    "code",
    [
        kafka.NotControllerError.errno,
        kafka.RequestTimedOutError.errno,
        kafka.LeaderNotAvailableError.errno,
        -1,  # unknown
        9999,  # a code this aiokafka does not know
    ],
)
def test_a_topic_not_made_for_now_is_unavailable(code: int) -> None:
    failure = topic_failure(K, "plaza.infer.m", code, None)
    assert isinstance(failure, Unavailable)
    assert "cannot create topic plaza.infer.m" in failure.message


def test_the_block_raises_the_mapped_error_from_kafkas() -> None:
    cause = kafka.TopicAuthorizationFailedError("denied")
    with pytest.raises(ConfigError) as info, kafka_answers(K):
        raise cause
    assert info.value.__cause__ is cause
    with pytest.raises(Unavailable, match="Kafka did not answer at kafka-0:9092"), kafka_answers(K):
        raise kafka.KafkaConnectionError("refused")
