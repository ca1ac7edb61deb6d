"""Which models a host serves, and its workers' ids (no Kafka, no Redis)."""

from __future__ import annotations

import pytest

from plaza.errors import ConfigError
from plaza.settings import HostSettings, PlazaSettings, WorkerSettings
from plaza.workers.host import host_models, worker_id
from tests.support import REPOSITORY


def settings(models: str = "", model: str = "") -> PlazaSettings:
    return PlazaSettings(
        repository=REPOSITORY,
        worker=WorkerSettings(model=model),
        host=HostSettings(models=models),
    )


def test_host_models_or_the_single_worker_model() -> None:
    assert host_models(settings("add_sub, identity")) == ["add_sub", "identity"]
    assert host_models(settings(model="mlp")) == ["mlp"]
    assert host_models(settings("identity", model="mlp")) == ["identity"]


def test_star_is_the_repository() -> None:
    assert set(host_models(settings("*"))) >= {"add_sub", "identity", "mlp", "simulated"}


@pytest.mark.parametrize(
    ("models", "message"), [("", "a host needs models"), ("a,a", "names a model twice")]
)
def test_bad_model_lists_are_config_errors(models: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        host_models(settings(models))
    assert info.value.code == "bad_config"


def test_worker_ids_name_the_model_only_in_a_host_of_several() -> None:
    assert worker_id("h", "m", ["m"]) == "h"
    assert worker_id("h", "m", ["m", "n"]) == "h.m"
