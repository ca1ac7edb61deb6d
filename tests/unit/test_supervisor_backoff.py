"""``plaza up --process-per-model``'s supervisor restarts a model's worker that exited, with
a hand-moved clock and fake processes (no services: nothing here reaches Kafka or Redis).

The back-off starts at 1 s, doubles up to 60 s, and starts afresh after a worker that served
a minute; a failed start is retried unless ``plaza worker``'s error line says it refused the
model (Kafka or Redis away is not the model's fault).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from plaza.cli.main import EXIT_RETRIABLE
from plaza.model_control import DesiredModel
from plaza.stack import Deployment, ProcessGroup
from plaza.stack.supervisor import (
    ERROR_PREFIX,
    RESTART_MAX_S,
    ModelSupervisor,
    RestartBackoff,
    _Running,
    _Starting,
    start_failure,
)
from tests.fakes import ManualClock

MODEL = "sim"
GENERATION = 7


class FakeWorker:
    """A worker process that has exited: as ``ChildProcess`` reports it."""

    def __init__(self, log_file: Path, exit_code: int, *, crashed: bool = True) -> None:
        self.log_file = log_file
        self.exit_code = exit_code
        self.crashed = crashed
        self.alive = False


def test_the_backoff_doubles_up_to_its_cap_and_starts_afresh() -> None:
    clock = ManualClock()
    backoff = RestartBackoff(clock)
    assert backoff.due(MODEL, GENERATION)  # never exited
    delays = [backoff.exited(MODEL, GENERATION) for _ in range(9)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert not backoff.due(MODEL, GENERATION)
    clock.now += RESTART_MAX_S - 0.5
    assert not backoff.due(MODEL, GENERATION)
    clock.now += 0.5
    assert backoff.due(MODEL, GENERATION)
    assert backoff.due(MODEL, GENERATION + 1)  # a new load is not held back
    assert backoff.exited(MODEL, GENERATION + 1) == 1  # and starts afresh
    assert backoff.exited(MODEL, GENERATION + 1, served_s=59) == 2
    assert backoff.exited(MODEL, GENERATION + 1, served_s=60) == 1  # it served a while
    backoff.forget(MODEL)  # unloaded
    assert backoff.due(MODEL, GENERATION + 1)
    assert backoff.exited(MODEL, GENERATION + 1) == 1


@pytest.mark.parametrize(
    ("exit_code", "output", "refused"),
    [
        (1, f"loading\n{ERROR_PREFIX}sim: latency_a_us / latency_b_us must be numbers\n", True),
        (2, f"{ERROR_PREFIX}worker.model_config_json: Invalid JSON\n", True),
        (
            EXIT_RETRIABLE,
            f"{ERROR_PREFIX}Kafka did not answer at 127.0.0.1:9092: timed out\n",
            False,
        ),
        (
            EXIT_RETRIABLE,
            f"{ERROR_PREFIX}Kafka at 127.0.0.1:9092 failed: NotControllerError\n",
            False,
        ),
        (EXIT_RETRIABLE, f"{ERROR_PREFIX}Redis did not answer at 127.0.0.1:6379: refused\n", False),
        (EXIT_RETRIABLE, f"{ERROR_PREFIX}Redis at 127.0.0.1:6379 failed: LOADING\n", False),
        (
            EXIT_RETRIABLE,
            f"{ERROR_PREFIX}cannot create topic plaza.infer.sim: Kafka error 7 \n",
            False,
        ),
        (-9, "INFO serving\n", False),  # killed
        (1, "Traceback (most recent call last):\nMemoryError\n", False),  # crashed
        (-15, "", False),
        (EXIT_RETRIABLE, f"{ERROR_PREFIX}a message that names no service\n", False),
    ],
)
def test_only_the_error_line_of_a_refused_model_gives_its_generation_up(
    exit_code: int, output: str, refused: bool
) -> None:
    failure = start_failure(exit_code, output)
    assert failure.refused is refused
    if output.strip().splitlines()[-1:] and ERROR_PREFIX in output:
        assert failure.reason == output.strip().splitlines()[-1].removeprefix(ERROR_PREFIX)
    else:
        assert f"code {exit_code}" in failure.reason


@pytest.fixture
def supervisor(tmp_path: Path) -> ModelSupervisor:
    """A supervisor on addresses nothing listens on: the steps tested here never connect."""
    (tmp_path / "repository").mkdir()
    deployment = Deployment("127.0.0.1:1", "redis://127.0.0.1:1/0", tmp_path / "repository")
    group = ProcessGroup(tmp_path / "logs")
    return ModelSupervisor(deployment, deployment.repository, group, clock=ManualClock())


def clock_of(supervisor: ModelSupervisor) -> ManualClock:
    clock = supervisor._clock
    assert isinstance(clock, ManualClock)
    return clock


async def test_a_serving_worker_that_exits_is_started_again_after_the_backoff(
    supervisor: ModelSupervisor, tmp_path: Path
) -> None:
    clock = clock_of(supervisor)
    desired = DesiredModel(MODEL, True, GENERATION)
    for served_s, delay in [(5.0, 1.0), (5.0, 2.0), (5.0, 4.0), (3600.0, 1.0)]:
        worker = FakeWorker(tmp_path / "w.log", -9)
        supervisor.running[MODEL] = _Running(GENERATION, [worker], since=clock.now)  # type: ignore[list-item]
        clock.now += served_s
        await supervisor._reap(MODEL)
        assert MODEL not in supervisor.running
        assert not supervisor._may_start(MODEL, desired)
        clock.now += delay - 0.1
        assert not supervisor._may_start(MODEL, desired)
        clock.now += 0.1
        assert supervisor._may_start(MODEL, desired)


async def test_a_worker_stopped_on_purpose_is_not_restarted(
    supervisor: ModelSupervisor, tmp_path: Path
) -> None:
    worker = FakeWorker(tmp_path / "w.log", 0, crashed=False)
    supervisor.running[MODEL] = _Running(GENERATION, [worker], since=0.0)  # type: ignore[list-item]
    await supervisor._reap(MODEL)
    assert MODEL in supervisor.running


REFUSAL = f"{ERROR_PREFIX}sim: latency_a_us / latency_b_us must be numbers\n"


@pytest.mark.parametrize(
    ("earlier", "output", "exit_code"),
    [
        ("", f"{ERROR_PREFIX}Kafka did not answer at 127.0.0.1:1: timed out\n", EXIT_RETRIABLE),
        (REFUSAL, "", -9),  # killed before it printed: an earlier run's refusal is not its
    ],
)
async def test_a_start_that_failed_on_kafka_or_was_killed_is_tried_again(
    supervisor: ModelSupervisor, tmp_path: Path, earlier: str, output: str, exit_code: int
) -> None:
    clock = clock_of(supervisor)
    desired = DesiredModel(MODEL, True, GENERATION)
    log_file = tmp_path / "w.log"
    log_file.write_text(earlier + output)
    worker = FakeWorker(log_file, exit_code)
    item = _Starting(desired, worker, since=clock.now, log_from=len(earlier))  # type: ignore[arg-type]
    supervisor.starting[MODEL] = item
    await supervisor._settle(MODEL, desired)  # a refusal would write to Redis: none here
    assert MODEL not in supervisor.starting
    assert not supervisor._may_start(MODEL, desired)  # backing off, not given up
    clock.now += 1.0
    assert supervisor._may_start(MODEL, desired)
