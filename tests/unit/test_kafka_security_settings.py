"""Kafka SASL/TLS settings are checked when Plaza builds its Kafka clients: an incomplete or
unusable one is a ConfigError naming the setting (never aiokafka's traceback, nor a setting
silently ignored). A SASL or TLS setting that ``security_protocol`` would ignore (a SASL
password with PLAINTEXT: plain text, unseen) is refused when the settings load, naming the
settings and the protocols that would use them."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest

from plaza.cli.main import _settings
from plaza.connections import kafka_security
from plaza.errors import ConfigError
from plaza.settings import KafkaSettings, PlazaSettings


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


SASL = {"sasl_mechanism": "PLAIN", "sasl_username": "plaza", "sasl_password": "secret"}


@pytest.mark.parametrize("name", sorted(SASL))
def test_a_sasl_setting_with_plaintext_is_refused_at_load(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        PlazaSettings(kafka=KafkaSettings(**{name: SASL[name]}))
    assert info.value.code == "bad_config"
    assert info.value.message == (
        f"kafka.{name} is set but kafka.security_protocol is PLAINTEXT, which ignores it: "
        "set kafka.security_protocol to SASL_PLAINTEXT or SASL_SSL (or unset it)"
    )
    assert "secret" not in info.value.message


@pytest.mark.parametrize("name", ["ssl_cafile", "ssl_certfile", "ssl_keyfile"])
def test_a_tls_setting_with_plaintext_is_refused_at_load(name: str, tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=rf"^kafka\.{name} is set but kafka\.security_protocol "
        r"is PLAINTEXT, .*: set kafka\.security_protocol to SSL or SASL_SSL",
    ):
        PlazaSettings(kafka=KafkaSettings(**{name: tmp_path / "x.pem"}))


@pytest.mark.parametrize(
    ("protocol", "settings", "named", "fitting"),
    [
        (
            "PLAINTEXT",
            {"sasl_password": "secret", "ssl_cafile": Path("ca.pem")},
            "kafka.sasl_password, kafka.ssl_cafile are",
            "SASL_SSL",
        ),
        ("SSL", {"sasl_username": "plaza"}, "kafka.sasl_username is", "SASL_SSL"),
        (
            "SASL_PLAINTEXT",
            {**SASL, "ssl_certfile": Path("c.pem")},
            "kafka.ssl_certfile is",
            "SASL_SSL",
        ),
    ],
)
def test_settings_the_protocol_ignores_are_named_with_the_protocol_for_all(
    protocol: str, settings: dict[str, Any], named: str, fitting: str
) -> None:
    with pytest.raises(ConfigError) as info:
        PlazaSettings(kafka=KafkaSettings(security_protocol=protocol, **settings))
    assert info.value.message.startswith(f"{named} set but kafka.security_protocol is {protocol}, ")
    assert info.value.message.endswith(
        f"set kafka.security_protocol to {fitting} (or unset {'them' if ' are' in named else 'it'})"
    )


def test_the_environment_and_flags_are_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAZA_KAFKA__SASL_PASSWORD", "secret")
    with pytest.raises(ConfigError, match=r"^kafka\.sasl_password is set .* PLAINTEXT"):
        PlazaSettings()
    monkeypatch.delenv("PLAZA_KAFKA__SASL_PASSWORD")
    with pytest.raises(ConfigError, match=r"^kafka\.ssl_cafile is set .* PLAINTEXT"):
        _settings(["--kafka.ssl_cafile", "/etc/ca.pem"])
    monkeypatch.setenv("PLAZA_KAFKA__SASL_USERNAME", "")  # an empty variable sets nothing
    assert PlazaSettings().kafka.sasl_username == ""


def test_settings_each_used_by_the_protocol_load() -> None:
    settings = PlazaSettings(kafka=KafkaSettings(security_protocol="SASL_SSL", **SASL))
    assert settings.kafka.sasl_username == "plaza"


def test_clients_built_from_a_bare_section_refuse_it_too() -> None:
    """A KafkaSettings made without PlazaSettings (a script, a test) is checked when its
    clients are built: every producer, consumer and admin client goes through here."""
    with pytest.raises(ConfigError, match=r"^kafka\.sasl_password is set .* PLAINTEXT"):
        kafka_security(KafkaSettings(sasl_password="secret"))


@pytest.mark.parametrize("name", ["SSL_CAFILE", "SSL_CERTFILE", "SSL_KEYFILE"])
def test_an_empty_tls_file_variable_sets_nothing(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """An empty PLAZA_KAFKA__SSL_* (a template's blank) is unset, not Path("."), so PLAINTEXT
    still starts."""
    monkeypatch.setenv(f"PLAZA_KAFKA__{name}", "")
    assert getattr(PlazaSettings().kafka, name.lower()) is None
    assert getattr(KafkaSettings(**{name.lower(): ""}), name.lower()) is None
