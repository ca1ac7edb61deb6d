"""The ``plaza`` console command: one entry point, one subcommand per job.

    plaza up                      Kafka + Redis + one model host for all models + gateway
    plaza worker --worker.model M one worker process (--host.models A,B: a host of several)
    plaza gateway                 the HTTP gateway
    plaza services up             only Kafka and Redis
    plaza loadgen -m M ...        load sweeps (concurrency / request rate), reports, plots
    plaza profile M               a model's batch-latency curve and batching advice
    plaza simulate ...            the scheduling simulator
    plaza bench [--only NAME]     the benchmark suite

Settings flags (``--kafka.bootstrap_servers``, ``--worker.model``, ...) follow the
subcommand; each also has an environment variable (see plaza/settings.py).
"""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError
from pydantic_settings import CliSettingsSource, SettingsError

from plaza.errors import EXIT_RETRIABLE, PlazaError
from plaza.settings import PlazaSettings

COMMANDS = {
    "up": "bring up Kafka, Redis, the workers and the gateway on the sample repository",
    "worker": "run one worker process for --model NAME (alias of --worker.model), or a host "
    "of several models (--host.models A,B or '*')",
    "gateway": "run the KServe v2 HTTP gateway",
    "services": "run only Kafka and Redis (plaza services up)",
    "settings": "print every setting with its default, environment variable and flag",
    "loadgen": "perf_analyzer-like load sweeps against the gateway or Kafka (loadgen)",
    "profile": "batch-latency curve of a model's backend and dynamic_batching advice",
    "simulate": "headless scheduling simulator (the batcher on a simulated clock)",
    "bench": "the side-by-side benchmark suite (python -m plaza.loadgen.bench)",
}


SHORTCUTS = {"worker": {"worker.model": "model"}}
"""Short flags of a subcommand's settings (``plaza worker --model M``), listed in its help."""

DESCRIPTIONS = {
    "worker": """Run one worker process until SIGINT or SIGTERM: a host of one model
(--model NAME, the same as --worker.model NAME) or of several (--host.models A,B, or '*'
for every model in the repository). It loads the models, joins their consumer groups and
batches the requests of their Kafka topics.

Every setting below also has an environment variable (plaza settings lists them).""",
    "gateway": """Run the KServe v2 gateway (HTTP and gRPC) until SIGINT or SIGTERM: it
publishes requests to the models' Kafka topics and answers with their results from Redis
(gateway.workers N > 1: N processes sharing the ports).

Every setting below also has an environment variable (plaza settings lists them).""",
}
"""The help text of the subcommands whose flags are settings."""


def _settings(argv: list[str], command: str = "worker") -> PlazaSettings:
    """The settings of ``plaza <command>``: its flags over the environment. ``--help``
    prints the command's own help (SystemExit 0); a bad flag is SystemExit 2."""
    source: CliSettingsSource[argparse.ArgumentParser] = CliSettingsSource(
        PlazaSettings,
        cli_prog_name=f"plaza {command}",
        cli_shortcuts=SHORTCUTS.get(command),
    )
    source.root_parser.description = DESCRIPTIONS.get(command)
    return PlazaSettings(_cli_settings_source=source(args=argv))


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand; a user error is one line on stderr and exit status 1 (2 for bad
    settings flags, ``EXIT_RETRIABLE`` when Kafka or Redis failed it: the same start may
    work later), never a traceback."""
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else ""
    try:
        return _dispatch(args)
    except PlazaError as exc:
        print(f"plaza {command}: error: {exc.message}", file=sys.stderr)
        return EXIT_RETRIABLE if exc.retriable else 1
    except ValidationError as exc:
        for problem in exc.errors():
            where = ".".join(str(part) for part in problem["loc"])
            print(f"plaza {command}: error: {where}: {problem['msg']}", file=sys.stderr)
        return 2
    except SettingsError as exc:  # a section flag or variable that is not JSON
        print(f"plaza {command}: error: {_settings_problem(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _settings_problem(exc: SettingsError) -> str:
    """pydantic-settings' message (it names the setting and its source) with its cause
    (what was wrong with the value)."""
    cause = exc.__cause__
    return str(exc) if cause is None else f"{exc}: {cause}"


def _dispatch(args: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="plaza", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "command",
        choices=sorted(COMMANDS),
        help="; ".join(f"{k}: {v}" for k, v in COMMANDS.items()),
    )
    if not args or args[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if args else 2
    command, rest = args[0], args[1:]
    parser.parse_args([command])
    if command == "worker":
        from plaza.workers.main import run_worker

        run_worker(_settings(rest, command))
    elif command == "gateway":
        from plaza.gateway.main import run_gateway

        return run_gateway(_settings(rest, command))
    elif command == "services":
        from plaza.cli.services import run_services_cli

        return run_services_cli(rest)
    elif command == "settings":
        from plaza.cli.settings_doc import run_settings_doc

        return run_settings_doc(rest)
    elif command == "up":
        from plaza.cli.up import run_up

        return run_up(rest)
    elif command in ("loadgen", "profile", "simulate"):
        from plaza.loadgen import cli

        runners = {
            "loadgen": cli.run_loadgen_cli,
            "profile": cli.run_profile_cli,
            "simulate": cli.run_simulate_cli,
        }
        return runners[command](rest)
    elif command == "bench":
        from plaza.loadgen.bench.runner import main as run_bench

        return run_bench(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
