"""``plaza up --process-per-model``'s supervisor restarts a model's worker that exited, with
a hand-moved clock and fake processes (no services: nothing here reaches Kafka or Redis).

The back-off starts at 1 s, doubles up to 60 s, and starts afresh after a worker that served
a minute; a failed start is retried unless ``plaza worker``'s error line says it refused the
model (Kafka or Redis away is not the model's fault). After a refused reload, the generation
that served before is started again with the versions it served, and a failed start of it
is retried, never reported as a refusal.
"""

from __future__ import annotations

import json
import shutil
from collections import deque
from pathlib import Path

import pytest

from plaza.errors import EXIT_RETRIABLE
from plaza.model_control import DesiredModel, read_model
from plaza.repository import ModelRepository
from plaza.stack import Deployment, ProcessGroup, ServiceError
from plaza.stack import supervisor as supervisor_module
from plaza.stack.supervisor import (
    ERROR_PREFIX,
    RESTART_MAX_S,
    START_LIMIT_S,
    START_TIMEOUTS,
    ModelSupervisor,
    RestartBackoff,
    _Running,
    _Starting,
    start_failure,
)
from plaza.workers.backends.python_backend import LOAD_TIMEOUT_S
from tests.fakes import ManualClock

MODEL = "sim"
GENERATION = 7
SAMPLES = Path(__file__).resolve().parents[2] / "model_repository"
CONFIG_ENV = "PLAZA_WORKER__MODEL_CONFIG_JSON"
GENERATION_ENV = "PLAZA_WORKER__GENERATION"


class FakeWorker:
    """A worker process that has exited (``exit_code``), or runs (None): as
    ``ChildProcess`` reports it."""

    def __init__(self, log_file: Path, exit_code: int | None, *, crashed: bool = True) -> None:
        self.name = log_file.stem
        self.log_file = log_file
        self.exit_code = exit_code
        self.crashed = crashed and exit_code is not None
        self.alive = exit_code is None
        self.env: dict[str, str] = {}
        """The settings it was started with (a launched one's)."""
        self.serves = True
        """Once alive, its registry entry names its generation (``fake_launches``)."""

    def start(self) -> FakeWorker:
        return self

    def crash(self, exit_code: int) -> None:
        self.exit_code, self.crashed, self.alive = exit_code, True, False

    def terminate(self) -> None:
        if self.alive:
            self.exit_code, self.alive = -15, False
        self.crashed = False

    def wait(self, timeout: float = 0.0) -> bool:
        return True

    def tail(self, lines: int = 25) -> str:
        return f"--- {self.log_file}"


class FakeTable:
    """The model table's side the supervisor writes: refusals, and a table to read."""

    def __init__(self, *entries: DesiredModel) -> None:
        self.entries = {d.name: d for d in entries}
        self.failed: list[tuple[int, str]] = []

    async def read(self) -> dict[str, DesiredModel]:
        return dict(self.entries)

    async def fail(self, desired: DesiredModel, reason: str) -> bool:
        self.failed.append((desired.generation, reason))
        return True


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
        supervisor.running[MODEL] = _Running(desired, [worker], since=clock.now)  # type: ignore[list-item]
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
    desired = DesiredModel(MODEL, True, GENERATION)
    supervisor.running[MODEL] = _Running(desired, [worker], since=0.0)  # type: ignore[list-item]
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


def test_each_generation_backs_off_on_its_own_and_unwanted_ones_are_dropped() -> None:
    backoff = RestartBackoff(ManualClock())
    assert backoff.exited(MODEL, GENERATION + 1) == 1  # the new generation failed to start
    assert backoff.exited(MODEL, GENERATION + 1) == 2
    assert backoff.exited(MODEL, GENERATION, served_s=3600) == 1  # then the old one exited
    assert not backoff.due(MODEL, GENERATION + 1)  # the new one still waits its 2 s
    assert backoff.exited(MODEL, GENERATION + 1) == 4  # and keeps doubling
    backoff.keep(MODEL, {GENERATION})  # the new generation is no longer wanted
    assert backoff.due(MODEL, GENERATION + 1)
    assert not backoff.due(MODEL, GENERATION)


async def test_an_old_generations_exit_does_not_cut_a_new_ones_backoff_short(
    supervisor: ModelSupervisor, tmp_path: Path
) -> None:
    clock = clock_of(supervisor)
    new = DesiredModel(MODEL, True, GENERATION + 1)
    old = FakeWorker(tmp_path / "old.log", None)
    item = _Starting(DesiredModel(MODEL, True, GENERATION), old, since=clock.now)  # type: ignore[arg-type]
    supervisor.starting[MODEL] = item
    await supervisor._serving(MODEL, item)  # the old generation serves
    log_file = tmp_path / "new.log"
    log_file.write_text(f"{ERROR_PREFIX}Kafka did not answer at 127.0.0.1:1: timed out\n")
    failed = FakeWorker(log_file, EXIT_RETRIABLE)
    supervisor.starting[MODEL] = _Starting(new, failed, since=clock.now)  # type: ignore[arg-type]
    await supervisor._settle(MODEL, new)  # the new generation failed to start: 1 s
    clock.now += 0.5
    old.crash(-9)
    await supervisor._reap(MODEL)  # then the old generation's worker is reaped
    assert not supervisor._may_start(MODEL, new)
    clock.now += 0.5
    assert supervisor._may_start(MODEL, new)


async def test_the_old_generation_is_started_again_after_a_refused_reload_and_a_crash(
    supervisor: ModelSupervisor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = clock_of(supervisor)
    first = DesiredModel(MODEL, True, GENERATION)
    reload = DesiredModel(MODEL, True, GENERATION + 1, config='{"bad": 1}')
    table = FakeTable(reload)
    launched: list[tuple[DesiredModel, bool]] = []

    async def launch(name: str, desired: DesiredModel, *, relaunch: bool = False) -> None:
        launched.append((desired, relaunch))

    monkeypatch.setattr(supervisor, "_table", table)
    monkeypatch.setattr(supervisor, "_launch", launch)
    serving = FakeWorker(tmp_path / "first.log", None)
    item = _Starting(first, serving, since=clock.now)  # type: ignore[arg-type]
    supervisor.starting[MODEL] = item
    await supervisor._serving(MODEL, item)  # the first generation serves
    log_file = tmp_path / "reload.log"
    log_file.write_text(REFUSAL)
    refused = FakeWorker(log_file, 1)
    supervisor.starting[MODEL] = _Starting(reload, refused, since=clock.now)  # type: ignore[arg-type]
    await supervisor.reconcile()  # the reload is refused; the first generation serves on
    assert [g for g, _ in table.failed] == [reload.generation] and launched == []
    serving.crash(-9)
    await supervisor.reconcile()  # reaped: back-off
    assert MODEL not in supervisor.running and launched == []
    clock.now += 1.0
    await supervisor.reconcile()
    assert launched == [(first, True)]  # the generation the gateways serve after the refusal


def sim_repository(root: Path) -> Path:
    """``root`` holding ``sim`` (the simulated sample: no model file), version 1 only, its
    policy the default (the latest version)."""
    shutil.copytree(SAMPLES / "simulated", root / MODEL)
    config = root / MODEL / "config.pbtxt"
    config.write_text(config.read_text().replace('"simulated"', f'"{MODEL}"'))
    return root


def fake_launches(monkeypatch: pytest.MonkeyPatch, supervisor: ModelSupervisor) -> list[FakeWorker]:
    """The workers the supervisor launches from now on, fakes (in the order started); each
    serves once alive (its registry entry is not read)."""
    started: list[FakeWorker] = []

    def process(
        deployment: Deployment, model: str, log_dir: Path, *, name: str, env: dict[str, str]
    ) -> FakeWorker:
        log_dir.mkdir(parents=True, exist_ok=True)
        worker = FakeWorker(log_dir / f"{name}-{len(started)}.log", None)
        worker.env = dict(env)
        started.append(worker)
        return worker

    async def serves(name: str, item: _Starting) -> bool:
        worker = item.worker
        assert isinstance(worker, FakeWorker)
        return worker.alive and worker.serves

    monkeypatch.setattr(supervisor_module, "WorkerProcess", process)
    monkeypatch.setattr(supervisor, "_serves", serves)
    return started


def same_start(worker: FakeWorker, other: FakeWorker) -> bool:
    """Both were started with the same generation and config."""
    config = json.loads(worker.env[CONFIG_ENV]) == json.loads(other.env[CONFIG_ENV])
    return config and worker.env[GENERATION_ENV] == other.env[GENERATION_ENV]


def refuse(worker: FakeWorker) -> None:
    """``worker`` ends its start as ``plaza worker`` does when it refuses the model."""
    worker.log_file.write_text(f"{ERROR_PREFIX}sim/2/model.onnx: cannot load it\n")
    worker.crash(1)


async def refused_reload_then_a_kill(
    supervisor: ModelSupervisor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[FakeTable, list[FakeWorker]]:
    """``sim`` serves version 1; a reload after a version folder 2 was added is refused
    (its worker refuses the model), then the first generation's worker is killed, and the
    back-off passes: the supervisor starts that generation again."""
    clock = clock_of(supervisor)
    sim_repository(tmp_path / "repository")
    started = fake_launches(monkeypatch, supervisor)
    table = FakeTable(DesiredModel(MODEL, True, GENERATION))
    monkeypatch.setattr(supervisor, "_table", table)
    await supervisor.reconcile()  # the first generation's worker starts
    await supervisor.reconcile()  # and serves
    [first] = started
    assert first.env[CONFIG_ENV] == ""  # a start as loaded: the repository's config
    (tmp_path / "repository" / MODEL / "2").mkdir()  # its model file one the worker refuses
    table.entries[MODEL] = DesiredModel(MODEL, True, GENERATION + 1)  # the reload
    await supervisor.reconcile()
    [_, reloaded] = started
    assert reloaded.env[CONFIG_ENV] == "" and reloaded.env[GENERATION_ENV] == str(GENERATION + 1)
    refuse(reloaded)
    await supervisor.reconcile()  # the reload is refused: the first generation serves on
    assert [g for g, _ in table.failed] == [GENERATION + 1]
    assert supervisor.running[MODEL].generation == GENERATION
    first.crash(-9)
    await supervisor.reconcile()  # reaped: backing off
    clock.now += 1.0
    await supervisor.reconcile()
    assert len(started) == 3 and supervisor.starting[MODEL].desired.generation == GENERATION
    return table, started


async def test_the_old_generation_starts_again_with_the_versions_it_served(
    supervisor: ModelSupervisor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, started = await refused_reload_then_a_kill(supervisor, tmp_path, monkeypatch)
    again = started[-1]
    assert again.env[GENERATION_ENV] == str(GENERATION)
    config = json.loads(again.env[CONFIG_ENV])
    assert config["version_policy"] == {"specific": {"versions": [1]}}
    repo = ModelRepository(tmp_path / "repository")
    assert read_model(repo, MODEL).versions == (2,)  # the repository as it is now
    assert read_model(repo, MODEL, again.env[CONFIG_ENV]).versions == (1,)  # what it loads
    await supervisor.reconcile()
    assert supervisor.running[MODEL].workers == [again]  # type: ignore[comparison-overlap]
    again.crash(-9)  # killed once more: started again with the same versions
    await supervisor.reconcile()
    clock_of(supervisor).now += RESTART_MAX_S
    await supervisor.reconcile()
    assert started[-1] is not again and same_start(started[-1], again)


@pytest.mark.parametrize("how", ["refused", "too slow"])
async def test_a_failed_start_of_the_old_generation_is_retried_not_a_refusal(
    supervisor: ModelSupervisor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    table, started = await refused_reload_then_a_kill(supervisor, tmp_path, monkeypatch)
    clock = clock_of(supervisor)
    for attempt in range(START_TIMEOUTS + 1):
        again = started[-1]
        if how == "refused":
            refuse(again)
        else:
            again.serves = False  # never serves: stopped once over the start limit
            clock.now += START_LIMIT_S + 1.0
        await supervisor.reconcile()
        assert MODEL not in supervisor.starting and MODEL not in supervisor.running
        assert [g for g, _ in table.failed] == [GENERATION + 1]  # the reload's only
        assert not supervisor._may_start(MODEL, DesiredModel(MODEL, True, GENERATION))
        clock.now += RESTART_MAX_S
        await supervisor.reconcile()
        assert len(started) == 4 + attempt  # tried again after the back-off
        assert same_start(started[-1], again)


async def test_a_generation_too_slow_to_start_is_given_up_after_some_tries(
    supervisor: ModelSupervisor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert START_LIMIT_S > LOAD_TIMEOUT_S  # a Python model's initialize may take that long
    clock = clock_of(supervisor)
    desired = DesiredModel(MODEL, True, GENERATION)
    table = FakeTable(desired)

    async def serves(name: str, item: _Starting) -> bool:
        return False  # its registry entry never comes

    monkeypatch.setattr(supervisor, "_table", table)
    monkeypatch.setattr(supervisor, "_serves", serves)
    for attempt in range(1, START_TIMEOUTS + 1):
        assert supervisor._may_start(MODEL, desired)
        slow = FakeWorker(tmp_path / f"slow{attempt}.log", None)
        supervisor.starting[MODEL] = _Starting(desired, slow, since=clock.now)  # type: ignore[arg-type]
        clock.now += START_LIMIT_S
        await supervisor._settle(MODEL, desired)
        assert MODEL in supervisor.starting  # not over the limit yet
        clock.now += 1.0
        await supervisor._settle(MODEL, desired)
        assert MODEL not in supervisor.starting and not slow.alive
        assert not supervisor._may_start(MODEL, desired)
        if attempt < START_TIMEOUTS:
            assert table.failed == []  # tried again after the back-off
        clock.now += RESTART_MAX_S
    [(generation, reason)] = table.failed
    assert generation == GENERATION and f"within {START_LIMIT_S:g} s" in reason
    assert not supervisor._may_start(MODEL, desired)  # given up until the next load
    assert supervisor.exits == deque()  # stopped by the supervisor: asked to


async def test_check_names_the_workers_that_exited_unasked(
    supervisor: ModelSupervisor, tmp_path: Path
) -> None:
    supervisor.check()  # none yet
    desired = DesiredModel(MODEL, True, GENERATION)
    killed = FakeWorker(tmp_path / "killed.log", -9)
    supervisor.running[MODEL] = _Running(desired, [killed], since=0.0)  # type: ignore[list-item]
    await supervisor._reap(MODEL)
    with pytest.raises(ServiceError, match="killed exited unasked with code -9"):
        supervisor.check()
    supervisor.check(killed_ok=True)  # a test that kills a worker on purpose
    crashed = FakeWorker(tmp_path / "crashed.log", 1)
    supervisor.running[MODEL] = _Running(desired, [crashed], since=0.0)  # type: ignore[list-item]
    await supervisor._reap(MODEL)
    with pytest.raises(ServiceError, match="crashed exited unasked with code 1") as raised:
        supervisor.check(killed_ok=True)
    assert "killed" not in str(raised.value)
