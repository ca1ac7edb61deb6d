"""loadgen defects a review reproduced: a ``--url`` without a scheme (every request failing
at once starved the event loop: no window ended, Ctrl-C did nothing, memory grew), an
``--out`` that could not be written found only after measuring, and a ``--redis-url`` taken
without validation. Fakes only (no server); no timing assertions."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from plaza.loadgen.cli import kafka_settings, loadgen_parser
from plaza.loadgen.measure import Load, WindowConfig, _Recorder, measure
from plaza.loadgen.targets import Outcome, StatsSnapshot, Target
from tests.support import run_cli

ROOT = Path(__file__).resolve().parents[2]
SHORT = WindowConfig(window_s=0.05, warmup_s=0.02, stable_count=2, max_windows=2, drain_s=2)
STARVED_AFTER = 10_000
"""Sends in a row without the event loop running anything else: a starved loop."""


class InstantFailure:
    """Fails every request without awaiting anything, as an HTTP client given a URL with
    no scheme does. It notices a starved loop (``STARVED_AFTER`` sends with no callback of
    its own run in between) and then raises, so a starving driver ends instead of hanging
    the test."""

    label = "instant"

    def __init__(self) -> None:
        self.sent = 0
        self.in_a_row = 0
        self.starved = False
        self.ticking = False
        self.busy = asyncio.Event()

    def _tick(self) -> None:
        self.ticking = False
        self.in_a_row = 0

    async def start(self) -> None:
        pass

    async def send(self) -> Outcome:
        self.sent += 1
        self.in_a_row += 1
        if self.sent >= 100:
            self.busy.set()
        if not self.ticking:
            self.ticking = True
            asyncio.get_running_loop().call_soon(self._tick)
        if self.in_a_row > STARVED_AFTER:
            self.starved = True
            raise RuntimeError("the event loop was starved")
        return Outcome(False, error="UnsupportedProtocol: no scheme")

    async def stats(self) -> StatsSnapshot | None:
        return None

    async def stop(self) -> None:
        pass


class Answers:
    """Answers every request at once, counting them (a run that should not start)."""

    label = "answers"

    def __init__(self) -> None:
        self.sent = 0
        self.settings: Any = None

    async def start(self) -> None:
        pass

    async def send(self) -> Outcome:
        self.sent += 1
        await asyncio.sleep(0.001)
        return Outcome(True)

    async def stats(self) -> StatsSnapshot | None:
        return None

    async def stop(self) -> None:
        pass


# -- 1. a URL without a scheme --------------------------------------------------------------


@pytest.mark.parametrize("url", ["localhost:18200", "127.0.0.1:8000", "ftp://h:1", "http://"])
def test_plaza_loadgen_refuses_a_url_that_is_not_http(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    rc, stdout, err = run_cli(capsys, "loadgen", "-m", "mlp", "--url", url, "--no-progress")
    assert rc == 2 and stdout == ""
    assert "argument --url" in err and "http:// or https://" in err


def test_http_and_https_urls_are_taken_as_given() -> None:
    for url in ("http://127.0.0.1:8000", "HTTPS://gateway.example/plaza"):
        assert loadgen_parser().parse_args(["-m", "mlp", "--url", url]).url == url


async def test_a_target_failing_at_once_does_not_starve_the_windows() -> None:
    target = InstantFailure()
    point = await measure(target, Load("concurrency", 2), SHORT)
    assert not target.starved
    assert 1 <= len(point.windows) <= SHORT.max_windows
    assert point.completed == 0 and point.errors > 0
    assert point.error_examples == ["UnsupportedProtocol: no scheme"]


async def test_a_run_against_a_target_failing_at_once_can_be_cancelled() -> None:
    target = InstantFailure()
    forever = WindowConfig(window_s=3600, warmup_s=3600, max_windows=10, drain_s=2)
    run = asyncio.create_task(measure(target, Load("concurrency", 4), forever))
    await target.busy.wait()  # reached only when the clients let the loop run
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert not target.starved


def test_failures_are_counted_not_kept_one_by_one() -> None:
    rec = _Recorder()
    for i in range(50_000):
        rec.add(0.0, Outcome(False, error=f"error {i % 20}"))
    rec.add(0.0, Outcome(True))
    assert rec.errors == 50_000 and len(rec.samples) == 1
    assert rec.error_examples == [f"error {i}" for i in range(5)]


# -- 2. an --out that cannot be written -----------------------------------------------------


def test_plaza_loadgen_checks_out_before_measuring(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    made: list[Answers] = []

    def fake_target(*args: Any, **kwargs: Any) -> Target:
        made.append(Answers())
        return made[-1]

    monkeypatch.setattr("plaza.loadgen.cli.make_target", fake_target)
    (tmp_path / "afile").touch()
    window = ["--window-s", "0.05", "--warmup-s", "0.02", "--max-windows", "1", "--loop", "asyncio"]
    out = tmp_path / "afile" / "l"
    argv = ["loadgen", "-m", "mlp", *window, "--out", str(out), "--no-plot", "--no-progress"]
    rc, stdout, err = run_cli(capsys, *argv)
    assert rc == 2 and stdout == ""
    assert err.startswith(f"error: --out {out}") and err.count("\n") == 1
    assert sum(t.sent for t in made) == 0


def test_plaza_profile_and_simulate_check_out_before_running(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "afile").touch()
    out = tmp_path / "afile" / "sub" / "p"
    repo = str(ROOT / "model_repository")
    profile = ["profile", "simulated", "--repository", repo, "--batch-sizes", "1"]
    rc, stdout, err = run_cli(
        capsys, *profile, "--rounds", "1", "--window-s", "0", "--out", str(out)
    )
    assert rc == 2 and stdout == "" and err.startswith(f"error: --out {out}")
    sim = ["simulate", "--latency-a-us", "10", "--rate", "100", "--duration-s", "0.5"]
    rc, stdout, err = run_cli(capsys, *sim, "--warmup-s", "0", "--no-plot", "--out", str(out))
    assert rc == 2 and stdout == "" and err.startswith(f"error: --out {out}")
    assert err.count("\n") == 1


# -- 3. --redis-url validated ---------------------------------------------------------------


def test_plaza_loadgen_refuses_a_redis_url_it_could_not_connect_with(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Answers] = []

    def fake_target(*args: Any, **kwargs: Any) -> Target:
        made.append(Answers())
        return made[-1]

    monkeypatch.setattr("plaza.loadgen.cli.make_target", fake_target)
    window = ["--window-s", "0.05", "--warmup-s", "0.02", "--max-windows", "1", "--loop", "asyncio"]
    argv = ["loadgen", "-m", "mlp", "--target", "kafka", *window, "--no-progress"]
    rc, stdout, err = run_cli(capsys, *argv, "--redis-url", "notaurl")
    assert rc == 2 and stdout == "" and made == []
    assert err.startswith("error: --redis-url: a Redis URL starts with") and err.count("\n") == 1


def test_kafka_settings_take_the_flags_given_over_the_environment() -> None:
    flags = ["-m", "mlp", "--redis-url", "rediss://cache:6380/1", "--topic-prefix", "t."]
    args = loadgen_parser().parse_args(flags)
    args.repository = Path("repo")
    settings = kafka_settings(args)
    assert settings.redis.url == "rediss://cache:6380/1" and settings.kafka.topic_prefix == "t."
    assert settings.repository == Path("repo")
