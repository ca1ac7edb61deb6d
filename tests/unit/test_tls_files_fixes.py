"""The gateway's TLS files are checked at start, each error naming its own setting and file:
an encrypted key is refused (never a pass phrase prompt), an expired server certificate is
refused, a bad client CA is blamed on the CA; and over HTTPS a client that never finishes
its handshake is closed after the idle time, as an idle connection is.

Certificates are made by the openssl CLI (``openssl ca`` sets any start and end date).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
from pathlib import Path

import pytest

from plaza.errors import ConfigError
from plaza.gateway.grpc_server import GrpcServer, alpn_h2
from plaza.gateway.http_server import HttpRequest, HttpResponse, HttpServer
from plaza.gateway.tls import TlsFiles, grpc_credentials, ssl_context, tls_files
from plaza.settings import GatewaySettings
from tests.pki import Pki, make_pki

CA_CONFIG = """[ca]
default_ca = this
[this]
database = index.txt
new_certs_dir = .
serial = serial.txt
default_md = sha256
policy = any
[any]
commonName = supplied
"""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _self_signed(root: Path, start: str, end: str) -> tuple[Path, Path]:
    """A self-signed certificate valid from ``start`` to ``end`` (YYYYMMDDHHMMSSZ), and
    its key."""
    (root / "ca.cnf").write_text(CA_CONFIG)
    (root / "index.txt").write_text("")
    (root / "serial.txt").write_text("01\n")
    new_key = ("-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem")
    _openssl(root, "req", "-new", *new_key, "-subj", "/CN=localhost", "-out", "req.csr")
    dates = ("-startdate", start, "-enddate", end)
    signed = ("-selfsign", "-keyfile", "key.pem", "-in", "req.csr", "-out", "cert.pem")
    _openssl(root, "ca", "-batch", "-config", "ca.cnf", *dates, *signed)
    return root / "cert.pem", root / "key.pem"


def _settings(cert: Path, key: Path, ca: Path | None = None) -> GatewaySettings:
    return GatewaySettings(tls_cert_file=cert, tls_key_file=key, tls_client_ca_file=ca)


def test_an_encrypted_key_is_refused_not_prompted_for(tmp_path: Path, pki: Pki) -> None:
    encrypted = tmp_path / "encrypted.key"
    _openssl(tmp_path, "pkey", "-in", str(pki.server_key), "-aes256", "-passout", "pass:x",
             "-out", str(encrypted))  # fmt: skip
    with pytest.raises(ConfigError, match=r"encrypted\.key is encrypted") as refused:
        tls_files(_settings(pki.server_cert, encrypted))
    assert refused.value.details["field"] == "tls_key_file"
    # gRPC (grpcio) is given the key's bytes: the same check refuses it first
    with pytest.raises(ConfigError, match="is encrypted"):
        grpc_credentials(TlsFiles(pki.server_cert, encrypted, None))


def test_an_expired_certificate_is_refused(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path, "20200101000000Z", "20200102000000Z")
    with pytest.raises(ConfigError, match="expired on 2020-01-02 00:00:00 UTC") as refused:
        tls_files(_settings(cert, key))
    assert refused.value.details["field"] == "tls_cert_file"
    assert str(cert) in refused.value.message


def test_a_certificate_not_yet_valid_is_served_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cert, key = _self_signed(tmp_path, "20991231000000Z", "21000102000000Z")
    with caplog.at_level(logging.WARNING, logger="plaza.gateway.tls"):
        assert tls_files(_settings(cert, key)) is not None
    assert "not valid before 2099-12-31 00:00:00 UTC" in caplog.text


def test_a_valid_certificate_passes_without_a_warning(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="plaza.gateway.tls"):
        assert ssl_context(tls_files(_settings(pki.server_cert, pki.server_key))) is not None
    assert caplog.text == ""


def test_each_bad_file_is_blamed_on_its_own_setting(tmp_path: Path, pki: Pki) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a pem\n")
    cases = [
        (_settings(garbage, pki.server_key), "tls_cert_file"),
        (_settings(pki.server_cert, garbage), "tls_key_file"),
        (_settings(pki.server_cert, pki.client_key), "tls_key_file"),  # not its key
        (_settings(pki.server_cert, pki.server_key, garbage), "tls_client_ca_file"),
    ]
    for gw, field in cases:
        with pytest.raises(ConfigError) as refused:
            tls_files(gw)
        assert refused.value.details["field"] == field
        assert str(getattr(gw, field)) in refused.value.message


async def _never(request: HttpRequest) -> HttpResponse:
    raise AssertionError("no request is sent")


async def test_a_handshake_never_finished_is_closed_after_the_idle_time(pki: Pki) -> None:
    context = ssl_context(tls_files(_settings(pki.server_cert, pki.server_key)))
    server = HttpServer(_never, max_body_bytes=1024, keep_alive_s=0.2, ssl_context=context)
    port = await server.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        # nothing sent: the server closes it after keep_alive_s; asyncio's default
        # handshake timeout (60 s) would outlast this wait
        assert await asyncio.wait_for(reader.read(), 20) == b""
    finally:
        writer.close()
        await server.stop(0)


async def test_a_grpc_handshake_never_finished_is_closed_after_the_preface_time(
    pki: Pki,
) -> None:
    """The gRPC port's TLS handshake has the HTTP/2 preface's time (``handshake_s``)."""
    context = alpn_h2(ssl_context(tls_files(_settings(pki.server_cert, pki.server_key))))
    server = GrpcServer({}, max_message_bytes=1024, handshake_s=0.2, ssl_context=context)
    port = await server.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        assert await asyncio.wait_for(reader.read(), 20) == b""  # 60 s by asyncio's default
    finally:
        writer.close()
        await server.stop(0)
