"""Measurement windows and sweeps on an in-process fake target (no server, no timing
assertions: only counts, bounds and report files)."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path

import pytest

from plaza.loadgen.measure import Load, WindowConfig, measure
from plaza.loadgen.sweep import run_sweep, write_reports
from plaza.loadgen.targets import Outcome, StatsSnapshot

FAST = WindowConfig(window_s=0.05, warmup_s=0.02, stable_count=2, max_windows=3, drain_s=2)


class FakeTarget:
    """Answers after ``delay_s``; every ``fail_every``-th request fails."""

    def __init__(self, delay_s: float = 0.002, fail_every: int = 0, label: str = "fake") -> None:
        self.label = label
        self.delay_s = delay_s
        self.fail_every = fail_every
        self.sent = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def send(self) -> Outcome:
        self.sent += 1
        n = self.sent
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        if self.fail_every and n % self.fail_every == 0:
            return Outcome(False, error="boom")
        timing = {"queue": 10, "compute_input": 1, "compute_infer": 100, "compute_output": 1}
        return Outcome(True, timing, worker="w1")

    async def stats(self) -> StatsSnapshot | None:
        return None

    async def stop(self) -> None:
        self.stopped = True


async def test_concurrency_load_keeps_n_requests_in_flight() -> None:
    target = FakeTarget()
    point = await measure(target, Load("concurrency", 4), FAST)
    assert 1 <= len(point.windows) <= FAST.max_windows
    assert target.max_in_flight == 4
    assert target.in_flight == 0  # drained: nothing left running
    assert point.completed > 0 and point.errors == 0
    assert point.server is not None and point.server.compute_infer_us == 100
    assert point.latency.count == point.completed


async def test_errors_are_counted_not_timed() -> None:
    point = await measure(FakeTarget(fail_every=2), Load("concurrency", 2), FAST)
    assert point.errors > 0 and point.error_examples == ["boom"]
    assert point.latency.count == point.completed


async def test_rate_load_is_bounded_by_max_in_flight() -> None:
    target = FakeTarget(delay_s=0.05)
    cfg = WindowConfig(window_s=0.05, warmup_s=0.02, max_windows=2, max_in_flight=3, drain_s=2)
    point = await measure(target, Load("rate", 2000, "poisson", seed=1), cfg)
    assert target.max_in_flight <= 3
    assert point.late_sends > 0  # the bound held sends back
    assert len(point.windows) <= 2


async def test_sweep_interleaves_targets_and_writes_reports(tmp_path: Path) -> None:
    a, b = FakeTarget(label="a"), FakeTarget(label="b")
    loads = [Load("concurrency", 1), Load("concurrency", 2)]
    points = await run_sweep([a, b], loads, FAST)
    assert [(p.target, p.load.value) for p in points] == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert a.started and a.stopped and b.stopped
    try:
        import matplotlib  # noqa: F401

        plot = True
    except ImportError:
        plot = False
    paths = write_reports(points, tmp_path / "run", {"model": "fake"}, plot=plot)
    assert (tmp_path / "run.csv") in paths and (tmp_path / "run.json") in paths
    with (tmp_path / "run.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and {"p99_ms", "queue_us", "throughput"} <= rows[0].keys()
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["meta"]["model"] == "fake" and len(doc["points"]) == 4
    if plot:
        assert (tmp_path / "run.png").stat().st_size > 0


def test_plaza_simulate_command_writes_reports(tmp_path: Path) -> None:
    from plaza.cli.main import main

    out = tmp_path / "sim"
    rc = main(
        [
            "simulate",
            "--latency-a-us",
            "1000",
            "--latency-b-us",
            "10000",
            "--max-batch-size",
            "16",
            "--rate",
            "100:300:100",
            "--duration-s",
            "3",
            "--warmup-s",
            "1",
            "--out",
            str(out),
            "--no-plot",
        ]
    )
    assert rc == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    assert [r["load"] for r in doc["runs"]] == [f"rate {r}/s poisson" for r in (100, 200, 300)]


def test_plaza_simulate_reads_the_simulated_model(tmp_path: Path) -> None:
    from plaza.cli.main import main

    repo = tmp_path / "repo"
    (repo / "simulated").mkdir(parents=True)
    root = Path(__file__).resolve().parents[2]
    config = root / "model_repository" / "simulated" / "config.pbtxt"
    (repo / "simulated" / "config.pbtxt").write_text(config.read_text())
    rc = main(
        [
            "simulate",
            "--model",
            "simulated",
            "--repository",
            str(repo),
            "--concurrency",
            "1:16:x4",
            "--duration-s",
            "2",
            "--warmup-s",
            "0.5",
        ]
    )
    assert rc == 0


def test_plaza_loadgen_rejects_an_unknown_target(capsys: pytest.CaptureFixture[str]) -> None:
    from plaza.cli.main import main

    assert main(["loadgen", "-m", "mlp", "--target", "carrier-pigeon"]) == 2
    assert "unknown target" in capsys.readouterr().err


def test_a_stateful_models_load_is_one_row_sequences(capsys: pytest.CaptureFixture[str]) -> None:
    from plaza.cli.main import main

    assert main(["loadgen", "-m", "accumulate", "--target", "kafka", "--batch-size", "2"]) == 2
    assert "one row a request" in capsys.readouterr().err
    assert main(["loadgen", "-m", "accumulate", "--sequence-length", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err


def test_sequence_steps_run_each_sequence_in_order_one_request_at_a_time() -> None:
    from plaza.loadgen.sequences import SequenceSteps

    steps = SequenceSteps(3, seed=1)
    a, pa = steps.take()
    b, pb = steps.take()  # a is in flight: a second sequence
    assert pa["sequence_id"] != pb["sequence_id"]
    assert (pa["sequence_start"], pa["sequence_end"]) == (True, False)
    steps.give_back(a, ok=True)
    again, p2 = steps.take()
    assert again is a and p2 == {**pa, "sequence_start": False}
    steps.give_back(a, ok=True)
    _, p3 = steps.take()
    assert (p3["sequence_id"], p3["sequence_end"]) == (pa["sequence_id"], True)
    steps.give_back(a, ok=True)  # its END: the slot starts a new sequence
    _, p4 = steps.take()
    assert p4["sequence_start"] and p4["sequence_id"] not in (pa["sequence_id"], pb["sequence_id"])
    steps.give_back(b, ok=False)  # a failure ends b's sequence too
    _, p5 = steps.take()
    assert p5["sequence_start"] and p5["sequence_id"] != pb["sequence_id"]
    assert steps.started == 4
