"""Triton's logging extension, the pure parts of following the deployment's changes
(``plaza.log_settings``): a process's settings are its start settings with the stored
changes made since it started on top, and ``log_warnings`` / ``log_errors`` each drop their
own records (on loggers of the test's own, never the root logger)."""

from __future__ import annotations

import logging
import uuid

import orjson
import pytest

from plaza.log_settings import (
    LogFollower,
    LogSettings,
    PlazaFormatter,
    SeverityFilter,
    apply,
    effective,
)

STARTED_US = 1_000_000


def _change(value: object, at: int = STARTED_US + 1) -> str:
    return orjson.dumps({"at": at, "value": value}).decode()


def test_a_change_of_one_setting_leaves_the_others_as_the_process_started() -> None:
    debug = LogSettings.from_level("DEBUG")
    stored = {"log_format": _change("ISO8601")}
    merged = effective(debug, stored, STARTED_US)
    assert merged.log_verbose_level == 1 and merged.level == logging.DEBUG
    assert merged.log_format == "ISO8601"
    warning = effective(LogSettings.from_level("WARNING"), stored, STARTED_US)
    assert warning.level == logging.WARNING and warning.log_format == "ISO8601"


def test_changes_made_before_the_process_started_are_not_its() -> None:
    stored = {
        "log_verbose_level": _change(3, at=STARTED_US - 1),
        "log_format": _change("ISO8601", at=STARTED_US),
    }
    merged = effective(LogSettings.from_level("WARNING"), stored, STARTED_US)
    assert merged.level == logging.WARNING  # the old verbose level is not taken
    assert merged.log_format == "ISO8601"  # made as it started: taken


def test_a_stored_change_that_does_not_read_back_is_skipped_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stored = {
        "log_info": "not json",
        "log_errors": orjson.dumps({"value": False}).decode(),  # no time
        "log_level": _change("DEBUG"),  # unknown
        "log_verbose_level": _change("loud"),  # wrong type
        "log_format": _change("ISO8601"),
    }
    merged = effective(LogSettings(), stored, STARTED_US)
    assert merged == LogSettings(log_format="ISO8601")
    assert caplog.text.count("log setting not applied") == 4


class _Lines(logging.Handler):
    """Keeps the level of each record it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.levelname)


def _logger() -> tuple[logging.Logger, _Lines, _Lines]:
    """A logger with Plaza's handler and another one (not Plaza's: left alone)."""
    logger = logging.getLogger(f"plaza-test-{uuid.uuid4().hex}")
    logger.propagate = False
    ours, theirs = _Lines(), _Lines()
    ours.setFormatter(PlazaFormatter())
    logger.addHandler(ours)
    logger.addHandler(theirs)
    return logger, ours, theirs


def _log_each_level(logger: logging.Logger) -> None:
    for level in (logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL):
        logger.log(level, "x")


@pytest.mark.parametrize(
    ("changes", "kept"),
    [
        ({"log_errors": False}, ["INFO", "WARNING", "CRITICAL"]),
        ({"log_warnings": False}, ["INFO", "ERROR", "CRITICAL"]),
        ({"log_info": False, "log_errors": False}, ["WARNING", "CRITICAL"]),
        ({}, ["INFO", "WARNING", "ERROR", "CRITICAL"]),
    ],
)
def test_warnings_and_errors_are_dropped_each_by_its_own_flag(
    changes: dict[str, object], kept: list[str]
) -> None:
    logger, ours, theirs = _logger()
    apply(LogSettings().changed(changes), logger)
    _log_each_level(logger)
    assert ours.lines == kept
    assert not theirs.filters  # a handler Plaza did not install is left as it is


def test_the_filter_follows_later_changes() -> None:
    logger, ours, _ = _logger()
    apply(LogSettings().changed({"log_errors": False}), logger)
    apply(LogSettings(), logger)
    _log_each_level(logger)
    assert ours.lines == ["INFO", "WARNING", "ERROR", "CRITICAL"]
    assert len([f for f in ours.filters if isinstance(f, SeverityFilter)]) == 1


def test_a_follower_applies_the_stored_changes_on_its_start_settings() -> None:
    logger, _, _ = _logger()
    follower = LogFollower(LogSettings.from_level("DEBUG"), logger)
    follower.started_us = STARTED_US
    assert follower.follow({b"log_format": _change("ISO8601").encode()})
    assert follower.current == LogSettings.from_level("DEBUG").changed({"log_format": "ISO8601"})
    assert logger.level == logging.DEBUG
    assert not follower.follow({"log_format": _change("ISO8601")})  # nothing new
    old = {"log_verbose_level": _change(0, at=STARTED_US - 5)}
    assert follower.follow({**old, "log_format": _change("default")})
    assert follower.current == LogSettings.from_level("DEBUG")
