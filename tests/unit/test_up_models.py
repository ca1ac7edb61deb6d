"""``plaza up``'s plan: which models it serves from the start in each model control mode
(an ensemble's step models with it), the flags a mode does not read, its gateway ports, and
the operator's exported settings it passes on or overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from plaza.cli.up import (
    _choose_ports,
    _deployment,
    _example,
    _exported,
    _override_warnings,
    _own_settings,
    _parse,
    _part_settings,
    _start_models,
    _worker_plan,
    run_up,
)
from plaza.errors import ConfigError
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from plaza.stack import Deployment, Services
from plaza.stack.ports import port_free
from tests.support import REPOSITORY


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """Models a (one instance) and b (two), on the simulated device: no files to build."""
    root = tmp_path / "repo"
    config = (REPOSITORY / "simulated" / "config.pbtxt").read_text()
    for name, count in (("a", 1), ("b", 2)):
        (root / name / "1").mkdir(parents=True)
        own = config.replace('name: "simulated"', f'name: "{name}"')
        (root / name / "config.pbtxt").write_text(own.replace("count: 1", f"count: {count}"))
    return root


def _ensemble(root: Path, name: str, step: str) -> None:
    """An ensemble ``name`` of one step, running the model ``step``."""
    tensor = '{{ name: "{0}" data_type: TYPE_FP32 dims: [ 16 ] }}'
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 16\n'
        f"input [ {tensor.format('INPUT0')} ]\noutput [ {tensor.format('OUTPUT0')} ]\n"
        f'ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } '
        'output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }\n'
    )


@pytest.fixture
def nested(repo: Path) -> Path:
    """``repo`` with the ensemble outer, whose step is the ensemble inner, whose step is a."""
    _ensemble(repo, "inner", "a")
    _ensemble(repo, "outer", "inner")
    return repo


def _plan(repo: Path, *flags: str) -> list[tuple[str, int]]:
    args = _parse(["--repository", str(repo), *flags])
    return _worker_plan(ModelRepository(repo), _start_models(args))


def test_mode_none_serves_every_model_or_the_models_named(repo: Path) -> None:
    assert _plan(repo) == [("a", 1), ("b", 2)]
    assert _plan(repo, "--models", "b") == [("b", 2)]


def test_mode_explicit_serves_only_what_load_model_names(repo: Path) -> None:
    explicit = ("--model-control-mode", "explicit")
    assert _plan(repo, *explicit) == []
    assert _plan(repo, *explicit, "--load-model", "b") == [("b", 2)]
    assert _plan(repo, *explicit, "--load-model", "*") == [("a", 1), ("b", 2)]
    with pytest.raises(ConfigError, match=r"--load-model names \['nope'\]"):
        args = _parse(["--repository", str(repo), *explicit, "--load-model", "nope"])
        _worker_plan(ModelRepository(repo), _start_models(args), "--load-model")


def test_mode_none_serves_an_ensembles_step_models_through_nested_ensembles(
    nested: Path,
) -> None:
    # Without its steps' workers the ensemble never becomes ready (plaza up waits, fails).
    assert _plan(nested, "--models", "outer") == [("a", 1), ("inner", 1), ("outer", 1)]
    assert _plan(nested, "--models", "inner,b") == [("a", 1), ("b", 2), ("inner", 1)]


def test_mode_explicit_loads_an_ensembles_steps_along_with_it(nested: Path) -> None:
    flags = ("--model-control-mode", "explicit", "--load-model", "outer")
    assert _plan(nested, *flags) == [("a", 1), ("inner", 1), ("outer", 1)]
    # The gateway is told only the model named: it loads the steps along (not explicit).
    args = _parse(["--repository", str(nested), *flags])
    plan = _worker_plan(ModelRepository(nested), _start_models(args))
    dep = Deployment("127.0.0.1:1", "redis://127.0.0.1:1/0", nested)
    assert _part_settings(dep, plan, args)["PLAZA_GATEWAY__MODELS"] == "outer"


def test_an_ensemble_whose_step_model_is_missing_is_refused(repo: Path) -> None:
    _ensemble(repo, "broken", "nope")
    with pytest.raises(ConfigError, match="the ensemble broken runs the model nope"):
        _plan(repo, "--models", "broken")


def test_mode_poll_serves_every_model(repo: Path) -> None:
    assert _plan(repo, "--model-control-mode", "poll") == [("a", 1), ("b", 2)]


def test_explicit_mode_without_load_model_tells_the_gateway_to_serve_none(
    repo: Path, tmp_path: Path
) -> None:
    # An empty gateway.models means every model in mode none: the plan must not read so.
    args = _parse(["--repository", str(repo), "--model-control-mode", "explicit"])
    plan = _worker_plan(ModelRepository(repo), _start_models(args))
    dep = Deployment("127.0.0.1:1", "redis://127.0.0.1:1/0", repo)
    settings = _part_settings(dep, plan, args)
    assert settings["PLAZA_GATEWAY__MODELS"] == ""
    assert settings["PLAZA_GATEWAY__MODEL_CONTROL_MODE"] == "explicit"


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (("--model-control-mode", "explicit", "--models", "a"), "--models applies"),
        (("--model-control-mode", "poll", "--models", "a"), "--models applies"),
        (("--load-model", "a"), "--load-model applies"),
        (("--model-control-mode", "poll", "--load-model", "a"), "--load-model applies"),
    ],
)
def test_a_flag_the_mode_does_not_read_is_refused_in_one_line(
    repo: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: tuple[str, ...],
    refusal: str,
) -> None:
    # Refused before anything starts: no services, no processes.
    argv = ["--repository", str(repo), "--data-dir", str(tmp_path / "up"), *flags]
    assert run_up(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"plaza up: error: {refusal}") and err.count("\n") == 1
    assert not (tmp_path / "up").exists()


def test_gateway_port_zero_is_a_free_port_chosen_up_front() -> None:
    args = _parse(["--http-port", "0", "--grpc-port", "0"])
    _choose_ports(args)
    assert args.http_port > 0 and args.grpc_port > 0 and args.http_port != args.grpc_port
    assert port_free(args.http_port) and port_free(args.grpc_port)
    fixed = _parse(["--http-port", "18000", "--grpc-port", "18001"])
    _choose_ports(fixed)
    assert (fixed.http_port, fixed.grpc_port) == (18000, 18001)


def test_the_banners_example_names_only_a_model_served() -> None:
    base = "http://127.0.0.1:8000"
    assert "/v2/models/add_sub/infer" in _example(base, ["add_sub", "mlp"])
    assert _example(base, ["mlp"]) == f"curl -s -X POST {base}/v2/repository/index"
    assert _example(base, []) == f"curl -s -X POST {base}/v2/repository/index"


def test_exported_partitions_and_prefixes_reach_the_deployment_and_overrides_are_named(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exported = {
        "PLAZA_KAFKA__PARTITIONS": "3",
        "PLAZA_KAFKA__TOPIC_PREFIX": "ops.",
        "PLAZA_REDIS__KEY_PREFIX": "ops:",
        "PLAZA_KAFKA__REPLICATION_FACTOR": "2",
        "PLAZA_REDIS__URL": "redis://:secret@10.0.0.5:6379/0",
        "PLAZA_GATEWAY__API_KEY": "k1",
    }
    for name, value in exported.items():
        monkeypatch.setenv(name, value)
    args = _parse(["--repository", str(repo), "--redis-port", "16379", "--http-port", "18000"])
    services = Services(tmp_path / "up", bootstrap="127.0.0.1:1", redis_port=16379)
    plan = _worker_plan(ModelRepository(repo), _start_models(args))
    dep = _deployment(args, services, PlazaSettings())
    assert (dep.partitions, dep.topic_prefix, dep.key_prefix) == (3, "ops.", "ops:")
    env = dep.env(**_part_settings(dep, plan, args))
    assert env["PLAZA_KAFKA__PARTITIONS"] == "3" and env["PLAZA_GATEWAY__API_KEY"] == "k1"
    assert (env["PLAZA_KAFKA__TOPIC_PREFIX"], env["PLAZA_REDIS__KEY_PREFIX"]) == ("ops.", "ops:")
    assert env["PLAZA_KAFKA__REPLICATION_FACTOR"] == "1"  # one broker
    warnings = _override_warnings(_exported(), _own_settings(dep, plan, args))
    assert warnings == [
        "plaza up: warning: PLAZA_KAFKA__REPLICATION_FACTOR exported, not used: plaza up sets 1",
        "plaza up: warning: PLAZA_REDIS__URL exported, not used: plaza up sets "
        "redis://127.0.0.1:16379/0",
    ]
