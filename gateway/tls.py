"""TLS for both fronts, from three settings: a certificate chain, its private key, and
(optionally) the CA that client certificates must be signed by (mutual TLS).

Without ``gateway.tls_cert_file`` both fronts serve plain text, as before. With it, HTTP is
served as HTTPS and gRPC with server credentials; with
``gateway.tls_client_ca_file`` too, both require a client certificate signed by that CA.
The files are read once at start: a missing or unreadable one is a ConfigError naming it.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from plaza.errors import ConfigError
from plaza.settings import GatewaySettings


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
    return files


def grpc_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """gRPC server credentials; client certificates required when a client CA is set."""
    cert, key, ca = files.read()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


def ssl_context(files: TlsFiles | None) -> ssl.SSLContext | None:
    """The HTTPS server context (None for plain text); client certificates required when
    a client CA is set."""
    if files is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(files.cert, files.key)
        if files.client_ca is not None:
            context.load_verify_locations(cafile=files.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"gateway TLS files cannot be used: {exc}", field="tls_cert_file"
        ) from exc
    return context


def _read(path: Path, setting: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"gateway.{setting}: cannot read {path}: {exc.strerror}", field=setting
        ) from None
