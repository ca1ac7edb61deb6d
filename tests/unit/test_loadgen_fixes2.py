"""loadgen and simulator defects a review reproduced: a bounded queue in the simulator, an
instance_group count simulated as one worker, ``bench --list``, a target that does not
start, unchecked ``--batch-size``, and NaN in the reports' JSON."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from plaza.batching import BatchingPolicy
from plaza.loadgen import report_json
from plaza.loadgen.arrivals import ArrivalProcess
from plaza.loadgen.bench import runner
from plaza.loadgen.bench.cases import BENCHMARKS
from plaza.loadgen.cli import sim_configs, simulate_parser
from plaza.loadgen.latency import LinearLatency
from plaza.loadgen.measure import Load, WindowConfig
from plaza.loadgen.simulator import SimConfig, simulate
from plaza.loadgen.sweep import SweepError, run_sweep, write_reports
from plaza.loadgen.targets import KafkaTarget, Outcome, StatsSnapshot
from plaza.modelconfig import QueuePolicy
from plaza.settings import PlazaSettings
from tests.support import run_cli

ROOT = Path(__file__).resolve().parents[2]
SIMULATED = (ROOT / "model_repository" / "simulated" / "config.pbtxt").read_text()
ONE_WINDOW = WindowConfig(window_s=0.05, warmup_s=0.02, stable_count=1, max_windows=1, drain_s=5)


def repository(tmp_path: Path, name: str, *edits: tuple[str, str]) -> Path:
    """A repository holding a copy of the sample ``simulated`` model, edited, as ``name``."""
    text = SIMULATED.replace('name: "simulated"', f'name: "{name}"')
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    (tmp_path / "repo" / name / "1").mkdir(parents=True)
    (tmp_path / "repo" / name / "config.pbtxt").write_text(text)
    return tmp_path / "repo"


def never_nan(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


# -- 1. a level's max_queue_size in the simulator ------------------------------------------------


def test_the_simulator_keeps_a_full_level_in_kafka_as_a_worker_does() -> None:
    policy = BatchingPolicy(
        max_batch_size=16,
        max_queue_delay_us=2000,
        default_queue_policy=QueuePolicy(max_queue_size=8),
    )
    cfg = SimConfig(
        policy=policy,
        latency=LinearLatency(a_us=1000, b_us=15000),
        arrivals=ArrivalProcess(500, "constant"),
        duration_s=3.0,
        warmup_s=1.0,
    )
    res = simulate(cfg)  # a bounded batcher would raise QueueFull at the 9th request
    assert res.completed > 0 and res.expired == 0 and res.unfinished == 0
    assert max(res.batch_sizes) <= 8  # the worker never held more than the level's 8
    assert res.depth_max > 8  # the overload's backlog waited in Kafka instead


def test_plaza_simulate_runs_a_model_with_a_bounded_queue(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    edit = ("max_queue_delay_microseconds: 2000", "max_queue_delay_microseconds: 2000\n"
            "  default_queue_policy { max_queue_size: 8 }")  # fmt: skip
    repo = repository(tmp_path, "simq", edit)
    flags = ["--rate", "500", "--duration-s", "2", "--warmup-s", "1"]
    rc, stdout, err = run_cli(
        capsys, "simulate", "--model", "simq", "--repository", str(repo), *flags
    )
    assert rc == 0, err
    assert "unfinished 0" in stdout


# -- 2. an instance_group count is one worker ----------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "instances", "routing"),
    [
        ([], 2, "shared"),  # the model's count: one worker, one batcher feeding both
        (["--instances", "2"], 2, "partitioned"),  # given: worker processes
        (["--instances", "3", "--routing", "shared"], 3, "shared"),
        (["--routing", "partitioned"], 2, "partitioned"),
    ],
)
def test_the_instance_count_of_a_model_is_simulated_as_one_batcher(
    tmp_path: Path, flags: list[str], instances: int, routing: str
) -> None:
    repo = repository(tmp_path, "simi", ("count: 1", "count: 2"))
    args = simulate_parser().parse_args(["--model", "simi", "--repository", str(repo), *flags])
    (cfg,) = sim_configs(args)
    assert (cfg.instances, cfg.routing) == (instances, routing)


def test_without_a_model_the_instances_flag_keeps_its_partitioned_default() -> None:
    args = simulate_parser().parse_args(["--latency-a-us", "10", "--instances", "2"])
    (cfg,) = sim_configs(args)
    assert (cfg.instances, cfg.routing) == (2, "partitioned")


# -- 3. bench --list ---------------------------------------------------------------------------


def test_bench_list_names_every_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    assert runner.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(BENCHMARKS)
    assert all(len(line.split()) > 1 for line in lines)
    assert "(no description)" not in "\n".join(lines)  # every case has its docstring


def test_a_benchmark_without_a_docstring_has_no_description() -> None:
    async def undocumented() -> None:
        pass

    assert runner.describe(undocumented) == "(no description)"


# -- 4. a target that does not start -------------------------------------------------------------


class StartTarget:
    """A target whose start fails (``fail``), recording whether it was stopped."""

    def __init__(self, label: str, fail: bool = False) -> None:
        self.label, self.fail, self.stopped = label, fail, False

    async def start(self) -> None:
        if self.fail:
            raise ConnectionRefusedError("nothing listens")

    async def send(self) -> Outcome:
        return Outcome(True)

    async def stats(self) -> StatsSnapshot | None:
        return None

    async def stop(self) -> None:
        self.stopped = True


async def test_a_target_that_does_not_start_stops_those_started_before_it() -> None:
    first, second = StartTarget("first"), StartTarget("second", fail=True)
    with pytest.raises(SweepError) as caught:
        await run_sweep([first, second], [Load("concurrency", 1)], ONE_WINDOW)
    assert caught.value.label == "second" and not caught.value.started
    assert caught.value.points == [] and "nothing listens" in str(caught.value)
    assert first.stopped and not second.stopped


def test_plaza_loadgen_with_kafka_unreachable_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    closed = ["--bootstrap-servers", "127.0.0.1:1", "--redis-url", "redis://127.0.0.1:1/0"]
    repo = str(repository(tmp_path, "sim"))
    window = ["--window-s", "0.05", "--warmup-s", "0", "--max-windows", "1"]
    argv = ["loadgen", "-m", "sim", "--repository", repo, "--target", "kafka", *closed]
    out = tmp_path / "run"
    argv += [*window, "--no-progress", "--no-plot", "--loop", "asyncio", "--out", str(out)]
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 75, err  # Unavailable: a failure that may pass (EXIT_RETRIABLE)
    assert "Traceback" not in err
    assert "error: kafka: " in err and "127.0.0.1:1" in err
    assert "127.0.0.1:1" in never_nan(out.with_suffix(".json").read_text())["meta"]["failed"]


# -- 5. --batch-size checked against the model ---------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "rows", "words"),
    [
        (("max_batch_size: 16", "max_batch_size: 16"), "17", "max_batch_size (16)"),
        (("max_batch_size: 16", "max_batch_size: 0"), "2", "does not batch"),
    ],
)
def test_plaza_loadgen_refuses_more_rows_than_the_model_takes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, edit: tuple[str, str], rows: str, words: str
) -> None:
    repo = str(repository(tmp_path, "sim", edit))
    url = "http://127.0.0.1:9"  # nothing listens: a run would end otherwise (exit 1, a table)
    argv = ["loadgen", "-m", "sim", "--repository", repo, "--url", url, "--no-progress"]
    rc, stdout, err = run_cli(capsys, *argv, "--batch-size", rows)
    assert rc == 2 and stdout == "" and err.startswith("error: ") and words in err


async def test_the_kafka_target_keeps_an_errors_message_with_its_code() -> None:
    error = SimpleNamespace(code="invalid_input", message="INPUT0: expected 16 values")

    class Client:
        async def infer(self, *args: Any, **kwargs: Any) -> Any:
            return SimpleNamespace(error=error, timing_us={}, worker="w1")

    target = KafkaTarget(PlazaSettings(), "sim", [{}])
    target._client = Client()
    outcome = await target.send()
    assert outcome.error == "invalid_input: INPUT0: expected 16 values"


# -- 6. strict JSON in every report ----------------------------------------------------------


def test_report_json_writes_null_for_what_was_not_measured() -> None:
    doc = {"a": float("nan"), "b": [1.5, float("inf"), (float("-inf"), 2)], "c": "NaN"}
    assert never_nan(report_json.dumps(doc)) == {"a": None, "b": [1.5, None, [None, 2]], "c": "NaN"}


async def test_a_point_with_no_successful_request_is_written_as_json(tmp_path: Path) -> None:
    class Failing(StartTarget):
        async def send(self) -> Outcome:
            await asyncio.sleep(0.001)  # a request's round trip: the load yields
            return Outcome(False, error="unavailable: no worker")

    points = await run_sweep([Failing("fails")], [Load("concurrency", 1)], ONE_WINDOW)
    assert points[0].completed == 0
    paths = write_reports(points, tmp_path / "run", {"model": "fake"}, plot=False)
    (point,) = never_nan(paths[1].read_text())["points"]
    assert point["latency"]["p50_ms"] is None


def test_a_truncated_simulation_is_written_as_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "sim"
    flags = ["--rate", "1000", "--duration-s", "2", "--warmup-s", "1", "--max-events", "500"]
    argv = ["simulate", "--latency-a-us", "10", *flags, "--out", str(out), "--no-plot"]
    rc, _, _ = run_cli(capsys, *argv)
    assert rc == 1  # truncated
    (run,) = never_nan(out.with_suffix(".json").read_text())["runs"]
    assert run["truncated"] and run["throughput"] is None
