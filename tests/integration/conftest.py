"""Integration fixtures on top of tests/conftest.py: Plaza settings for this test alone."""

from __future__ import annotations

import pytest

from plaza.settings import PlazaSettings
from tests.support import make_settings


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique_id: str) -> PlazaSettings:
    """Settings on the session's real Kafka and Redis, with this test's own prefixes."""
    return make_settings(kafka_bootstrap, redis_url, unique_id)
