"""The gateway's TLS settings: half a setup, or a file that cannot be read, is a clear
ConfigError at start; a full one gives both fronts their options."""

from __future__ import annotations

from pathlib import Path

import pytest

from plaza.errors import ConfigError
from plaza.gateway.tls import ssl_context, tls_files
from plaza.settings import GatewaySettings


def test_no_certificate_means_plain_text() -> None:
    assert tls_files(GatewaySettings()) is None
    assert ssl_context(None) is None


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"tls_cert_file": "cert.pem"}, "tls_key_file"),
        ({"tls_key_file": "key.pem"}, "tls_cert_file"),
        ({"tls_client_ca_file": "ca.pem"}, "tls_cert_file"),
    ],
)
def test_half_a_setup_is_refused(tmp_path: Path, given: dict[str, str], field: str) -> None:
    files = {k: tmp_path / v for k, v in given.items()}
    for path in files.values():
        path.write_text("pem")
    with pytest.raises(ConfigError) as refused:
        tls_files(GatewaySettings(**files))
    assert refused.value.details["field"] == field


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text("pem")
    gw = GatewaySettings(tls_cert_file=tmp_path / "cert.pem", tls_key_file=tmp_path / "gone.pem")
    with pytest.raises(ConfigError, match=r"gone\.pem"):
        tls_files(gw)


def test_files_that_are_not_pem_are_a_config_error(tmp_path: Path) -> None:
    for name in ("cert.pem", "key.pem", "ca.pem"):
        (tmp_path / name).write_text("pem")
    gw = GatewaySettings(
        tls_cert_file=tmp_path / "cert.pem",
        tls_key_file=tmp_path / "key.pem",
        tls_client_ca_file=tmp_path / "ca.pem",
    )
    with pytest.raises(ConfigError, match="TLS files cannot be used"):
        ssl_context(tls_files(gw))
