"""``plaza up`` and two exported settings it must not take as they are: topic replication
(its one broker cannot keep more than one in-sync replica, so an exported
``kafka.min_insync_replicas`` above 1 would refuse every write) and ``gateway.workers``
(each gateway process serves metrics on its own port, all of them checked up front)."""

from __future__ import annotations

from pathlib import Path

import pytest

from plaza.cli.up import (
    _check_ports,
    _deployment,
    _exported,
    _override_warnings,
    _own_settings,
    _parse,
    _part_settings,
    _port_owners,
    _start_models,
    _worker_plan,
)
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from plaza.stack import Services
from plaza.stack.errors import ServiceOptionError
from tests.support import REPOSITORY


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """One model, on the simulated device: no files to build."""
    root = tmp_path / "repo"
    (root / "simulated" / "1").mkdir(parents=True)
    config = (REPOSITORY / "simulated" / "config.pbtxt").read_text()
    (root / "simulated" / "config.pbtxt").write_text(config)
    return root


def _own_broker(tmp_path: Path) -> Services:
    """plaza up's services (its own Kafka and Redis), made but not started."""
    return Services(tmp_path / "up", kafka_port=19092, redis_port=16379)


def test_exported_replication_above_one_is_set_to_one_and_named(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAZA_KAFKA__MIN_INSYNC_REPLICAS", "2")
    monkeypatch.setenv("PLAZA_KAFKA__REPLICATION_FACTOR", "3")
    args = _parse(["--repository", str(repo)])
    plan = _worker_plan(ModelRepository(repo), _start_models(args))
    dep = _deployment(args, _own_broker(tmp_path), PlazaSettings())
    env = dep.env(**_part_settings(dep, plan, args))
    assert env["PLAZA_KAFKA__MIN_INSYNC_REPLICAS"] == "1"
    assert env["PLAZA_KAFKA__REPLICATION_FACTOR"] == "1"
    kafka = dep.settings().kafka  # the topics plaza up's own clients create
    assert (kafka.min_insync_replicas, kafka.replication_factor) == (1, 1)
    assert _override_warnings(_exported(), _own_settings(dep, plan, args)) == [
        "plaza up: warning: PLAZA_KAFKA__MIN_INSYNC_REPLICAS exported, not used: plaza up sets 1",
        "plaza up: warning: PLAZA_KAFKA__REPLICATION_FACTOR exported, not used: plaza up sets 1",
    ]


def test_exported_replication_of_one_is_kept_without_a_warning(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAZA_KAFKA__MIN_INSYNC_REPLICAS", "1")
    args = _parse(["--repository", str(repo)])
    plan = _worker_plan(ModelRepository(repo), _start_models(args))
    dep = _deployment(args, _own_broker(tmp_path), PlazaSettings())
    assert dep.env(**_part_settings(dep, plan, args))["PLAZA_KAFKA__MIN_INSYNC_REPLICAS"] == "1"
    assert _override_warnings(_exported(), _own_settings(dep, plan, args)) == []


@pytest.mark.parametrize(
    ("exported", "flags", "ports"),
    [
        (None, [], [18002]),
        ("3", [], [18002, 18003, 18004]),
        ("3", ["--gateway-workers", "2"], [18002, 18003]),  # the flag wins
        (None, ["--gateway-workers", "2"], [18002, 18003]),
    ],
)
def test_every_gateway_process_has_its_metrics_port_counted(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    exported: str | None,
    flags: list[str],
    ports: list[int],
) -> None:
    monkeypatch.delenv("PLAZA_GATEWAY__WORKERS", raising=False)
    if exported is not None:
        monkeypatch.setenv("PLAZA_GATEWAY__WORKERS", exported)
    args = _parse(["--metrics-port", "18002", *flags])
    owners = _port_owners(args, _own_broker(tmp_path), PlazaSettings())
    assert owners["--metrics-port"] == ports


def test_an_exported_workers_metrics_port_clashing_with_another_port_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAZA_GATEWAY__WORKERS", "3")  # metrics on 18002, 18003 and 18004
    args = _parse(["--metrics-port", "18002", "--http-port", "18004", "--grpc-port", "18005"])
    with pytest.raises(ServiceOptionError) as caught:
        _check_ports(args, _own_broker(tmp_path), PlazaSettings())
    assert caught.value.code == "bad_service_option"
    assert "--http-port and --metrics-port both use port 18004" in caught.value.message
