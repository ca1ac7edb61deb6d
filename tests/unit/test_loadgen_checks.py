"""The load tools refuse what makes no sense before running, say when a run was cut short,
and keep what they measured: simulate, loadgen (sweeps, rate mode), profile, and the
streaming bench's reader. Fakes only (no server); no timing assertions."""

from __future__ import annotations

import asyncio
import csv
import json
import math
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from plaza.batching import BatchingPolicy
from plaza.client import make_request
from plaza.contract import InferRequest, InferResult
from plaza.loadgen.arrivals import ArrivalProcess
from plaza.loadgen.bench.streaming import publish_and_read
from plaza.loadgen.latency import LinearLatency
from plaza.loadgen.measure import Load, WindowConfig, measure
from plaza.loadgen.profiler import CurvePoint, checked_sizes, profile_model, recommend
from plaza.loadgen.simulator import SimConfig, Simulator, simulate
from plaza.loadgen.sweep import SweepError, format_table, parse_range, run_sweep, write_reports
from plaza.loadgen.targets import Outcome, StatsSnapshot, Target
from tests.support import run_cli

ROOT = Path(__file__).resolve().parents[2]
POLICY = BatchingPolicy(max_batch_size=32)
FAST = LinearLatency(a_us=10, b_us=100)
ONE_WINDOW = WindowConfig(window_s=0.05, warmup_s=0.02, stable_count=1, max_windows=1, drain_s=5)


def sim_cli(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    return run_cli(capsys, "simulate", "--latency-a-us", "10", "--latency-b-us", "100", *flags)


# -- plaza simulate ---------------------------------------------------------------------------


def test_a_run_stopped_by_the_event_limit_says_so_and_gives_no_rates() -> None:
    arrivals = ArrivalProcess(20_000, "constant")
    res = simulate(SimConfig(POLICY, FAST, arrivals=arrivals, duration_s=10, max_events=20_000))
    assert res.truncated and res.unfinished > 0 and res.simulated_s < 10
    assert math.isnan(res.throughput) and all(math.isnan(u) for u in res.utilization)
    assert res.as_dict()["truncated"] is True
    whole = simulate(SimConfig(POLICY, FAST, arrivals=arrivals, duration_s=2))
    assert not whole.truncated and whole.unfinished == 0 and whole.throughput > 0


class CountedArrivals(ArrivalProcess):
    """Constant arrivals that count how many of them were drawn."""

    drawn = 0

    def times(self, until_s: float, limit: int | None = None) -> Iterator[float]:
        for t in ArrivalProcess.times(self, until_s, limit):
            CountedArrivals.drawn += 1
            yield t


def test_arrivals_are_drawn_as_they_come_so_the_event_limit_bounds_memory() -> None:
    arrivals = CountedArrivals(100_000, "constant")  # 100 000 arrivals asked for
    CountedArrivals.drawn = 0
    sim = Simulator(
        SimConfig(POLICY, FAST, arrivals=arrivals, duration_s=1, warmup_s=0, max_events=10)
    )
    assert sim.run().truncated
    assert CountedArrivals.drawn <= 11  # those the ten events reached, and the next one


def test_plaza_simulate_warns_prints_unfinished_and_fails_when_truncated(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "sim"
    load = ["--rate", "20000", "--distribution", "constant", "--duration-s", "10"]
    rc, stdout, err = sim_cli(
        capsys, *load, "--max-events", "20000", "--out", str(out), "--no-plot"
    )
    assert rc == 1
    point = stdout.splitlines()[1]
    assert "truncated" in point and "/s " not in point.split("p50")[0].split("constant")[1]
    assert "unfinished" in stdout
    assert err.startswith("warning:") and "event limit" in err
    assert json.loads(out.with_suffix(".json").read_text())["runs"][0]["truncated"] is True
    rc, stdout, _ = sim_cli(capsys, "--rate", "100", "--duration-s", "2", "--warmup-s", "1")
    assert rc == 0 and "unfinished 0" in stdout


@pytest.mark.parametrize(
    "flags",
    [
        ["--overhead-ms", "-1"],
        ["--rows", "0"],
        ["--rows", "64"],  # max_batch_size 32
        ["--max-batch-size", "0"],
        ["--max-queue-delay-us", "-1"],
        ["--preferred-batch-sizes", "64"],
        ["--instances", "0"],
        ["--partitions", "0"],
        ["--latency-b-us", "-5"],
        ["--rate", "50,0"],
        ["--concurrency", "0"],
        ["--max-events", "0"],
        ["--seed", "-1"],
        ["--duration-s", "inf"],
    ],
)
def test_plaza_simulate_refuses_values_that_make_no_sense(
    capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    rc, stdout, err = sim_cli(capsys, "--duration-s", "2", "--warmup-s", "1", *flags)
    assert rc == 2 and stdout == ""
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_rows_per_request_fit_in_one_batch() -> None:
    arrivals = ArrivalProcess(100)
    for rows in (0, 33):
        with pytest.raises(ValueError, match="rows per request"):
            SimConfig(POLICY, FAST, arrivals=arrivals, rows_per_request=rows)
    res = simulate(SimConfig(POLICY, FAST, arrivals=arrivals, rows_per_request=32, duration_s=2))
    assert set(res.batch_sizes) == {32}


# -- plaza loadgen: checked before anything runs -----------------------------------------------


@pytest.mark.parametrize("text", ["50,0", "0", "-2", "1,-1", "nan", "1:inf:x2", "1:1e9", "x"])
def test_parse_range_refuses_every_value_that_is_not_a_positive_number(text: str) -> None:
    with pytest.raises(ValueError, match="bad range"):
        parse_range(text)


@pytest.mark.parametrize(
    "changes",
    [
        {"max_windows": 0},
        {"stable_count": 0},
        {"max_in_flight": 0},
        {"window_s": 0},
        {"warmup_s": -1},
        {"tolerance": -0.1},
        {"drain_s": -1},
    ],
)
def test_window_config_refuses_values_that_would_fail_after_measuring(
    changes: dict[str, Any],
) -> None:
    with pytest.raises(ValueError, match="must be"):
        WindowConfig(**changes)


@pytest.mark.parametrize(
    ("mode", "value"), [("rate", 0), ("rate", -5), ("concurrency", 0), ("concurrency", 1.5)]
)
def test_a_load_is_a_positive_rate_or_a_whole_number_of_clients(mode: str, value: float) -> None:
    with pytest.raises(ValueError):
        Load(mode, value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "flags",
    [
        ["--max-windows", "0"],
        ["--stable-windows", "0"],
        ["--max-in-flight", "0", "--request-rate", "100"],
        ["--request-rate", "50,0"],
        ["--concurrency", "0"],
        ["--concurrency", "1.5"],
        ["--window-s", "0"],
        ["--batch-size", "0"],
        ["--timeout-s", "0"],
    ],
)
def test_plaza_loadgen_refuses_bad_flags_before_running(
    capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    # nothing listens at this URL: a run would end otherwise (exit status 1, a table)
    url = "http://127.0.0.1:9"
    rc, stdout, err = run_cli(capsys, "loadgen", "-m", "mlp", "--url", url, "--no-progress", *flags)
    assert rc == 2 and stdout == "" and err.startswith("error: ")


# -- sweeps keep what they measured ------------------------------------------------------------


class FakeTarget:
    """Answers after ``delay_s``, one request at a time when ``serial``; its statistics
    fail from the ``fail_on_stats``-th read on (0: never), as a target that went away."""

    def __init__(self, delay_s: float = 0.001, serial: bool = False, fail_on_stats: int = 0):
        self.label = "fake"
        self.delay_s = delay_s
        self.lock = asyncio.Lock() if serial else None
        self.fail_on_stats = fail_on_stats
        self.stats_reads = 0
        self.stopped = False

    async def start(self) -> None:
        pass

    async def send(self) -> Outcome:
        if self.lock is None:
            await asyncio.sleep(self.delay_s)
        else:
            async with self.lock:
                await asyncio.sleep(self.delay_s)
        return Outcome(True)

    async def stats(self) -> StatsSnapshot | None:
        self.stats_reads += 1
        if self.fail_on_stats and self.stats_reads >= self.fail_on_stats:
            raise ConnectionError("the target went away")
        return None

    async def stop(self) -> None:
        self.stopped = True


# one window a point: two statistics reads (start, end), so the 3rd read is the 2nd point's
LOADS = [Load("concurrency", 1), Load("concurrency", 2), Load("concurrency", 4)]


async def test_a_failed_point_stops_the_sweep_keeping_the_points_before_it(
    tmp_path: Path,
) -> None:
    target = FakeTarget(fail_on_stats=3)
    with pytest.raises(SweepError) as caught:
        await run_sweep([target], LOADS, ONE_WINDOW)
    failure = caught.value
    assert [p.load.value for p in failure.points] == [1]
    assert "concurrency 2" in str(failure) and "went away" in str(failure)
    assert target.stopped
    paths = write_reports(failure.points, tmp_path / "run", {"model": "fake"}, plot=False)
    assert len(json.loads(paths[1].read_text())["points"]) == 1


def test_plaza_loadgen_writes_the_points_measured_before_a_failure(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def fake_target(*args: Any, **kwargs: Any) -> Target:
        return FakeTarget(fail_on_stats=3)

    monkeypatch.setattr("plaza.loadgen.cli.make_target", fake_target)
    out = tmp_path / "sweep"
    window = ["--window-s", "0.05", "--warmup-s", "0.02", "--max-windows", "1"]
    flags = [*window, "--stable-windows", "1", "--concurrency", "1,2,4", "--loop", "asyncio"]
    argv = ["loadgen", "-m", "mlp", *flags, "--out", str(out), "--no-plot", "--no-progress"]
    rc, stdout, err = run_cli(capsys, *argv)
    assert rc == 1 and "error: the sweep stopped at" in err and "concurrency 2" in err
    assert "concurrency 1" in stdout
    doc = json.loads(out.with_suffix(".json").read_text())
    assert [p["value"] for p in doc["points"]] == [1]
    assert "went away" in doc["meta"]["failed"]


# -- rate mode shows a schedule it could not keep ----------------------------------------------


async def test_rate_mode_reports_late_sends_and_the_send_rate_against_the_offered_rate(
    tmp_path: Path,
) -> None:
    # 20 ms a request, one at a time, one in flight: at most ~50 sends/s of the 1000 offered
    target = FakeTarget(delay_s=0.02, serial=True)
    cfg = WindowConfig(window_s=0.1, warmup_s=0.05, stable_count=1, max_windows=1, max_in_flight=1)
    point = await measure(target, Load("rate", 1000, "constant"), cfg)
    assert point.offered_rate == 1000
    assert 0 < point.send_rate < point.offered_rate / 2
    assert point.late_sends > 0
    table = format_table([point])
    assert "sent/s" in table.splitlines()[0] and "late" in table.splitlines()[0]
    row = table.splitlines()[-1]
    assert f"{point.send_rate:.1f}" in row and f" {point.late_sends} " in row
    write_reports([point], tmp_path / "rate", {"model": "fake"}, plot=False)
    with (tmp_path / "rate.csv").open() as f:
        (csv_row,) = list(csv.DictReader(f))
    assert {"late_sends", "send_rate", "offered_rate"} <= csv_row.keys()
    doc = json.loads((tmp_path / "rate.json").read_text())["points"][0]
    assert doc["late_sends"] == point.late_sends and doc["offered_rate"] == 1000


# -- plaza profile -----------------------------------------------------------------------------


def simulated_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "simulated").mkdir(parents=True)
    config = (ROOT / "model_repository" / "simulated" / "config.pbtxt").read_text()
    config = config.replace('"1000"', '"20"').replace('"15000"', '"200"')  # fast sleeps
    (repo / "simulated" / "config.pbtxt").write_text(config)
    return repo


def test_profiled_batch_sizes_are_within_max_batch_size() -> None:
    assert checked_sizes([4, 1, 4], 64) == [1, 4]
    assert checked_sizes(None, 8) == [1, 2, 4, 8]
    for bad in ([256], [0], [1, -4]):
        with pytest.raises(ValueError, match="max_batch_size"):
            checked_sizes(bad, 64)


def test_the_recommendation_never_exceeds_max_batch_size() -> None:
    # throughput keeps rising up to 256: the knee is past the model's max of 64
    curve = [
        CurvePoint(n, 1.0 + n / 1000, 1.0, 1.0, n / (1.0 + n / 1000) * 1e3, 5)
        for n in (1, 16, 64, 256)
    ]
    assert recommend(curve).preferred_batch_size == 256
    assert recommend(curve, max_batch_size=64).preferred_batch_size == 64


def test_profile_refuses_sizes_past_the_models_max_and_zero_rounds(tmp_path: Path) -> None:
    repo = simulated_repo(tmp_path)
    with pytest.raises(ValueError, match="max_batch_size"):
        profile_model(repo, "simulated", sizes=[256], device="cpu")
    with pytest.raises(ValueError, match="rounds"):
        profile_model(repo, "simulated", sizes=[1], device="cpu", rounds=0, window_s=0.01)


@pytest.mark.parametrize(
    "flags",
    [
        ["--batch-sizes", "0"],
        ["--batch-sizes", "1.5"],
        ["--batch-sizes", "1,256"],  # max_batch_size 16
        ["--rounds", "0"],
        ["--seq-len", "0"],
    ],
)
def test_plaza_profile_refuses_bad_flags(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str]
) -> None:
    repo = simulated_repo(tmp_path)
    out = tmp_path / "prof"
    argv = ["profile", "simulated", "--repository", str(repo), "--out", str(out), *flags]
    rc, _, err = run_cli(capsys, *argv, "--window-s", "0.01", "--device", "cpu")
    assert rc == 2 and "error: " in err
    assert not out.with_suffix(".json").exists()


# -- the streaming bench's reader --------------------------------------------------------------


class StreamClient:
    """A result stream: ``finals`` of the requests get a final response, then nothing more
    comes (a worker that died), each read waiting ``block_ms`` as Redis would."""

    def __init__(self, finals: int) -> None:
        self.finals = finals
        self.requests: Sequence[InferRequest] = ()

    async def publish_many(self, requests: Sequence[InferRequest]) -> None:
        self.requests = requests

    async def consume(
        self, stream: str, group: str, consumer: str, block_ms: int, count: int
    ) -> AsyncIterator[tuple[bytes, list[InferResult]]]:
        done = [InferResult(r.id, r.model, "1") for r in self.requests[: self.finals]]
        yield b"1-0", done
        while True:
            await asyncio.sleep(block_ms / 1000)
            yield b"1-1", []


def requests(n: int) -> list[InferRequest]:
    count = np.array([[1]], np.int32)
    return [make_request("tokens", {"COUNT": count}, reply_stream="s") for _ in range(n)]


async def test_publish_and_read_gives_up_at_its_deadline_naming_what_is_missing() -> None:
    reqs = requests(3)
    client = cast(Any, StreamClient(finals=2))
    with pytest.raises(RuntimeError, match="1 of 3") as caught:
        await asyncio.wait_for(publish_and_read(client, "s", reqs, timeout_s=0.2), 10)
    assert reqs[2].id in str(caught.value) and reqs[0].id not in str(caught.value)
    assert await publish_and_read(cast(Any, StreamClient(finals=3)), "s", reqs) == 3


async def test_publish_and_read_has_a_deadline_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from plaza.loadgen.bench import streaming

    monkeypatch.setattr(streaming, "READ_BASE_S", 0.1)
    monkeypatch.setattr(streaming, "READ_PER_REQUEST_S", 0.05)
    reqs = requests(2)
    with pytest.raises(RuntimeError, match=r"after 0\.2 s for 2 of 2"):
        await asyncio.wait_for(publish_and_read(cast(Any, StreamClient(finals=0)), "s", reqs), 10)
