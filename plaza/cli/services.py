"""``plaza services up|deps``: Plaza's Kafka and Redis on this machine (``plaza.stack``)."""

from __future__ import annotations

from plaza.stack.local_services import run_services_cli

__all__ = ["run_services_cli"]

if __name__ == "__main__":
    raise SystemExit(run_services_cli())
