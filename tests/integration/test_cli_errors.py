"""A user's mistake is one clear line from the CLI, never a traceback.

Each case runs the real ``plaza`` command in a subprocess, as an operator would, and checks
the exit status and that stderr names the problem without a Python traceback.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from plaza.stack import free_port
from tests.support import REPOSITORY

pytestmark = pytest.mark.timeout(180)


def plaza(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plaza.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
    )


def assert_one_clear_error(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode != 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


@pytest.fixture
def taken_port() -> Iterator[int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def test_an_unknown_model_is_named(tmp_path: Path) -> None:
    up = plaza("up", "--models", "add_sub,nope", "--data-dir", str(tmp_path))
    assert_one_clear_error(up, "plaza up: error", "nope", "add_sub")
    worker = plaza("worker", "--worker.model", "nope")
    assert_one_clear_error(worker, "plaza worker: error", "nope")


def test_a_missing_repository_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    for command in ("up", "gateway"):
        done = plaza(command, "--repository", str(missing), "--data-dir", str(tmp_path))
        if command == "gateway":  # the gateway takes settings flags only
            done = plaza(command, "--repository", str(missing))
        assert_one_clear_error(done, f"plaza {command}: error", str(missing))


def test_an_unreadable_config_is_named(tmp_path: Path) -> None:
    repo = tmp_path / "repository"
    (repo / "broken").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text("name: 'broken' max_batch_size: {{{")
    done = plaza("up", "--repository", str(repo), "--data-dir", str(tmp_path / "up"))
    assert_one_clear_error(done, "plaza up: error", "config.pbtxt")


def test_a_port_in_use_is_named(tmp_path: Path, taken_port: int) -> None:
    done = plaza("up", "--http-port", str(taken_port), "--data-dir", str(tmp_path))
    assert_one_clear_error(done, "plaza up: error", str(taken_port), "in use")


def test_bad_settings_flags_are_named() -> None:
    done = plaza("gateway", "--gateway.http_port", "not-a-port")
    assert done.returncode == 2
    assert_one_clear_error(done, "gateway.http_port")


def test_java_missing_is_named(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(sys.executable).parent)  # the venv only: no java, no mvn
    done = plaza(
        "services",
        "up",
        "--data-dir",
        str(tmp_path),
        "--kafka-port",
        str(free_port(count=2)),
        "--redis-port",
        str(free_port()),
        env=env,
    )
    assert_one_clear_error(done, "not found")
    assert "java" in done.stderr or "mvn" in done.stderr


def test_kafka_not_up_in_time_says_which_log_to_read(tmp_path: Path) -> None:
    done = plaza(
        "services",
        "up",
        "--data-dir",
        str(tmp_path),
        "--kafka-port",
        str(free_port(count=2)),
        "--redis-port",
        str(free_port()),
        "--timeout",
        "0.01",
    )
    assert_one_clear_error(done, "timed out", "read ", "server.log")


def test_a_symlinked_model_folder_is_a_model(tmp_path: Path) -> None:
    from plaza.repository import ModelRepository

    repo = tmp_path / "repository"
    repo.mkdir()
    (repo / "add_sub").symlink_to(REPOSITORY / "add_sub", target_is_directory=True)
    models = ModelRepository(repo)
    assert models.model_names() == ["add_sub"]
    assert models.spec("add_sub").inputs[0].name == "INPUT0"
    assert [v.version for v in models.served_versions("add_sub")] == [1]
