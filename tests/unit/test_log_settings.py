"""Triton's logging extension, the settings themselves (``plaza.log_settings``): what a
change may hold, what the levels mean, and how a process follows the stored settings (on a
logger of the test's own, never the root logger)."""

from __future__ import annotations

import logging
import uuid

import pytest

from plaza.errors import InvalidInput
from plaza.log_settings import LogFollower, LogSettings, PlazaFormatter, apply


def test_the_start_level_and_what_each_setting_means() -> None:
    assert LogSettings.from_level("INFO") == LogSettings()
    assert LogSettings.from_level("DEBUG").level == logging.DEBUG
    assert LogSettings.from_level("WARNING").level == logging.WARNING
    assert LogSettings.from_level("ERROR").level == logging.ERROR
    quiet = LogSettings().changed({"log_info": False, "log_warnings": False})
    assert quiet.level == logging.ERROR
    assert quiet.changed({"log_errors": False}).level > logging.CRITICAL
    assert quiet.changed({"log_verbose_level": 2}).level == logging.DEBUG


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"log_level": "DEBUG"}, "unknown log setting"),
        ({"log_info": 1}, "must be true or false"),
        ({"log_verbose_level": True}, "must be an integer"),
        ({"log_verbose_level": -1}, ">= 0"),
        ({"log_verbose_level": 2**32}, "<= 4294967295"),  # gRPC's uint32_param
        ({"log_format": "json"}, "'default' or 'ISO8601'"),
        ({"log_file": "/tmp/x.log"}, "not supported"),
    ],
)
def test_bad_changes_are_refused(changes: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        LogSettings().changed(changes)


def test_a_null_value_leaves_its_setting_as_it_is() -> None:
    """As Triton: a null (tritonclient's None, over gRPC a setting with no value) is no
    change; an unknown name is refused all the same."""
    quiet = LogSettings().changed({"log_info": False, "log_format": "ISO8601"})
    nulls = dict.fromkeys(("log_info", "log_verbose_level", "log_file", "log_format"))
    assert quiet.changed(nulls) == quiet
    assert quiet.changed({"log_info": None, "log_errors": False}).log_info is False
    with pytest.raises(InvalidInput, match="unknown log setting"):
        quiet.changed({"log_level": None})


def test_the_verbose_level_takes_every_uint32() -> None:
    """gRPC's front answers it in a uint32_param: the largest one is taken, no more."""
    loudest = LogSettings().changed({"log_verbose_level": 2**32 - 1})
    assert LogSettings.from_json(loudest.to_json()).log_verbose_level == 2**32 - 1


def test_settings_round_trip_through_their_stored_form() -> None:
    settings = LogSettings().changed({"log_verbose_level": 3, "log_format": "ISO8601"})
    assert LogSettings.from_json(settings.to_json()) == settings
    with pytest.raises(InvalidInput):
        LogSettings.from_json(b"[1]")


def _logger() -> tuple[logging.Logger, logging.Handler, logging.Handler]:
    logger = logging.getLogger(f"plaza-test-{uuid.uuid4().hex}")
    ours, theirs = logging.StreamHandler(), logging.StreamHandler()
    ours.setFormatter(PlazaFormatter())
    plain = logging.Formatter("%(message)s")
    theirs.setFormatter(plain)
    logger.addHandler(ours)
    logger.addHandler(theirs)
    return logger, ours, theirs


def test_apply_sets_the_level_and_only_plazas_handlers() -> None:
    logger, ours, theirs = _logger()
    before = theirs.formatter
    apply(LogSettings().changed({"log_format": "ISO8601", "log_verbose_level": 1}), logger)
    assert logger.level == logging.DEBUG
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    record.created = 0.0
    assert ours.format(record).startswith("1970-01-01T00:00:00Z INFO x: hello")
    assert theirs.formatter is before


def test_a_follower_applies_each_new_stored_setting_once(caplog: pytest.LogCaptureFixture) -> None:
    logger, _, _ = _logger()
    follower = LogFollower(LogSettings(), logger)
    assert not follower.follow({})  # nothing stored: the process's own settings
    louder = {b"log_verbose_level": b'{"at": 1, "value": 1}'}
    assert follower.follow(louder) and logger.level == logging.DEBUG
    assert not follower.follow(louder)
    logger.setLevel(logging.WARNING)  # not re-applied: the stored settings did not change
    assert not follower.follow({"log_verbose_level": '{"at": 1, "value": 1}'})
    assert logger.level == logging.WARNING
    assert not follower.follow({**louder, b"log_info": b"not json"})
    assert "log setting not applied" in caplog.text
    assert follower.current.log_verbose_level == 1
