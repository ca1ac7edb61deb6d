"""``tests.support.short_session``: the deployment a test that kills workers starts its
processes from, with a short consumer group session (and otherwise the same)."""

from __future__ import annotations

from pathlib import Path

from plaza.settings import KafkaSettings
from plaza.stack import Deployment
from tests.support import KILLED_SESSION_TIMEOUT_MS, short_session

SESSION = "PLAZA_KAFKA__SESSION_TIMEOUT_MS"


def test_its_processes_get_the_short_session_and_nothing_else_changes(tmp_path: Path) -> None:
    plain = Deployment("127.0.0.1:1", "redis://127.0.0.1:1/0", tmp_path, prefix="p", partitions=3)
    short = short_session(plain)
    assert short.env()[SESSION] == str(KILLED_SESSION_TIMEOUT_MS)
    assert SESSION not in plain.env()
    assert {k: v for k, v in short.env().items() if k != SESSION} == plain.env()
    assert short.settings() == plain.settings() and short.names == plain.names


def test_a_variable_the_caller_sets_wins(tmp_path: Path) -> None:
    short = short_session(Deployment("127.0.0.1:1", "redis://127.0.0.1:1/0", tmp_path))
    assert short.env(**{SESSION: "5000"})[SESSION] == "5000"


def test_the_short_session_is_one_a_worker_accepts() -> None:
    settings = KafkaSettings(session_timeout_ms=KILLED_SESSION_TIMEOUT_MS)
    assert settings.session_timeout_ms == KILLED_SESSION_TIMEOUT_MS
