"""Prometheus exposition for Plaza's processes: one registry each, served over HTTP.

Every process (the gateway, each worker) builds its own ``CollectorRegistry`` and hands it
to a ``MetricsServer``; nothing is registered on prometheus_client's global registry, so
two workers in one test process never collide and no test has to unregister anything.

Counters keep Triton's names: Triton exposes ``nv_inference_request_success`` (no
``_total``) and dashboards written for Triton query exactly that, so ``render`` writes a
counter's samples under the family's own name and leaves out the ``_created`` samples that
prometheus_client adds. Everything else is the Prometheus text format 0.0.4 as usual.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from plaza.auth import CHALLENGE, bearer_matches
from plaza.errors import (
    Cancelled,
    ConfigError,
    DeadlineExceeded,
    ModelExecutionError,
    QueueFull,
)

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
METRICS_PATH = "/metrics"
_TYPES = {"counter", "gauge", "histogram", "summary"}
_POLL_S = 0.1
"""How often the server thread looks for ``close`` (the longest ``close`` waits)."""

# Triton's values of the ``reason`` label of nv_inference_request_failure.
REASON_REJECTED = "REJECTED"
REASON_BACKEND = "BACKEND"
REASON_CANCELED = "CANCELED"
REASON_OTHER = "OTHER"
_REASON_BY_CODE = {
    QueueFull.code: REASON_REJECTED,
    DeadlineExceeded.code: REASON_REJECTED,
    ModelExecutionError.code: REASON_BACKEND,
    Cancelled.code: REASON_CANCELED,
}


def failure_reason(code: str) -> str:
    """Triton's failure reason for a PlazaError code: REJECTED, BACKEND, CANCELED or OTHER.
    A model's error answer is BACKEND whatever Triton code it names (``model_error`` and
    the Python backend's ``model_error_<triton code>``)."""
    if code.startswith(ModelExecutionError.code + "_"):
        return REASON_BACKEND
    return _REASON_BY_CODE.get(code, REASON_OTHER)


# -- exposition -----------------------------------------------------------------------------


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape_label(str(v))}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def render(registry: Collector) -> bytes:
    """The registry's metrics in the text format, counters under Triton-style names."""
    lines: list[str] = []
    for family in registry.collect():
        kind = family.type if family.type in _TYPES else "untyped"
        doc = family.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {family.name} {doc}")
        lines.append(f"# TYPE {family.name} {kind}")
        for sample in family.samples:
            name = sample.name
            if name == f"{family.name}_created":
                continue
            if kind == "counter" and name == f"{family.name}_total":
                name = family.name
            value = floatToGoString(sample.value)  # type: ignore[no-untyped-call]
            lines.append(f"{name}{_labels(sample.labels)} {value}")
    return ("\n".join(lines) + "\n").encode() if lines else b""


# -- the HTTP server ------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: Collector
    api_key: bytes | None
    """The key a scrape must send as ``Authorization: Bearer <api_key>``, or None for an
    open endpoint."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != METRICS_PATH:
            self._answer(404, b"not found; metrics are at /metrics\n", "text/plain")
            return
        if not self._authorized():
            refusal = b"missing or wrong API key (Authorization: Bearer)\n"
            self._answer(401, refusal, "text/plain", CHALLENGE)
            return
        try:
            body = render(self.server.registry)
        except Exception as exc:  # a collector failed: say so, keep serving
            log.exception("collecting metrics failed")
            self._answer(500, f"collecting metrics failed: {exc}\n".encode(), "text/plain")
            return
        self._answer(200, body, CONTENT_TYPE)

    def _authorized(self) -> bool:
        """No key is set, or the request names it as the gateway's routes must."""
        key = self.server.api_key
        if key is None:
            return True
        given = (self.headers.get("Authorization") or "").encode("latin-1")
        return bearer_matches(given, key)

    def _answer(
        self, status: int, body: bytes, content_type: str, *headers: tuple[str, str]
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # scrapes are not news
        return


class MetricsServer:
    """Serves ``render(registry)`` at ``GET /metrics`` from a daemon thread until closed.

    Port 0 takes a free port; ``port`` says which. With ``api_key`` a scrape must send
    ``Authorization: Bearer <api_key>`` (Prometheus: ``authorization.credentials``), read as
    the gateway's routes read it (``plaza.auth``: the scheme in any case, a 401 that carries
    ``WWW-Authenticate: Bearer``).
    Collection runs on the server thread, so collectors read their numbers without the event
    loop's help (plain ints and dict copies, which the GIL keeps consistent enough for
    counters).
    """

    def __init__(
        self,
        registry: Collector,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
    ) -> None:
        try:
            self._server = _Server((host, port), _Handler)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc}") from exc
        self._server.registry = registry
        self._server.api_key = None if api_key is None else api_key.encode()
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(_POLL_S,),
            name=f"metrics-{self.port}",
            daemon=True,
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{METRICS_PATH}"

    def close(self) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
