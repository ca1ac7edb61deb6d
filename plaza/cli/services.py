"""``plaza services up|deps``: only Kafka and Redis, on this machine, without Docker.

``up`` starts them (``plaza.stack.Services``) and keeps them until Ctrl-C or SIGTERM;
``deps`` fetches Kafka's jars and installs redis-server, then exits (``make services``).

Every option is checked before anything is deleted or started (one ``error:`` line, exit
status 1). ``--fresh`` deletes only the ``kafka/`` and ``redis/`` folders Plaza made in the
data dir and refuses a data dir holding anything else. A Ctrl-C or SIGTERM while the
services start stops what had started and exits 128 + the signal (Ctrl-C: 130).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from plaza.cli.argtypes import count, seconds
from plaza.stack import ServiceError, Services, ensure_kafka_jars, ensure_redis_server
from plaza.stack.data_dir import prepare_data_dir
from plaza.stack.errors import Interrupted
from plaza.stack.ports import check_ports, require_free

__all__ = ["interrupted_status", "run_services_cli", "stop_signals"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="plaza services", description="Run Plaza's Kafka and Redis on this machine."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start Kafka and Redis; stop them on Ctrl-C/SIGTERM")
    up.add_argument("--data-dir", default="var/services", help="where data and logs go")
    up.add_argument("--kafka-port", type=int, default=9092)
    up.add_argument(
        "--kafka-nodes", type=count, default=1, help="KRaft nodes (ports from --kafka-port)"
    )
    up.add_argument("--redis-port", type=int, default=6379)
    up.add_argument("--redis-password", default=None)
    up.add_argument(
        "--fresh",
        action="store_true",
        help="delete the data dir's kafka/ and redis/ first (refused if it holds anything else)",
    )
    up.add_argument("--timeout", type=seconds, default=120.0, help="seconds to wait for readiness")
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
    services, data_dir = _prepare(args)
    stopping = threading.Event()
    with stop_signals(stopping) as received:
        try:
            services.start(stopping)
            _print_addresses(services, data_dir)
            return _watch(services, stopping)
        except Interrupted:
            print("interrupted while starting; stopping what had started", flush=True)
            return interrupted_status(received)
        finally:
            services.stop()
            print("services stopped", flush=True)


def _prepare(args: argparse.Namespace) -> tuple[Services, Path]:
    """Check every option, then make the data dir and, with ``--fresh``, clear it: a bad
    option deletes nothing and starts nothing."""
    data_dir = Path(args.data_dir).resolve()
    services = Services(  # only records the options (and checks the password)
        data_dir,
        kafka_port=args.kafka_port,
        kafka_nodes=args.kafka_nodes,
        redis_port=args.redis_port,
        redis_password=args.redis_password,
        ready_timeout_s=args.timeout,
    )
    ports = services.ports()
    owners = {
        "--kafka-port": ports["kafka"],
        "the Kafka controller (--kafka-port + --kafka-nodes)": ports["kafka controller"],
        "--redis-port": ports["redis"],
    }
    check_ports(owners)
    for owner, taken in owners.items():
        require_free(taken, owner)
    prepare_data_dir(data_dir)
    if args.fresh:
        Services.clear_data_dir(data_dir)
    return services, data_dir


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
    """Wait for a stop signal; return 1 (exit code and log tail printed) if a service dies
    first."""
    while not stopping.wait(0.5):
        try:
            services.check()
        except ServiceError as exc:
            print(f"error: {exc.message}", file=sys.stderr, flush=True)
            return 1
    return 0


def interrupted_status(received: list[int]) -> int:
    """The exit status after a stop signal: 128 + its number (Ctrl-C: 130)."""
    return 128 + (received[0] if received else int(signal.SIGINT))


@contextlib.contextmanager
def stop_signals(stopping: threading.Event) -> Iterator[list[int]]:
    """SIGINT/SIGTERM set ``stopping`` (main thread only) instead of raising mid-start.

    Yields the list of the signals received, first first (for :func:`interrupted_status`).
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        stopping.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


if __name__ == "__main__":
    raise SystemExit(run_services_cli())
