"""Malformed settings, as flags or environment variables, are a usage error: one line on
stderr naming the setting and exit status 2, never a traceback (nothing is started)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from plaza.cli.main import main
from plaza.settings import RedisSettings


def _only_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "--model", "identity", "--redis.url", "notaurl"],
        ["gateway", "--redis.url", "localhost:6379"],
    ],
)
def test_a_redis_url_flag_without_a_scheme_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    line = _only_line(capsys)
    assert line.startswith(f"plaza {argv[0]}: error: redis.url: ")
    assert "redis://" in line


def test_a_redis_url_variable_without_a_scheme_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PLAZA_REDIS__URL", "http://127.0.0.1:6379")
    assert main(["worker", "--model", "identity"]) == 2
    assert _only_line(capsys).startswith("plaza worker: error: redis.url: ")


def test_the_redis_url_is_not_echoed_back() -> None:
    with pytest.raises(ValidationError) as caught:
        RedisSettings(url="redis:/user:s3cret@host")
    assert "s3cret" not in str(caught.value.errors()[0]["msg"])


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "rediss://h:6380", "unix:///tmp/r.sock", "REDIS://h"]
)
def test_the_schemes_redis_py_connects_with_are_accepted(url: str) -> None:
    assert RedisSettings(url=url).url == url


def test_a_section_flag_that_is_not_json_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["worker", "--model", "identity", "--kafka", "{bad"]) == 2
    line = _only_line(capsys)
    assert line.startswith("plaza worker: error: ")
    assert '"kafka"' in line


def test_a_section_variable_that_is_not_json_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PLAZA_KAFKA", "{bad")
    assert main(["gateway"]) == 2
    line = _only_line(capsys)
    assert line.startswith("plaza gateway: error: ")
    assert '"kafka"' in line
