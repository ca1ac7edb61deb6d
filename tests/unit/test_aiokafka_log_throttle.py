"""The aiokafka log throttle: while Kafka is down a template logs once each period."""

from __future__ import annotations

import io
import logging

import pytest

from plaza.connections import RETRY_BACKOFF_MS, kafka_admin, kafka_consumer, kafka_producer
from plaza.log_settings import RepeatThrottle
from plaza.settings import KafkaSettings

UNABLE = "Unable connect to node with id %s: %s"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _record(
    msg: str, *args: object, name: str = "aiokafka.client", level: int = logging.ERROR
) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def _passed(throttle: RepeatThrottle, records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if throttle.filter(r)]


def test_first_of_a_template_passes_then_one_a_period_with_the_dropped_count() -> None:
    clock = Clock()
    throttle = RepeatThrottle(period_s=10.0, clock=clock)
    first = _passed(throttle, [_record(UNABLE, n, "refused") for n in range(500)])
    assert first == ["Unable connect to node with id 0: refused"]
    clock.now += 9.9
    assert _passed(throttle, [_record(UNABLE, 7, "refused")]) == []
    clock.now += 0.1
    later = _passed(throttle, [_record(UNABLE, 3, "refused") for _ in range(3)])
    assert later == [
        "Unable connect to node with id 3: refused (500 more like this in the last 10 s)"
    ]
    clock.now += 60.0
    quiet = ["Unable connect to node with id 1: x (2 more like this in the last 60 s)"]
    assert _passed(throttle, [_record(UNABLE, 1, "x")]) == quiet
    clock.now += 60.0  # nothing dropped since: no suffix
    assert _passed(throttle, [_record(UNABLE, 1, "x")]) == ["Unable connect to node with id 1: x"]


def test_templates_are_throttled_each_on_its_own() -> None:
    throttle = RepeatThrottle(clock=Clock())
    records = [_record(UNABLE, 1, "x"), _record("Unable to update metadata from %s", [1])] * 50
    assert _passed(throttle, records) == [
        "Unable connect to node with id 1: x",
        "Unable to update metadata from [1]",
    ]


@pytest.mark.parametrize(
    ("name", "level"),
    [
        ("plaza.worker", logging.ERROR),
        ("aiokafkax", logging.ERROR),
        ("aiokafka.conn", logging.INFO),
    ],
)
def test_other_loggers_and_low_severities_pass(name: str, level: int) -> None:
    throttle = RepeatThrottle(clock=Clock())
    records = [_record(UNABLE, 1, "x", name=name, level=level) for _ in range(20)]
    assert len(_passed(throttle, records)) == 20


def test_tracked_templates_are_bounded_least_recent_forgotten() -> None:
    throttle = RepeatThrottle(max_templates=4, clock=Clock())
    assert len(_passed(throttle, [_record(f"template {n}") for n in range(100)])) == 100
    assert len(throttle._seen) == 4
    assert _passed(throttle, [_record("template 99")]) == []  # still tracked
    assert _passed(throttle, [_record("template 0")]) == ["template 0"]  # forgotten


def test_configure_logging_throttles_aiokafka_children(monkeypatch: pytest.MonkeyPatch) -> None:
    from plaza import log_settings

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    log_settings.configure_logging("INFO")
    handler = root.handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    out = io.StringIO()
    monkeypatch.setattr(handler, "stream", out)
    for _ in range(50):
        logging.getLogger("aiokafka.consumer.fetcher").error("Failed fetch messages from %s", 1)
    assert out.getvalue().count("Failed fetch messages from 1") == 1


async def test_every_client_backs_off_between_retries() -> None:
    k = KafkaSettings(bootstrap_servers="127.0.0.1:1")
    assert RETRY_BACKOFF_MS >= 500
    assert kafka_producer(k).client._retry_backoff == RETRY_BACKOFF_MS / 1000
    assert kafka_consumer(k, "g")._client._retry_backoff == RETRY_BACKOFF_MS / 1000
    assert kafka_admin(k)._client._retry_backoff == RETRY_BACKOFF_MS / 1000
