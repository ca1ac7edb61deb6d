"""TLS for both fronts, from three settings: a certificate chain, its private key, and
(optionally) the CA that client certificates must be signed by (mutual TLS).

Without ``gateway.tls_cert_file`` both fronts serve plain text, as before. With it, HTTP is
served as HTTPS and gRPC with server credentials; with
``gateway.tls_client_ca_file`` too, both require a client certificate signed by that CA.
The files are read and checked once at start, before anything listens: a missing or
unreadable one, contents that are not what the setting names (a certificate chain, its
unencrypted private key, a CA), or a server certificate past its end date are a ConfigError
naming the setting and the file.
"""

from __future__ import annotations

import base64
import binascii
import logging
import ssl
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc

from plaza.errors import ConfigError
from plaza.settings import GatewaySettings

log = logging.getLogger(__name__)

_PEM_CERT = (b"-----BEGIN CERTIFICATE-----", b"-----END CERTIFICATE-----")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The PEM files of the gateway's TLS, checked to be readable."""

    cert: Path
    key: Path
    client_ca: Path | None

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        """(certificate chain, private key, client CA or None), as bytes."""
        ca = _read(self.client_ca, "tls_client_ca_file") if self.client_ca else None
        return _read(self.cert, "tls_cert_file"), _read(self.key, "tls_key_file"), ca


def tls_files(gw: GatewaySettings) -> TlsFiles | None:
    """The configured TLS files, or None for plain text; ConfigError when half set up."""
    if gw.tls_cert_file is None:
        if gw.tls_key_file is not None or gw.tls_client_ca_file is not None:
            raise ConfigError(
                "gateway.tls_key_file / tls_client_ca_file are set without "
                "gateway.tls_cert_file: set the certificate too, or none of them",
                field="tls_cert_file",
            )
        return None
    if gw.tls_key_file is None:
        raise ConfigError(
            "gateway.tls_cert_file is set without gateway.tls_key_file", field="tls_key_file"
        )
    files = TlsFiles(gw.tls_cert_file, gw.tls_key_file, gw.tls_client_ca_file)
    files.read()  # fail at start, naming the file, not at the first handshake
    ssl_context(files)  # and on contents neither front could use (gRPC's included)
    return files


def grpc_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """gRPC server credentials; client certificates required when a client CA is set."""
    ssl_context(files)  # the checks of tls_files, for files that did not come through it
    cert, key, ca = files.read()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


def ssl_context(files: TlsFiles | None) -> ssl.SSLContext | None:
    """The HTTPS server context (None for plain text); client certificates required when
    a client CA is set. A file that cannot be used is a ConfigError naming its setting."""
    if files is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _load_chain(context, files)
    if files.client_ca is not None:
        try:
            context.load_verify_locations(cafile=files.client_ca)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"gateway TLS files cannot be used: gateway.tls_client_ca_file "
                f"{files.client_ca} holds no PEM CA certificate: {exc}",
                field="tls_client_ca_file",
            ) from exc
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _load_chain(context: ssl.SSLContext, files: TlsFiles) -> None:
    """The certificate chain and its key into ``context``; refused when the key is
    encrypted (OpenSSL would ask for its pass phrase on the terminal), when the two do
    not load, or when the server certificate has expired."""

    def no_pass_phrase() -> bytes:
        raise ConfigError(
            f"gateway.tls_key_file {files.key} is encrypted; the gateway takes no pass "
            "phrase: give it the key decrypted (openssl pkey -in KEY -out PLAIN_KEY)",
            field="tls_key_file",
        )

    leaf = _leaf_validity(_read(files.cert, "tls_cert_file"))
    try:
        context.load_cert_chain(files.cert, files.key, password=no_pass_phrase)
    except (ssl.SSLError, OSError) as exc:
        if leaf is None:  # not even the first certificate reads: the chain is at fault
            message = f"gateway.tls_cert_file {files.cert} holds no PEM certificate"
            field = "tls_cert_file"
        else:
            message = (
                f"gateway.tls_key_file {files.key} is not the PEM private key of the "
                f"certificate in gateway.tls_cert_file {files.cert}"
            )
            field = "tls_key_file"
        raise ConfigError(
            f"gateway TLS files cannot be used: {message}: {exc}", field=field
        ) from exc
    if leaf is not None:
        _check_dates(files.cert, *leaf)


def _check_dates(cert: Path, not_before: float, not_after: float) -> None:
    now = time.time()
    if not_after < now:
        raise ConfigError(
            f"gateway.tls_cert_file {cert}: the server certificate expired on "
            f"{_utc(not_after)}; every client would refuse it: renew it",
            field="tls_cert_file",
        )
    if not_before > now:
        log.warning(
            "gateway.tls_cert_file %s: the server certificate is not valid before %s; "
            "clients refuse it until then (is this host's clock right?)",
            cert,
            _utc(not_before),
        )


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _leaf_validity(pem: bytes) -> tuple[float, float] | None:
    """(notBefore, notAfter), in epoch seconds, of the first certificate of a PEM chain
    (the server's own, as OpenSSL takes it); None when it cannot be read."""
    begin, end = pem.find(_PEM_CERT[0]), pem.find(_PEM_CERT[1])
    if begin < 0 or end < begin:
        return None
    try:
        der = base64.b64decode(b"".join(pem[begin + len(_PEM_CERT[0]) : end].split()))
        return _validity(der)
    except (binascii.Error, IndexError, ValueError):
        return None


def _validity(der: bytes) -> tuple[float, float]:
    """The validity of a DER certificate: Certificate { TBSCertificate { [0] version
    (optional), serialNumber, signature, issuer, validity { notBefore, notAfter } ... } }."""
    _, tbs, _ = _element(der, _element(der, 0)[1])  # into Certificate, then TBSCertificate
    tag, _, after = _element(der, tbs)
    at = after if tag == 0xA0 else tbs  # past the explicit version, when there is one
    for _skip in range(3):  # serialNumber, signature, issuer
        at = _element(der, at)[2]
    _, at, _ = _element(der, at)  # into validity
    not_before = _time(der, at)
    return not_before, _time(der, _element(der, at)[2])


def _element(der: bytes, at: int) -> tuple[int, int, int]:
    """(tag, where its contents start, where they end) of the DER element at ``at``."""
    tag, length, at = der[at], der[at + 1], at + 2
    if length & 0x80:  # long form: the next (length & 0x7F) bytes hold it
        size = length & 0x7F
        length, at = int.from_bytes(der[at : at + size], "big"), at + size
    if at + length > len(der):
        raise ValueError("truncated DER")
    return tag, at, at + length


def _time(der: bytes, at: int) -> float:
    """A UTCTime (YYMMDDHHMMSSZ, 1950-2049) or GeneralizedTime, in epoch seconds."""
    tag, start, end = _element(der, at)
    text = der[start:end].decode("ascii")
    if tag == 0x17:
        text = ("19" if int(text[:2]) >= 50 else "20") + text
    elif tag != 0x18:
        raise ValueError(f"not a time: tag {tag:#x}")
    return datetime.strptime(text, "%Y%m%d%H%M%SZ").replace(tzinfo=UTC).timestamp()


def _read(path: Path, setting: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"gateway.{setting}: cannot read {path}: {exc.strerror}", field=setting
        ) from None
