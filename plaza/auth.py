"""The API key check every Plaza HTTP port shares: ``Authorization: Bearer <api_key>``.

The gateway's routes (HTTP and gRPC) and the metrics ports (``plaza.metrics``) read the
header the same way, as RFC 7235 says: the scheme in any case, the key compared in constant
time, and a refusal that names the scheme it asks for (``CHALLENGE``).
"""

from __future__ import annotations

import hmac

CHALLENGE = ("WWW-Authenticate", "Bearer")
"""The header every 401 carries (RFC 7235): the scheme the port asks for."""


def bearer_matches(credentials: bytes, api_key: bytes) -> bool:
    """``credentials`` (an Authorization value) are ``Bearer <api_key>``: the scheme in any
    case (RFC 7235), one or more spaces after it, the key compared in constant time."""
    scheme, _, token = credentials.strip(b" \t").partition(b" ")
    matches = hmac.compare_digest(token.lstrip(b" "), api_key)
    return scheme.lower() == b"bearer" and matches
