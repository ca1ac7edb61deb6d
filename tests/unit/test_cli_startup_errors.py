"""A new user's first mistakes: each is a clear line and an exit status, never a traceback.

Kafka "out of reach" is a closed port on the loopback (connection refused at once); no
Kafka or Redis is needed. The pipeline example is loaded from its file.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from plaza import connections
from plaza.cli.main import main
from plaza.cli.up import _parse
from plaza.errors import EXIT_RETRIABLE, Unavailable
from plaza.gateway.main import processes_status
from plaza.settings import KafkaSettings
from plaza.workers.ensemble import main as ensemble_main

ROOT = Path(__file__).resolve().parents[2]

SIMULATED = """
name: "simulated"
backend: "plaza_simulated"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


@pytest.fixture(autouse=True)
def gc_thresholds() -> Iterator[None]:
    """``plaza gateway`` and ``plaza worker`` tune the collector: put it back after."""
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.fixture
def closed_port() -> Iterator[str]:
    """host:port of a loopback port nothing listens on (bound, never listening)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """A repository of one simulated model (no model file to build)."""
    (tmp_path / "simulated" / "1").mkdir(parents=True)
    (tmp_path / "simulated" / "config.pbtxt").write_text(SIMULATED)
    return tmp_path


def test_ensure_topics_without_kafka_is_unavailable_and_closes_its_admin_client(
    closed_port: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[AIOKafkaAdminClient] = []
    real = connections.kafka_admin

    def recorded(k: KafkaSettings) -> AIOKafkaAdminClient:
        made.append(real(k))
        return made[-1]

    monkeypatch.setattr(connections, "kafka_admin", recorded)
    kafka = KafkaSettings(bootstrap_servers=closed_port, request_timeout_ms=5000)
    with pytest.raises(Unavailable, match=f"Kafka did not answer at {closed_port}"):
        asyncio.run(connections.ensure_topics(kafka, ["plaza.infer.x"]))
    assert [getattr(admin, "_closed", False) for admin in made] == [True]


def _one_error_line(err: str, command: str) -> str:
    assert "Traceback" not in err
    ours = [line for line in err.splitlines() if line.startswith(f"plaza {command}: error:")]
    assert len(ours) == 1, err
    return ours[0]


def test_gateway_without_kafka_is_one_line(
    closed_port: str, repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "gateway",
        f"--repository={repository}",
        f"--kafka.bootstrap_servers={closed_port}",
        f"--redis.url=redis://{closed_port}/0",
        "--gateway.metrics_port=-1",
    ]
    assert main(argv) == EXIT_RETRIABLE  # Kafka away: may work later
    line = _one_error_line(capsys.readouterr().err, "gateway")
    assert f"Kafka did not answer at {closed_port}" in line


def test_several_gateway_processes_without_kafka_exit_as_one_would(
    closed_port: str, repository: Path
) -> None:
    """Each process exits EXIT_RETRIABLE, so the gateway does too (it used to exit 1: a
    supervisor gave up on a Kafka that was only late)."""
    argv = [
        "gateway",
        f"--repository={repository}",
        f"--kafka.bootstrap_servers={closed_port}",
        f"--redis.url=redis://{closed_port}/0",
        "--gateway.metrics_port=-1",
        "--gateway.workers=2",
    ]
    assert main(argv) == EXIT_RETRIABLE


@pytest.mark.parametrize(
    ("exit_codes", "stopped", "status"),
    [
        ([0, -signal.SIGTERM], True, 0),
        ([EXIT_RETRIABLE, -signal.SIGTERM], False, EXIT_RETRIABLE),
        ([EXIT_RETRIABLE, EXIT_RETRIABLE], False, EXIT_RETRIABLE),
        ([EXIT_RETRIABLE, EXIT_RETRIABLE], True, EXIT_RETRIABLE),
        ([EXIT_RETRIABLE, 1], False, 1),  # one refused its settings: starting again will not do
        ([EXIT_RETRIABLE, -signal.SIGKILL], False, 1),  # one killed past its grace
        ([0, 0], False, 1),  # a process that ended unasked
    ],
)
def test_the_gateways_status_is_retriable_only_when_every_failure_is(
    exit_codes: list[int | None], stopped: bool, status: int
) -> None:
    assert processes_status(exit_codes, stopped=stopped) == status


ENSEMBLE = """
name: "twice"
platform: "ensemble"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "simulated"
      model_version: -1
      input_map { key: "INPUT0" value: "INPUT0" }
      output_map { key: "OUTPUT0" value: "middle" }
    },
    {
      model_name: "simulated"
      model_version: -1
      input_map { key: "INPUT0" value: "middle" }
      output_map { key: "OUTPUT0" value: "OUTPUT0" }
    }
  ]
}
"""


def test_ensemble_runner_without_kafka_exits_retriable(
    closed_port: str, redis_url: str, repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repository / "twice" / "1").mkdir(parents=True)
    (repository / "twice" / "config.pbtxt").write_text(ENSEMBLE)
    argv = [
        "--worker.model=twice",
        f"--repository={repository}",
        f"--kafka.bootstrap_servers={closed_port}",
        f"--redis.url={redis_url}",
        "--worker.metrics_port=-1",
    ]
    assert ensemble_main(argv) == EXIT_RETRIABLE
    line = _one_error_line(capsys.readouterr().err, "ensemble")
    assert f"Kafka did not answer at {closed_port}" in line


def _worker_argv(repository: Path, kafka: str, redis_url: str) -> list[str]:
    return [
        "worker",
        "--model=simulated",
        f"--repository={repository}",
        f"--kafka.bootstrap_servers={kafka}",
        f"--redis.url={redis_url}",
        "--worker.metrics_port=-1",
        "--worker.device=cpu",
    ]


def test_worker_without_kafka_is_one_line(
    closed_port: str, redis_url: str, repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_worker_argv(repository, closed_port, redis_url)) == EXIT_RETRIABLE
    line = _one_error_line(capsys.readouterr().err, "worker")
    assert f"Kafka did not answer at {closed_port}" in line


def test_worker_without_redis_is_one_line_before_it_takes_partitions(
    closed_port: str, kafka_bootstrap: str, repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Redis is checked first: a worker that cannot store answers takes no requests."""
    assert (
        main(_worker_argv(repository, kafka_bootstrap, f"redis://{closed_port}/0"))
        == EXIT_RETRIABLE
    )
    line = _one_error_line(capsys.readouterr().err, "worker")
    assert f"Redis did not answer at redis://{closed_port}/0" in line


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--gateway-workers", "0"),
        ("--gateway-workers", "-2"),
        ("--ready-timeout", "-5"),
        ("--ready-timeout", "nan"),
        ("--repository-poll-secs", "-1"),
        ("--repository-poll-secs", "0"),
    ],
)
def test_up_refuses_bad_counts_and_durations_at_parse(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _parse([flag, value])
    assert exc.value.code == 2
    assert f"argument {flag}:" in capsys.readouterr().err


def test_up_takes_good_counts_and_durations() -> None:
    args = _parse(["--gateway-workers", "2", "--ready-timeout", "5", "--repository-poll-secs", "1"])
    assert (args.gateway_workers, args.ready_timeout, args.repository_poll_secs) == (2, 5.0, 1.0)


def _pipeline_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pipeline_example", ROOT / "examples/pipeline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv", [["--jobs", "-3"], ["--jobs", "0"], ["--consumers", "0"]])
def test_pipeline_example_refuses_counts_below_one(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _pipeline_example().parse_args(argv)
    assert exc.value.code == 2


@pytest.mark.parametrize(("wrong", "status"), [(0, 0), (5, 1)])
def test_pipeline_example_exit_status_reflects_missing_results(
    wrong: int, status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = _pipeline_example()
    runs: list[tuple[Any, ...]] = []

    async def pipeline(jobs: int, consumers: int) -> int:  # the Kafka run, counted only
        runs.append((jobs, consumers))
        return wrong

    monkeypatch.setattr(example, "main", pipeline)
    assert example.run(["--jobs", "5", "--consumers", "1"]) == status
    assert runs == [(5, 1)]


def test_worker_and_gateway_help_name_their_command(capsys: pytest.CaptureFixture[str]) -> None:
    helps = {}
    for command in ("worker", "gateway"):
        with pytest.raises(SystemExit) as exc:
            main([command, "--help"])
        assert exc.value.code == 0
        helps[command] = capsys.readouterr().out
    assert helps["worker"].startswith("usage: plaza worker ")
    assert helps["gateway"].startswith("usage: plaza gateway ")
    assert "--model str" in helps["worker"]  # the shorthand plaza --help advertises
    assert "Run one worker process" in helps["worker"]
    assert "Run the KServe v2 gateway" in helps["gateway"]


def test_settings_refuses_unknown_arguments_and_has_its_own_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["settings", "--bogus"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["settings", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: plaza settings") and "# Settings" not in out
    assert main(["settings"]) == 0
    assert capsys.readouterr().out.startswith("# Settings")
