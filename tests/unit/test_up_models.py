"""``plaza up``'s plan: which models it serves from the start in each model control mode,
the flags a mode does not read, and its gateway ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from plaza.cli.up import (
    _choose_ports,
    _example,
    _parse,
    _part_settings,
    _start_models,
    _worker_plan,
    run_up,
)
from plaza.errors import ConfigError
from plaza.repository import ModelRepository
from plaza.stack import Deployment
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
