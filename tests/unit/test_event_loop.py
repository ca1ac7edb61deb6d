"""plaza.event_loop: which loop a process runs on."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from plaza import event_loop


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_run_is_on_uvloop_by_default_and_returns_the_value() -> None:
    assert event_loop.run(_loop_type()) is uvloop.Loop


def test_asyncio_names_asyncio_s_own_loop() -> None:
    assert event_loop.loop_factory("asyncio") is None
    seen = event_loop.run(_loop_type(), "asyncio")
    assert not issubclass(seen, uvloop.Loop)
    assert issubclass(seen, asyncio.AbstractEventLoop)


def test_without_uvloop_installed_it_falls_back_to_asyncio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert event_loop.loop_factory("uvloop") is None
    assert not issubclass(event_loop.run(_loop_type()), uvloop.Loop)


def test_the_load_generators_loop_is_a_choice_defaulting_to_uvloop() -> None:
    from plaza.loadgen.cli import loadgen_parser

    parser = loadgen_parser()
    assert parser.parse_args(["-m", "mlp"]).loop == "uvloop"
    assert parser.parse_args(["-m", "mlp", "--loop", "asyncio"]).loop == "asyncio"
    with pytest.raises(SystemExit):
        parser.parse_args(["-m", "mlp", "--loop", "trio"])
