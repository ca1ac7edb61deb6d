"""``plaza up``: the whole engine on this machine, stopped together on Ctrl-C.

Starts Kafka (KRaft) and Redis on 127.0.0.1, one host process serving every model in the
repository (each with its own batcher and consumer group, instance_group count parallel
executions, sharing the device fairly; ``--process-per-model``: one worker process per
model), and the gateway; in model control modes explicit and poll the host (or, with
``--process-per-model``, a supervisor starting a worker per model and generation) follows
the model table (loads, reloads, drains and unloads as the gateway's lifecycle API says);
waits until the gateway is ready; prints where
to send requests; starts Kafka or Redis again if one exits (``ServiceRestarts``); on
Ctrl-C or SIGTERM stops everything it started, workers and gateway first (they drain and
commit), services last.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

import redis.asyncio

from plaza.cli.argtypes import count, seconds
from plaza.cli.services import interrupted_status, stop_signals
from plaza.errors import ConfigError, PlazaError
from plaza.model_control import ModelTable, dependents, serving_models
from plaza.modelconfig import PLATFORM_TORCH, ModelSpec
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from plaza.stack import (
    HOST,
    Deployment,
    GatewayProcess,
    HostProcess,
    KafkaCluster,
    ProcessGroup,
    RedisServer,
    Services,
    WorkerProcess,
    http_ok,
    wait_for,
)
from plaza.stack.data_dir import prepare_data_dir
from plaza.stack.deployment import ENV_PREFIX
from plaza.stack.errors import Interrupted, ServiceError
from plaza.stack.ports import check_ports, free_port, require_free
from plaza.stack.supervisor import ModelSupervisor, forget_refusals
from plaza.stack.waiting import until_stopped
from plaza.tasks import cancel_and_wait

WATCH_S = 0.5
"""How often plaza up checks its processes (and, in modes explicit and poll, the model table)."""
HANDOVER_S = 0.1
"""How often the supervisor looks while a worker starts (``plaza.stack.supervisor``)."""
STOP_TIMEOUT_S = 40.0
"""Grace period of the workers and the gateway: a worker drains and commits first."""
PER_PROCESS = (
    "PLAZA_WORKER__WORKER_ID",
    "PLAZA_HOST__MODELS",
    "PLAZA_WORKER__MODEL",
    "PLAZA_WORKER__MODEL_CONFIG_JSON",
    "PLAZA_WORKER__GENERATION",
)
"""Settings plaza up gives each worker process its own value of (its id, its models)."""
RESTART_FIRST_S = 1.0
"""The back-off before Kafka or Redis, exited unasked, is started again; it doubles with
each further failed start up to ``RESTART_MAX_S``."""
RESTART_MAX_S = 30.0
"""The longest back-off, and how long a restarted service must run for its start to count
as a success (the back-off starts at ``RESTART_FIRST_S`` again after that)."""
RESTART_TRIES = 5
"""Failed starts in a row (a start that raises, or exits within ``RESTART_MAX_S``) after
which plaza up gives up and stops everything."""


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="plaza up", description=__doc__)
    p.add_argument("--repository", default="model_repository", type=Path)
    p.add_argument(
        "--model-config-name",
        default="",
        help="Triton's: a model's configs/<name>.pbtxt, where it has one, in place of config.pbtxt",
    )
    p.add_argument(
        "--disable-auto-complete-config",
        action="store_true",
        help="Triton's: use configs as written (no ONNX or Python model's config completed)",
    )
    p.add_argument("--data-dir", default="var/up", type=Path)
    p.add_argument("--kafka-port", type=int, default=9092)
    p.add_argument("--redis-port", type=int, default=6379)
    p.add_argument(
        "--http-port",
        type=int,
        default=8000,
        help="the gateway's KServe v2 HTTP port (0: a free one)",
    )
    p.add_argument(
        "--grpc-port",
        type=int,
        default=8001,
        help="the gateway's KServe v2 gRPC port (0: a free one)",
    )
    p.add_argument("--metrics-port", type=int, default=8002, help="the gateway's Prometheus port")
    p.add_argument(
        "--gateway-workers",
        type=count,
        default=None,
        help="gateway processes sharing the HTTP and gRPC ports (gateway.workers; default 1)",
    )
    p.add_argument(
        "--models",
        default="",
        help="mode none: a comma-separated subset to serve (default: all)",
    )
    p.add_argument(
        "--model-control-mode",
        choices=("none", "explicit", "poll"),
        default="none",
        help="Triton's: none (all at start), explicit (load/unload API), poll (re-read)",
    )
    p.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="explicit mode: a model to load at start (repeatable; '*' for all; none: no "
        "model is loaded until the repository API loads it)",
    )
    p.add_argument("--repository-poll-secs", type=seconds, default=15.0, help="poll mode")
    p.add_argument(
        "--ready-timeout",
        type=seconds,
        default=180.0,
        help="seconds to wait for the gateway to be ready",
    )
    p.add_argument(
        "--process-per-model",
        action="store_true",
        help="one worker process per model instead of one host for all (modes explicit "
        "and poll: started and stopped by a supervisor as the model table asks)",
    )
    return p.parse_args(argv)


def _worker_plan(
    repo: ModelRepository, only: set[str] | None, flag: str = "--models"
) -> list[tuple[str, int]]:
    """(model, instance count) for every model to serve from the start: ``only`` and the
    step models of the ensembles among them (None: every model; empty: none), in the
    repository's order. ConfigError, naming ``flag``, for a name that is not in the
    repository. A model that needs torch where it is missing is skipped, and so is an
    ensemble that runs one (it could answer nothing)."""
    present = repo.model_names()
    unknown = sorted((only or set()) - set(present))
    if unknown:
        raise ConfigError(
            f"{flag} names {unknown}, not in the repository {repo.root} (it has {present})"
        )
    if only is None:
        specs = {name: repo.spec(name) for name in present}
    else:
        specs = _with_steps(repo, only, flag)
    skipped = _skipped(specs)
    plan = []
    for name in present:
        spec = specs.get(name)
        if spec is None or name in skipped:
            continue
        repo.served_versions(name, spec)  # a missing model file fails here, clearly
        plan.append((name, spec.instance_count))
    return plan


def _with_steps(repo: ModelRepository, names: Iterable[str], flag: str) -> dict[str, ModelSpec]:
    """The specs of ``names`` and of every model that an ensemble among them runs in a step,
    through nested ensembles (``serving_models``): explicit mode loads them with the
    ensemble, as Triton does, and mode none must run their workers too, or the ensemble
    never becomes ready. ConfigError for a step model not in the repository."""
    present = set(repo.model_names())
    specs: dict[str, ModelSpec] = {}
    todo = sorted(names, reverse=True)
    while todo:
        name = todo.pop()
        if name in specs:
            continue
        specs[name] = spec = repo.spec(name)
        for step in serving_models(name, spec)[1:]:
            if step not in present:
                raise ConfigError(
                    f"{flag}: the ensemble {name} runs the model {step}, not in the "
                    f"repository {repo.root}"
                )
            todo.append(step)
    return specs


def _skipped(specs: Mapping[str, ModelSpec]) -> set[str]:
    """The models of ``specs`` plaza up cannot serve here, each told on a line: TorchScript
    ones without torch, and the ensembles that run one (``dependents``)."""
    if importlib.util.find_spec("torch") is not None:
        return set()
    needs_torch = sorted(m for m, spec in specs.items() if spec.platform == PLATFORM_TORCH)
    for name in needs_torch:
        print(f"  skipping {name}: needs the torch extra (pip install '.[torch]')")
    ensembles = dependents(needs_torch, specs)
    for name in ensembles:
        print(f"  skipping {name}: an ensemble running a model skipped")
    return {*needs_torch, *ensembles}


def _exported() -> dict[str, str]:
    """The operator's PLAZA_* settings, as exported."""
    return {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}


def _forwarded_settings(own: Mapping[str, str]) -> dict[str, str]:
    """The caller's own PLAZA_* settings (an API key, batching knobs, ...).

    A deployment's environment drops inherited PLAZA_* on purpose; ``plaza up`` is the one
    caller that hands the operator's settings on, except those it sets itself (``own``,
    from :func:`_own_settings`: :func:`_override_warnings` names each one exported).
    """
    return {k: v for k, v in _exported().items() if k not in own}


def _own_settings(
    dep: Deployment, plan: list[tuple[str, int]], args: argparse.Namespace
) -> dict[str, str]:
    """Every PLAZA_* setting plaza up sets itself, with the value it uses: its deployment's
    (its own Kafka and Redis, one replica, the repository and config flags; the partitions
    and prefixes are the operator's), the model control it was asked for, the gateway's
    ports, and those each worker process gets its own value of."""
    own = {k: v for k, v in dep.env().items() if k.startswith(ENV_PREFIX)}
    own.update(_up_settings(plan, args))
    metrics = str(args.metrics_port) if args.metrics_port else "a free port"
    following = args.model_control_mode != "none" and not args.process_per_model
    own.update(
        {
            "PLAZA_GATEWAY__HTTP_PORT": str(args.http_port),
            "PLAZA_GATEWAY__GRPC_PORT": str(args.grpc_port),
            "PLAZA_GATEWAY__METRICS_PORT": metrics,
            "PLAZA_HOST__FOLLOW_MODEL_TABLE": str(following).lower(),
        }
    )
    own.update(dict.fromkeys(PER_PROCESS, "one for each worker process"))
    return own


def _override_warnings(exported: Mapping[str, str], own: Mapping[str, str]) -> list[str]:
    """One line for each exported setting plaza up sets otherwise, naming the value used
    (never the exported one: it may hold a password)."""
    return [
        f"plaza up: warning: {name} exported, not used: plaza up sets {own[name]}"
        for name, value in sorted(exported.items())
        if name in own and value.casefold() != own[name].casefold()
    ]


def _start_models(args: argparse.Namespace) -> set[str] | None:
    """The models served from the start (None: every model), as Triton chooses them.

    Mode none: ``--models`` (default all); explicit: ``--load-model`` (``*``: all; none
    given: no model); poll: every model. ConfigError for a flag the mode does not read.
    """
    mode = args.model_control_mode
    if args.models and mode != "none":
        instead = "--load-model NAME" if mode == "explicit" else "every model is served"
        raise ConfigError(f"--models applies to model control mode none, not {mode} ({instead})")
    if args.load_model and mode != "explicit":
        raise ConfigError(f"--load-model applies to model control mode explicit, not {mode}")
    if mode == "none":
        return set(filter(None, args.models.split(","))) or None
    if mode == "poll" or "*" in args.load_model:
        return None
    return set(args.load_model)


def _choose_ports(args: argparse.Namespace) -> None:
    """``--http-port`` or ``--grpc-port`` 0: a free port, chosen here, so that the wait for
    readiness and the banner name the port the gateway listens on."""
    zero = [name for name in ("http_port", "grpc_port") if getattr(args, name) == 0]
    if zero:
        first = free_port(count=len(zero))  # both 0: two ports, never the same one twice
        for offset, name in enumerate(zero):
            setattr(args, name, first + offset)


def _part_settings(
    dep: Deployment, plan: list[tuple[str, int]], args: argparse.Namespace
) -> dict[str, str]:
    """The settings of the workers and the gateway: the operator's, and the model control
    plaza up was asked for."""
    return {**_forwarded_settings(_own_settings(dep, plan, args)), **_up_settings(plan, args)}


def _up_settings(plan: list[tuple[str, int]], args: argparse.Namespace) -> dict[str, str]:
    """The model control plaza up was asked for. The gateway serves the plan from the start
    (a subset, with its ensembles' steps, without skipped models); in mode explicit only
    the models ``--load-model`` names (none without it): the gateway loads their
    ensembles' steps along with them, as Triton does (unloaded with them)."""
    served = [m for m, _ in plan]
    only = _start_models(args)
    if args.model_control_mode == "explicit" and only is not None:
        served = [m for m in served if m in only]
    settings = {
        "PLAZA_GATEWAY__MODELS": ",".join(served),
        "PLAZA_GATEWAY__MODEL_CONTROL_MODE": args.model_control_mode,
        "PLAZA_GATEWAY__REPOSITORY_POLL_S": str(args.repository_poll_secs),
    }
    if args.gateway_workers is not None:
        settings["PLAZA_GATEWAY__WORKERS"] = str(args.gateway_workers)
    return settings


def _start_parts(
    dep: Deployment, plan: list[tuple[str, int]], group: ProcessGroup, args: argparse.Namespace
) -> GatewayProcess:
    """Mode none: one host for every model (or, ``--process-per-model``, one worker per
    model), then the gateway. Modes explicit and poll: one host following the model table
    (or, ``--process-per-model``, nothing here: the supervisor starts the workers the
    table asks for), then the gateway. Returns the gateway."""
    settings = _part_settings(dep, plan, args)
    if args.model_control_mode == "none":
        _start_workers(dep, plan, group, settings, per_model=args.process_per_model)
    elif not args.process_per_model:
        _start_following_host(dep, group, settings)
    gateway = GatewayProcess(
        dep,
        args.http_port,
        group.log_dir,
        metrics_port=args.metrics_port,
        grpc_port=args.grpc_port,
        env=settings,
    )
    return group.start(gateway)


def _start_workers(
    dep: Deployment,
    plan: list[tuple[str, int]],
    group: ProcessGroup,
    settings: dict[str, str],
    *,
    per_model: bool,
) -> None:
    """One host serving the whole plan, or one worker process per model (each runs its
    instance_group count of executions in parallel, as the host does)."""
    if not per_model:
        models = [m for m, _ in plan]
        group.start(HostProcess(dep, models, group.log_dir, name="host", env=settings))
        return
    for model, _ in plan:
        name = f"worker-{model}"
        group.start(WorkerProcess(dep, model, group.log_dir, name=name, env=settings))


def _start_following_host(dep: Deployment, group: ProcessGroup, settings: dict[str, str]) -> None:
    """Modes explicit and poll: one host for any model of the repository that follows the
    model table (``host.follow_model_table``): it starts, reloads and drains a unit per
    loaded model (docs/hosts.md)."""
    env = {**settings, "PLAZA_HOST__FOLLOW_MODEL_TABLE": "true"}
    group.start(HostProcess(dep, ["*"], group.log_dir, name="host", env=env))


async def _ready_or_stopping(
    gateway: GatewayProcess, group: ProcessGroup, stopping: threading.Event, limit_s: float
) -> None:
    """Until the gateway is ready; fails if a process exits, and with :class:`Interrupted`
    as soon as a stop is asked for."""
    url = f"{gateway.url}/v2/health/ready"

    async def ready() -> bool:
        group.check()
        return await asyncio.to_thread(http_ok, url)

    wait = wait_for(ready, limit_s, f"the gateway at {url}", lambda: group.tails(10), poll_s=0.5)
    await until_stopped(wait, stopping, "the gateway to be ready")


async def _fresh_model_table(dep: Deployment, *, supervised: bool) -> None:
    """Modes explicit and poll, before the gateway and the supervisor read it: an empty
    model table. plaza up owns its deployment, and its Redis keeps the table in the data
    dir: a restart would serve again what an earlier run loaded. As in Triton, the gateway
    then loads ``--load-model``'s models (explicit) or the repository as it is now (poll).
    ``supervised`` (``--process-per-model``): the supervisor's refusals are cleared too
    (``plaza.stack.supervisor.forget_refusals``; none are left in an empty table)."""
    client = redis.asyncio.Redis.from_url(dep.redis_url)
    try:
        await client.delete(dep.names.model_table_key())
        if supervised:
            await forget_refusals(ModelTable(client, dep.names))
    except redis.RedisError as exc:
        raise ServiceError(f"could not empty the model table in Redis: {exc}") from exc
    finally:
        await client.aclose()


async def _supervise(supervisor: ModelSupervisor, stopping: threading.Event) -> None:
    """Match the workers to the model table every WATCH_S (every HANDOVER_S while a new
    generation's worker starts: its old one stops soon after it serves), until stopped."""
    while not stopping.is_set():
        try:
            await supervisor.reconcile()
        except Exception as exc:  # Redis or Kafka restarting: the next round tries again
            print(f"supervisor: {exc}", flush=True)
        await asyncio.sleep(HANDOVER_S if supervisor.starting else WATCH_S)


class Restartable(Protocol):
    """A service plaza up started: ``check`` raises ServiceError once it exited unasked,
    ``restart`` starts it again on the same config and data dir."""

    name: str

    def check(self) -> None: ...

    def restart(self) -> None: ...


class _Redis:
    def __init__(self, redis: RedisServer) -> None:
        self.name = "Redis"
        self.redis = redis

    def check(self) -> None:
        self.redis.check()

    def restart(self) -> None:
        self.redis.kill()  # forgets the exited process
        self.redis.start()


class _Kafka:
    def __init__(self, kafka: KafkaCluster) -> None:
        self.name = "Kafka"
        self.kafka = kafka

    def check(self) -> None:
        self.kafka.check()

    def restart(self) -> None:
        for node in self.kafka.node_ids:
            if not self.kafka.is_running(node):
                self.kafka.kill(node)  # forgets the exited process
                self.kafka.start_node(node)


class ServiceRestarts:
    """Starts ``service`` again when it exits unasked, after a back-off (``RESTART_FIRST_S``
    doubling to ``RESTART_MAX_S``); the workers and the gateway ride the gap out, as they
    ride out a Redis or Kafka restarted by its own supervisor. After ``RESTART_TRIES``
    failed starts in a row :meth:`watch` raises the ServiceError that ends plaza up."""

    def __init__(
        self,
        service: Restartable,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.service = service
        self.clock = clock
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.failures = 0
        """Failed starts in a row."""
        self.due: float | None = None
        """When to start it again; None while it runs."""
        self.started: float | None = None
        """When it was last started again; None once it counts as up."""

    def watch(self) -> None:
        """Look once (plaza up's watch loop calls it every ``WATCH_S``)."""
        now = self.clock()
        if self.due is not None:
            if now >= self.due:
                self._restart(now)
            return
        try:
            self.service.check()
        except ServiceError as exc:
            if self.started is not None:  # exited soon after a restart: a failed start
                self._failed(now, exc.message)
            else:
                self.say(f"plaza up: {exc.message}")
                self._schedule(now)
            return
        if self.started is not None and now - self.started >= RESTART_MAX_S:
            self.failures, self.started = 0, None

    def _restart(self, now: float) -> None:
        try:
            self.service.restart()
        except (PlazaError, OSError) as exc:
            self._failed(now, str(getattr(exc, "message", exc)))
            return
        self.due, self.started = None, now
        self.say(f"plaza up: {self.service.name} started again")

    def _failed(self, now: float, why: str) -> None:
        self.failures += 1
        if self.failures >= RESTART_TRIES:
            raise ServiceError(
                f"{self.service.name} failed to start {self.failures} times in a row, "
                f"giving up: {why}"
            )
        self.say(f"plaza up: {self.service.name} failed to start again: {why}")
        self._schedule(now)

    def _schedule(self, now: float) -> None:
        delay = min(RESTART_FIRST_S * 2**self.failures, RESTART_MAX_S)
        self.due, self.started = now + delay, None
        self.say(f"plaza up: restarting {self.service.name} in {delay:g} s")


def _restarts(services: Services) -> list[ServiceRestarts]:
    """A :class:`ServiceRestarts` for each service started here."""
    parts: list[Restartable] = []
    if services.redis is not None:
        parts.append(_Redis(services.redis))
    if services.kafka is not None:
        parts.append(_Kafka(services.kafka))
    return [ServiceRestarts(part) for part in parts]


async def _watch(group: ProcessGroup, services: Services, stopping: threading.Event) -> int:
    """Until a stop signal (0) or until a process exits unasked, or a service that exited
    fails to start again ``RESTART_TRIES`` times in a row (1: its exit code and log tail
    printed). A service that exited is started again after a back-off (ServiceRestarts)."""
    restarts = _restarts(services)
    while not stopping.is_set():
        try:
            group.check()
            for each in restarts:
                each.watch()
        except ServiceError as exc:
            print(f"plaza up: error: {exc.message}", file=sys.stderr, flush=True)
            print("stopping everything", flush=True)
            return 1
        await asyncio.sleep(WATCH_S)
    return 0


async def _serve(
    gateway: GatewayProcess,
    group: ProcessGroup,
    services: Services,
    stopping: threading.Event,
    args: argparse.Namespace,
    supervisor: ModelSupervisor | None,
    banner: tuple[list[str], str],
) -> int:
    """Wait for readiness (the supervisor already at work), print the banner (``banner``:
    the models served from the start, and a request topic's name), watch."""
    task = None
    if supervisor is not None:
        await supervisor.start()
        task = asyncio.create_task(_supervise(supervisor, stopping))
    try:
        await _ready_or_stopping(gateway, group, stopping, args.ready_timeout)
        grpc_address = f"{HOST}:{args.grpc_port}"
        models, topic = banner
        kafka = f"{services.bootstrap}   (topics {topic})"
        _print_banner(gateway.url, grpc_address, kafka, services.redis_url, models)
        return await _watch(group, services, stopping)
    finally:
        if task is not None and supervisor is not None:
            await cancel_and_wait([task])
            await supervisor.close()


def run_up(argv: list[str]) -> int:
    """``plaza up [flags]``: run everything until Ctrl-C or SIGTERM; the exit status.

    A user error (an unknown model, no repository, a port in use or named twice, a data dir
    that cannot be made, Java missing, a service that does not come up) is one line on
    stderr and exit status 1, never a traceback; the options are checked before anything
    starts. A Ctrl-C or SIGTERM before the gateway is ready stops what had started and
    exits 128 + the signal (Ctrl-C: 130). An exported PLAZA_* setting it sets otherwise is
    named in a warning line; a bad one stops it first (pydantic's ValidationError).
    """
    args = _parse(argv)
    exported = PlazaSettings()  # the operator's partitions and prefixes, checked up front
    try:
        repository = ModelRepository(
            args.repository,
            args.model_config_name,
            auto_complete=not args.disable_auto_complete_config,
        )
        flag = "--load-model" if args.model_control_mode == "explicit" else "--models"
        plan = _worker_plan(repository, _start_models(args), flag)
        if not plan and args.model_control_mode == "none":
            raise ConfigError(f"no model to serve in {args.repository}")
        _choose_ports(args)
        data_dir = Path(args.data_dir).resolve()
        services = Services(data_dir, kafka_port=args.kafka_port, redis_port=args.redis_port)
        _check_ports(args, services, exported)
        dep = _deployment(args, services, exported)
        prepare_data_dir(data_dir)
    except PlazaError as exc:
        print(f"plaza up: error: {exc.message}", file=sys.stderr, flush=True)
        return 1
    for line in _override_warnings(_exported(), _own_settings(dep, plan, args)):
        print(line, file=sys.stderr, flush=True)
    group = ProcessGroup(data_dir / "logs")
    stopping = threading.Event()
    with stop_signals(stopping) as received:
        try:
            print("starting Kafka and Redis on 127.0.0.1 ...", flush=True)
            services.start(stopping)
            supervised = args.model_control_mode != "none" and args.process_per_model
            if args.model_control_mode != "none":  # before the gateway reads the table
                asyncio.run(_fresh_model_table(dep, supervised=supervised))
            gateway = _start_parts(dep, plan, group, args)
            supervisor = None
            if supervised:
                env = _forwarded_settings(_own_settings(dep, plan, args))
                supervisor = ModelSupervisor(dep, args.repository, group, env=env)
            print(
                f"starting {_layout(plan, args)} and the gateway (logs in {group.log_dir}) ...",
                flush=True,
            )
            topic = dep.names.request_topic("model").removesuffix("model") + "<model>"
            banner = ([m for m, _ in plan], topic)
            return asyncio.run(_serve(gateway, group, services, stopping, args, supervisor, banner))
        except Interrupted:
            print("plaza up: interrupted while starting", flush=True)
            return interrupted_status(received)
        except PlazaError as exc:  # ServiceError, WaitTimeout (with the log to read), ...
            print(f"plaza up: error: {exc.message}", file=sys.stderr, flush=True)
            return 1
        finally:
            print("stopping ...", flush=True)
            group.stop_all(STOP_TIMEOUT_S)
            services.stop()
            print("stopped.", flush=True)


def _deployment(
    args: argparse.Namespace, services: Services, exported: PlazaSettings
) -> Deployment:
    """plaza up's deployment on its own Kafka and Redis: the operator's partitions and
    topic and key prefixes (Plaza's defaults unless exported), the workers' own heartbeat.
    Its one broker holds one replica of each topic: replication factor and
    min.insync.replicas 1 (more, exported, would refuse every write; named in a warning)."""
    return services.deployment(
        args.repository,
        partitions=exported.kafka.partitions,
        replication_factor=1,
        min_insync_replicas=1,
        kafka_topic_prefix=exported.kafka.topic_prefix,
        redis_key_prefix=exported.redis.key_prefix,
        heartbeat_interval_s=None,
        model_config_name=args.model_config_name,
        disable_auto_complete_config=args.disable_auto_complete_config,
    )


def _gateway_processes(args: argparse.Namespace, exported: PlazaSettings) -> int:
    """How many gateway processes plaza up starts: ``--gateway-workers``, else the exported
    gateway.workers (1 unless exported)."""
    if args.gateway_workers is not None:
        return int(args.gateway_workers)
    return exported.gateway.workers


def _port_owners(
    args: argparse.Namespace, services: Services, exported: PlazaSettings
) -> dict[str, list[int]]:
    """Every port plaza up listens on, by the option that sets it (after _choose_ports)."""
    workers = _gateway_processes(args, exported)  # gateway process i: metrics on port + i
    metrics = [args.metrics_port + i for i in range(workers)]
    if args.metrics_port <= 0:  # 0: a free one, < 0: off
        metrics = []
    ports = services.ports()
    return {
        "--http-port": [args.http_port],
        "--grpc-port": [args.grpc_port],
        "--metrics-port": metrics,
        "--kafka-port": ports["kafka"],
        "the Kafka controller (--kafka-port + 1)": ports["kafka controller"],
        "--redis-port": ports["redis"],
    }


def _check_ports(args: argparse.Namespace, services: Services, exported: PlazaSettings) -> None:
    """Ports out of range, used twice, or taken: refused before anything starts (every
    gateway process's metrics port, ``exported`` giving gateway.workers without the flag)."""
    owners = _port_owners(args, services, exported)
    check_ports(owners)
    for owner, ports in owners.items():
        require_free(ports, owner)


def _layout(plan: list[tuple[str, int]], args: argparse.Namespace) -> str:
    models = [m for m, _ in plan]
    if args.model_control_mode != "none":
        if args.process_per_model:
            return f"workers as the model table asks (model control {args.model_control_mode})"
        return f"one host following the model table (model control {args.model_control_mode})"
    if args.process_per_model:
        return f"{len(models)} worker processes for {models}"
    return f"one host process for {models}"


def _example(base: str, models: list[str]) -> str:
    """A command to try that works: an infer of the sample ``add_sub`` where it is served,
    else the repository index (which models there are, and which are loaded)."""
    if "add_sub" not in models:
        return f"curl -s -X POST {base}/v2/repository/index"
    return (
        f"curl -s {base}/v2/models/add_sub/infer -H 'content-type: application/json' "
        '-d \'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32",'
        '"data":[' + ",".join(["1"] * 16) + ']},{"name":"INPUT1","shape":[1,16],'
        '"datatype":"INT32","data":[' + ",".join(["2"] * 16) + "]}]}'"
    )


def _print_banner(base: str, grpc: str, kafka: str, redis: str, models: list[str]) -> None:
    example = _example(base, models)
    print(
        f"""
Plaza is up.
  HTTP (KServe v2):  {base}/v2          models: {", ".join(models) or "none loaded"}
  gRPC (KServe v2):  {grpc}   (tritonclient.grpc.InferenceServerClient("{grpc}"))
  health:            {base}/v2/health/ready
  Kafka:             {kafka}
  Redis:             {redis}
Try:
  {example}
Ctrl-C stops everything.
""",
        flush=True,
    )
