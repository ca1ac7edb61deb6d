"""docs/settings.md is exactly what `plaza settings` prints (so it cannot go stale)."""

from __future__ import annotations

from pathlib import Path

from plaza.cli.settings_doc import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_settings_doc_is_current() -> None:
    assert DOC.read_text() == render(), "run: .venv/bin/plaza settings > docs/settings.md"


def test_every_security_setting_is_listed() -> None:
    text = render()
    for name in (
        "kafka.sasl_password",
        "kafka.ssl_cafile",
        "redis.password",
        "redis.ssl_ca_certs",
        "gateway.api_key",
        "gateway.max_body_bytes",
    ):
        assert f"`--{name}`" in text
