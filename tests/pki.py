"""Certificates for TLS tests, made by the openssl CLI: a CA, a server certificate for
127.0.0.1 and localhost, and a client certificate (for mutual TLS), all signed by the CA."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _signed(root: Path, name: str, ca: Path, ca_key: Path, ext: str) -> tuple[Path, Path]:
    key, csr, cert, extfile = (root / f"{name}.{s}" for s in ("key", "csr", "pem", "ext"))
    extfile.write_text(ext)
    _openssl("genrsa", "-out", key, "2048")
    _openssl("req", "-new", "-key", key, "-subj", f"/CN={name}", "-out", csr)
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
        "-days", "2", "-out", cert, "-extfile", extfile,
    )  # fmt: skip
    return cert, key


def make_pki(root: Path) -> Pki:
    """A fresh CA and its server and client certificates under ``root``."""
    ca, ca_key = root / "ca.pem", root / "ca.key"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", "/CN=plaza-test-ca", "-keyout", ca_key, "-out", ca,
    )  # fmt: skip
    server = _signed(root, "server", ca, ca_key, "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    client = _signed(root, "client", ca, ca_key, "extendedKeyUsage=clientAuth\n")
    return Pki(ca, server[0], server[1], client[0], client[1])
