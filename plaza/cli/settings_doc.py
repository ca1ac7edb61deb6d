"""``plaza settings``: every setting with its default, environment variable and CLI flag.

docs/settings.md is this command's output; a unit test keeps the two equal.
"""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import BaseModel

from plaza.settings import PlazaSettings

HEADER = """# Settings

Every setting has a default, an environment variable and a command-line flag (the flag goes
after the subcommand: `plaza worker --model mlp --kafka.bootstrap_servers 10.0.0.5:9092`).
Secrets (`*_password`, `api_key`) are never printed in logs or reprs. This page is the output
of `plaza settings`; `tests/unit/test_settings_doc.py` keeps it current.

Security pass-through: Kafka SASL/TLS (`kafka.security_protocol`, `kafka.sasl_mechanism`,
`kafka.sasl_username`, `kafka.sasl_password`, `kafka.ssl_cafile`, `kafka.ssl_certfile`,
`kafka.ssl_keyfile`) reaches every producer, consumer and admin client; Redis
`redis.password` and `redis.ssl_ca_certs` (with a `rediss://` URL for TLS) reach every Redis
client (`plaza/connections.py`). `gateway.api_key` turns on bearer-token auth.

ONNX Runtime in a worker: `worker.intra_op_threads` (the config's `intra_op_thread_count`
parameter wins when above 0), `worker.ort_intra_op_spinning` and `worker.ort_inter_op_spinning`
(`session.intra_op.allow_spinning` / `session.inter_op.allow_spinning`). Spinning is off by
default: measured side by side (`python -m plaza.loadgen.bench --only ort_spinning`,
docs/benchmarks.md), spinning threads took the cores the gateway, Kafka and Redis need.
`worker.intra_op_threads` stays 0 (every core): one thread lost 12% of the Kafka path's
throughput at full batches (`--only ort_threads`) and gained only within the noise at small
ones.
Inter-op threads stay at 1: a worker runs each session sequentially (`ORT_SEQUENTIAL`).
`gateway.workers` N > 1 runs N gateway processes on the same HTTP and gRPC ports
(docs/gateway.md, "Several gateway processes").
"""


def _default(field: Any) -> str:
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return ""
    return f"`{value}`" if value not in (None, "") else "(none)"


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows += _rows(annotation, f"{prefix}{name}.")
            continue
        dotted = f"{prefix}{name}"
        env = "PLAZA_" + dotted.replace(".", "__").upper()
        description = (field.description or "").replace("|", "\\|")
        rows.append(f"| `--{dotted}` | `{env}` | {_default(field)} | {description} |")
    return rows


def render() -> str:
    lines = [
        HEADER,
        "| flag | environment variable | default | meaning |",
        "| --- | --- | --- | --- |",
        *_rows(PlazaSettings, ""),
    ]
    return "\n".join(lines) + "\n"


def run_settings_doc(argv: list[str] | None = None) -> int:
    """``plaza settings [-h]``: print the settings page; any other argument is refused
    (argparse: a usage line and exit status 2)."""
    parser = argparse.ArgumentParser(
        prog="plaza settings",
        description="Print every setting of Plaza with its default, environment variable "
        "and command-line flag, as a Markdown page (docs/settings.md is this output).",
    )
    parser.parse_args(argv or [])
    print(render(), end="")
    return 0
