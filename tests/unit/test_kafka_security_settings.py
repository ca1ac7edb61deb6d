"""Kafka SASL/TLS settings are checked when Plaza builds its Kafka clients: an incomplete or
unusable one is a ConfigError naming the setting (never aiokafka's traceback, nor a setting
silently ignored)."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest

from plaza.connections import kafka_security
from plaza.errors import ConfigError
from plaza.settings import KafkaSettings


@pytest.mark.parametrize(
    "settings",
    [
        {"security_protocol": "SASL_PLAINTEXT"},
        {"security_protocol": "SASL_PLAINTEXT", "sasl_username": "plaza"},
        {"security_protocol": "SASL_SSL", "sasl_password": "secret"},
    ],
)
def test_sasl_needs_a_username_and_a_password(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"kafka\.sasl_username and kafka\.sasl_password"):
        kafka_security(KafkaSettings(**settings))


def test_sasl_with_both_is_passed_on() -> None:
    k = KafkaSettings(
        security_protocol="SASL_PLAINTEXT", sasl_username="plaza", sasl_password="secret"
    )
    opts = kafka_security(k)
    assert opts["sasl_plain_username"] == "plaza" and opts["sasl_plain_password"] == "secret"
    assert opts["sasl_mechanism"] == "PLAIN" and "ssl_context" not in opts


@pytest.mark.parametrize("name", ["ssl_cafile", "ssl_certfile", "ssl_keyfile"])
def test_a_missing_tls_file_is_named(tmp_path: Path, name: str) -> None:
    cert = tmp_path / "client.pem"
    cert.write_text("not a certificate")
    files = {"ssl_certfile": cert, name: tmp_path / "missing.pem"}
    with pytest.raises(ConfigError, match=f"kafka.{name} .*missing.pem.* not a readable file"):
        kafka_security(KafkaSettings(security_protocol="SSL", **files))


def test_a_key_without_its_certificate_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "client.key"
    key.write_text("a key")
    with pytest.raises(ConfigError, match=r"kafka\.ssl_keyfile is set without kafka\.ssl_certfile"):
        kafka_security(KafkaSettings(security_protocol="SASL_SSL", ssl_keyfile=key))


@pytest.mark.parametrize("name", ["ssl_cafile", "ssl_certfile"])
def test_an_unusable_tls_file_is_named(tmp_path: Path, name: str) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not PEM at all")
    with pytest.raises(ConfigError, match=f"kafka.{name} .*junk.pem.* not usable"):
        kafka_security(KafkaSettings(security_protocol="SSL", **{name: junk}))


def test_tls_without_files_uses_the_system_authorities() -> None:
    opts = kafka_security(KafkaSettings(security_protocol="SSL"))
    assert isinstance(opts["ssl_context"], ssl.SSLContext)
