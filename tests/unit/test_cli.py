"""The plaza command's settings flags."""

from __future__ import annotations

from plaza.cli.main import _settings, main


def test_worker_flags_and_the_model_alias() -> None:
    s = _settings(
        ["--model", "mlp", "--kafka.bootstrap_servers", "127.0.0.1:1", "--kafka.partitions=3"]
    )
    assert (s.worker.model, s.kafka.bootstrap_servers, s.kafka.partitions) == (
        "mlp",
        "127.0.0.1:1",
        3,
    )
    assert _settings(["--worker.model=identity"]).worker.model == "identity"


def test_help_and_unknown_command(capsys) -> None:
    assert main(["--help"]) == 0
    assert "plaza up" in capsys.readouterr().out
    try:
        main(["frobnicate"])
    except SystemExit as exc:
        assert exc.code == 2
    else:  # pragma: no cover
        raise AssertionError("unknown command accepted")
