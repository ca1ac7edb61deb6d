"""``plaza services up`` and ``plaza up``: options checked before anything is deleted or
started, one-line errors instead of tracebacks, Ctrl-C during the start, a dead service
reported with its exit code and log.

Most tests fail before any service starts; two run a real redis-server. Ctrl-C while
Kafka starts (a Kafka JVM) is in tests/integration/test_cli_services_interrupt.py.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from plaza.cli.services import _watch, run_services_cli
from plaza.cli.up import _ready_or_stopping, run_up
from plaza.stack import (
    Deployment,
    GatewayProcess,
    Interrupted,
    ProcessGroup,
    Services,
    free_port,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = ROOT / "model_repository"


def free_ports() -> list[str]:
    """``--kafka-port`` (and its controller, the port after) and ``--redis-port``, free."""
    kafka = free_port(count=2)
    redis_port = free_port()
    while redis_port in (kafka, kafka + 1):
        redis_port = free_port()
    return ["--kafka-port", str(kafka), "--redis-port", str(redis_port)]


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# -- plaza services up: options ---------------------------------------------------------------


def test_fresh_with_a_bad_option_deletes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("precious")
    argv = ["up", "--fresh", "--data-dir", str(tmp_path), "--redis-port", "99999"]
    assert run_services_cli(argv) == 1
    assert (tmp_path / "notes.txt").read_text() == "precious"
    assert "--redis-port 99999" in one_error_line(capsys.readouterr().err)


def test_fresh_refuses_a_data_dir_holding_anything_plaza_did_not_make(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("precious")
    (tmp_path / "kafka").mkdir()
    (tmp_path / "kafka" / "cluster.id").write_text("abc\n")
    argv = ["up", "--fresh", "--data-dir", str(tmp_path), *free_ports(), "--timeout", "1"]
    assert run_services_cli(argv) == 1  # (before the fix a start gave up after 1 s)
    assert (tmp_path / "notes.txt").read_text() == "precious"
    assert (tmp_path / "kafka" / "cluster.id").exists()
    assert not (tmp_path / "redis").exists()  # nothing started
    error = one_error_line(capsys.readouterr().err)
    assert "notes.txt" in error and "deleted nothing" in error


@pytest.mark.parametrize("nodes", ["0", "-1", "two"])
def test_kafka_nodes_below_one_is_refused_at_parse(
    nodes: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        run_services_cli(["up", "--kafka-nodes", nodes])
    assert exited.value.code == 2
    assert "--kafka-nodes" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["a plain file", "below a plain file", "in /proc"])
def test_a_data_dir_that_cannot_be_used_is_one_error_line(
    tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "plain"
    plain.write_text("a file")
    data_dir = {
        "a plain file": plain,
        "below a plain file": plain / "data",
        "in /proc": Path("/proc/plaza-no-such-dir"),
    }[where]
    assert run_services_cli(["up", "--data-dir", str(data_dir), *free_ports()]) == 1
    assert one_error_line(capsys.readouterr().err).startswith(f"error: --data-dir {data_dir}")


def test_a_password_redis_conf_cannot_hold_is_refused_before_anything_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "data"
    argv = ["up", "--data-dir", str(data_dir), *free_ports(), "--redis-password", 'pa"ss']
    assert run_services_cli(argv) == 1
    assert not data_dir.exists()
    assert "redis.conf" in one_error_line(capsys.readouterr().err)


def test_ports_used_twice_are_refused_before_anything_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kafka = free_port(count=3)
    data_dir = tmp_path / "data"
    argv = ["up", "--data-dir", str(data_dir), "--kafka-port", str(kafka)]
    argv += ["--redis-port", str(kafka + 1)]  # the controller's port
    assert run_services_cli(argv) == 1
    assert not data_dir.exists()
    error = one_error_line(capsys.readouterr().err)
    assert "Kafka controller" in error and "--redis-port" in error


# -- plaza services up: a service that dies -----------------------------------------------


async def test_a_service_that_dies_is_reported_with_its_exit_code_and_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Services(tmp_path, bootstrap="127.0.0.1:1", redis_port=free_port()) as services:
        server = services.redis
        assert server is not None and server.pid is not None
        os.kill(server.pid, signal.SIGKILL)  # our own child
        await wait_for(lambda: not server.running, 30, "redis-server to exit")
        assert _watch(services, threading.Event()) == 1
    err = capsys.readouterr().err
    assert "exited with code -9" in err
    assert str(server.log_file) in err


# -- plaza up -------------------------------------------------------------------------------


def test_plaza_up_refuses_ports_used_twice_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = free_port(count=4)
    data_dir = tmp_path / "data"
    argv = ["--repository", str(REPOSITORY), "--models", "identity", "--data-dir", str(data_dir)]
    argv += ["--http-port", str(first), "--grpc-port", str(first)]
    argv += ["--metrics-port", str(first + 1), "--kafka-port", str(first + 2)]
    argv += ["--redis-port", str(first + 3)]  # the Kafka controller's (kafka port + 1)
    assert run_up(argv) == 1
    assert not data_dir.exists()
    error = one_error_line(capsys.readouterr().err)
    assert "--http-port and --grpc-port both use port" in error
    assert "Kafka controller (--kafka-port + 1) and --redis-port" in error


async def test_plaza_up_gateway_wait_ends_on_a_stop_request(tmp_path: Path) -> None:
    deployment = Deployment("127.0.0.1:1", "redis://127.0.0.1:1/0", REPOSITORY)
    gateway = GatewayProcess(deployment, free_port(), tmp_path)  # never started: never ready
    stopping = threading.Event()
    stopping.set()
    with pytest.raises(Interrupted):
        await _ready_or_stopping(gateway, ProcessGroup(tmp_path), stopping, 3600)
