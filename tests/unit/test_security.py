"""Security basics that can be checked without services."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from redis.asyncio.connection import SSLConnection

from plaza.connections import kafka_security, redis_client
from plaza.errors import ConfigError
from plaza.settings import KafkaSettings, RedisSettings

ROOT = Path(__file__).resolve().parents[2]
REQUEST_PATH = ["plaza", "workers", "gateway"]
FORBIDDEN = {
    r"^\s*import pickle|^\s*from pickle|pickle\.loads?\(": "pickle",
    r"\btorch\.load\(": "torch.load (unpickles); TorchScript uses torch.jit.load",
    # ``def exec(`` is pb_utils' InferenceRequest.exec (Triton's BLS call), not the builtin.
    r"\bmarshal\.loads\(|(?<![.\w])eval\(|(?<![.\w])(?<!def )exec\(": "code execution from data",
    r"yaml\.load\(": "yaml.load",
}


def test_no_unpickling_or_eval_on_the_request_path() -> None:
    hits = []
    for package in REQUEST_PATH:
        for path in (ROOT / package).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                for pattern, what in FORBIDDEN.items():
                    if re.search(pattern, line):
                        hits.append(f"{path.relative_to(ROOT)}:{n}: {what}")
    assert hits == []


def test_kafka_sasl_ssl_settings_reach_the_clients(tmp_path: Path) -> None:
    opts = kafka_security(
        KafkaSettings(
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="plaza",
            sasl_password="s3cret",
        )
    )
    assert opts["security_protocol"] == "SASL_SSL"
    assert opts["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (opts["sasl_plain_username"], opts["sasl_plain_password"]) == ("plaza", "s3cret")
    assert opts["ssl_context"] is not None


def test_kafka_ssl_with_a_missing_ca_file_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kafka\.ssl_cafile"):
        kafka_security(KafkaSettings(security_protocol="SSL", ssl_cafile=tmp_path / "nope.pem"))


def test_redis_password_reaches_the_client() -> None:
    client = redis_client(RedisSettings(url="redis://127.0.0.1:1/0", password="pw"))
    assert client.connection_pool.connection_kwargs["password"] == "pw"


def test_secrets_do_not_show_in_settings_repr() -> None:
    text = repr(KafkaSettings(sasl_password="s3cret")) + repr(RedisSettings(password="pw"))
    assert "s3cret" not in text and "'pw'" not in text


def test_redis_ca_certs_with_a_plain_url_is_a_config_error(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked before the first connection")
    settings = RedisSettings(url="redis://:hunter2@127.0.0.1:1/0", ssl_ca_certs=ca)
    with pytest.raises(ConfigError, match="not rediss://") as info:
        redis_client(settings)
    assert info.value.code == "bad_config"
    assert "hunter2" not in info.value.message


def test_redis_ca_certs_reach_a_tls_client(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("a CA bundle")
    client = redis_client(RedisSettings(url="rediss://127.0.0.1:1/0", ssl_ca_certs=ca))
    pool = client.connection_pool
    assert issubclass(pool.connection_class, SSLConnection)
    assert pool.connection_kwargs["ssl_ca_certs"] == str(ca)


def test_redis_missing_ca_file_is_a_config_error(tmp_path: Path) -> None:
    settings = RedisSettings(url="rediss://127.0.0.1:1/0", ssl_ca_certs=tmp_path / "nope.pem")
    with pytest.raises(ConfigError, match="not a readable file"):
        redis_client(settings)
