"""``plaza services up|deps``: only Kafka and Redis, on this machine, without Docker.

``up`` starts them (``plaza.stack.Services``) and keeps them until Ctrl-C or SIGTERM;
``deps`` fetches Kafka's jars and installs redis-server, then exits (``make services``).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from plaza.stack import ServiceError, Services, ensure_kafka_jars, ensure_redis_server

__all__ = ["run_services_cli", "stop_signals"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="plaza services", description="Run Plaza's Kafka and Redis on this machine."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start Kafka and Redis; stop them on Ctrl-C/SIGTERM")
    up.add_argument("--data-dir", default="var/services", help="where data and logs go")
    up.add_argument("--kafka-port", type=int, default=9092)
    up.add_argument(
        "--kafka-nodes", type=int, default=1, help="KRaft nodes (ports from --kafka-port)"
    )
    up.add_argument("--redis-port", type=int, default=6379)
    up.add_argument("--redis-password", default=None)
    up.add_argument("--fresh", action="store_true", help="delete the data dir first")
    up.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness")
    commands.add_parser("deps", help="fetch Kafka's jars and install redis-server, then exit")
    return parser.parse_args(argv)


def run_services_cli(argv: list[str] | None = None) -> int:
    """``up``: start Kafka and Redis and keep them until Ctrl-C/SIGTERM; ``deps``: install."""
    args = _parse(argv)
    try:
        if args.command == "deps":
            print(f"kafka jars: {ensure_kafka_jars()}\nredis-server: {ensure_redis_server()}")
            return 0
        return _services_up(args)
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _services_up(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    if args.fresh:
        shutil.rmtree(data_dir, ignore_errors=True)
    services = Services(
        data_dir,
        kafka_port=args.kafka_port,
        kafka_nodes=args.kafka_nodes,
        redis_port=args.redis_port,
        redis_password=args.redis_password,
        ready_timeout_s=args.timeout,
    )
    stopping = threading.Event()
    with stop_signals(stopping):
        try:
            services.start()
            _print_addresses(services, data_dir)
            return _watch(services, stopping)
        finally:
            services.stop()
            print("services stopped", flush=True)


def _print_addresses(services: Services, data_dir: Path) -> None:
    kafka, store = services.kafka, services.redis
    assert kafka is not None and store is not None  # both are started here
    nodes = f"{kafka.nodes} node{'s' if kafka.nodes > 1 else ''}"
    print(f"kafka  {kafka.bootstrap_servers}  (Apache Kafka {kafka.version}, KRaft, {nodes})")
    print(f"redis  {store.url}  (AOF appendfsync {store.appendfsync})")
    print(f"data and logs in {data_dir}")
    print(
        f"export PLAZA_KAFKA__BOOTSTRAP_SERVERS={kafka.bootstrap_servers} "
        f"PLAZA_REDIS__URL={store.url}"
    )
    print("services up; Ctrl-C stops them", flush=True)


def _watch(services: Services, stopping: threading.Event) -> int:
    """Wait for a stop signal; return 1 if a service dies first."""
    while not stopping.wait(0.5):
        down = services.down()
        if down:
            print(f"error: {', '.join(down)} exited; see the logs", file=sys.stderr)
            return 1
    return 0


@contextlib.contextmanager
def stop_signals(stopping: threading.Event) -> Iterator[None]:
    """SIGINT/SIGTERM set ``stopping`` (main thread only) instead of raising mid-start."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


if __name__ == "__main__":
    raise SystemExit(run_services_cli())
