"""Command lines: ``plaza loadgen`` (= ``python -m loadgen``), ``plaza profile``,
``plaza simulate``. ``plaza bench`` is ``plaza.loadgen.bench``.

    plaza loadgen -m mlp --target http-binary --concurrency 1:64:x2
    plaza loadgen -m mlp --target kafka,http-json --request-rate 100:400:100 \\
        --distribution poisson --out results/loadgen/mlp-rate
    plaza profile mlp --latency-budget-ms 10
    plaza simulate --model simulated --rate 200:1600:200 --distribution poisson
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import urllib.parse
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from plaza import event_loop, gc_tuning
from plaza.batching import BatchingPolicy
from plaza.errors import EXIT_RETRIABLE, PlazaError
from plaza.event_loop import LOOPS, LoopName
from plaza.loadgen import report_json
from plaza.loadgen.arrivals import DISTRIBUTIONS, ArrivalProcess
from plaza.loadgen.inputs import input_pool
from plaza.loadgen.latency import LatencyModel, LinearLatency, ProfileLatency
from plaza.loadgen.measure import Load, WindowConfig
from plaza.loadgen.profiler import (
    ensure_version_folder,
    format_profile,
    profile_model,
    write_profile,
)
from plaza.loadgen.progress import WindowProgress
from plaza.loadgen.simulator import MAX_EVENTS, Routing, SimConfig, SimResult, simulate
from plaza.loadgen.sweep import (
    SweepError,
    format_table,
    parse_range,
    prepare_out,
    run_sweep,
    write_reports,
)
from plaza.loadgen.targets import TARGET_KINDS, Target, make_target
from plaza.modelconfig import ModelSpec
from plaza.repository import ModelRepository
from plaza.settings import KafkaSettings, PlazaSettings, RedisSettings

DEFAULT_REPOSITORY = Path("model_repository")
T = TypeVar("T")


def _ints(text: str) -> list[int]:
    """A range of whole numbers > 0 (an argparse type: a bad one is a usage error)."""
    try:
        values = parse_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not all(v.is_integer() for v in values):
        raise argparse.ArgumentTypeError(f"bad range {text!r}: whole numbers only")
    return [int(v) for v in values]


def _http_url(text: str) -> str:
    """An http:// or https:// URL with a host (an argparse type: any other is a usage
    error, where it would otherwise fail every request at once)."""
    parts = urllib.parse.urlsplit(text)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http:// or https:// URL (e.g. http://127.0.0.1:8000)"
        )
    return text


# -- loadgen --------------------------------------------------------------------------------


def add_loop_argument(p: argparse.ArgumentParser) -> None:
    """``--loop``: the event loop the load generator runs on (``run_load``)."""
    p.add_argument(
        "--loop",
        choices=LOOPS,
        default="uvloop",
        help="the load generator's event loop (default uvloop; asyncio: its own loop and "
        "the interpreter's collector settings, for comparison)",
    )


def run_load(main: Coroutine[Any, Any, T], loop: LoopName) -> T:
    """Run the load generator's ``main`` to its end. On uvloop it runs as a serving
    process does (the collector tuned, start-up frozen): its CPU is the stack's too."""
    if loop == "uvloop":
        gc_tuning.tune()
        gc_tuning.freeze_startup()
    return event_loop.run(main, loop)


def loadgen_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="plaza loadgen",
        description="perf_analyzer-like load: concurrency or request-rate sweeps, measured "
        "in windows until stable, against the gateway (HTTP) or Kafka (SDK).",
    )
    p.add_argument("-m", "--model", required=True)
    p.add_argument(
        "--target",
        default="http-binary",
        help=f"comma-separated, measured side by side: {', '.join(TARGET_KINDS)}",
    )
    p.add_argument(
        "--url",
        type=_http_url,
        default="http://127.0.0.1:8000",
        help="the gateway (HTTP targets): an http:// or https:// URL",
    )
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", help="e.g. 16, 1:64:x2, 1,8,64 (default 1)")
    load.add_argument("--request-rate", help="requests/s, e.g. 100:400:100")
    p.add_argument("--distribution", choices=("constant", "poisson"), default="constant")
    p.add_argument(
        "--repository",
        type=Path,
        help="where the model's config is read (input shapes); default PLAZA_REPOSITORY",
    )
    p.add_argument("--batch-size", type=int, default=1, help="rows per request")
    p.add_argument(
        "--sequence-length",
        type=int,
        default=20,
        help="a stateful model's sequences: requests per sequence (perf_analyzer's default, "
        "20); each concurrent client runs one sequence at a time",
    )
    p.add_argument("--seq-len", type=int, default=16, help="size of -1 dims (minilm: pad length)")
    p.add_argument("--window-s", type=float, default=2.0)
    p.add_argument("--warmup-s", type=float, default=1.0)
    p.add_argument("--stability", type=float, default=0.10, help="allowed spread (0.10 = 10%%)")
    p.add_argument("--stable-windows", type=int, default=3)
    p.add_argument("--max-windows", type=int, default=10)
    p.add_argument("--max-in-flight", type=int, default=4096, help="rate mode bound")
    p.add_argument("--timeout-s", type=float, default=30.0, help="per request")
    p.add_argument("--bootstrap-servers", help="Kafka (kafka target; default: PLAZA_ settings)")
    p.add_argument("--redis-url", help="Redis (kafka target)")
    p.add_argument("--topic-prefix", help="Kafka topic prefix (kafka target)")
    p.add_argument("--key-prefix", help="Redis key prefix (kafka target)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write OUT.csv, OUT.json, OUT.png")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    add_loop_argument(p)
    return p


_KAFKA_FLAGS = {"bootstrap_servers": "--bootstrap-servers", "topic_prefix": "--topic-prefix"}
_REDIS_FLAGS = {"url": "--redis-url", "key_prefix": "--key-prefix"}


def kafka_settings(args: argparse.Namespace) -> PlazaSettings:
    """PLAZA_* settings from the environment, overridden by the flags that were given, each
    section validated again with them: ValueError in one line naming a flag refused."""
    base = PlazaSettings()
    kafka = _section(KafkaSettings, base.kafka, _KAFKA_FLAGS, args)
    redis = _section(RedisSettings, base.redis, _REDIS_FLAGS, args)
    return base.model_copy(update={"repository": args.repository, "kafka": kafka, "redis": redis})


S = TypeVar("S", KafkaSettings, RedisSettings)


def _section(cls: type[S], base: S, flags: dict[str, str], args: argparse.Namespace) -> S:
    """``base`` with the fields whose flags were given, validated as a new section (a
    model_copy would skip the validators)."""
    given = {field: getattr(args, flag[2:].replace("-", "_")) for field, flag in flags.items()}
    update = {field: value for field, value in given.items() if value}
    try:
        return cls.model_validate({**base.model_dump(), **update})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        message = first["msg"].removeprefix("Value error, ")
        raise ValueError(f"{flags.get(field, field)}: {message}") from None


def _loads(args: argparse.Namespace) -> list[Load]:
    if args.request_rate:
        return [
            Load("rate", v, args.distribution, args.seed) for v in parse_range(args.request_rate)
        ]
    values = parse_range(args.concurrency or "1")
    return [Load("concurrency", int(v) if v.is_integer() else v) for v in values]


def _window_config(args: argparse.Namespace) -> WindowConfig:
    """The measuring flags, every one checked (ValueError) before anything runs."""
    for flag, value in (("--batch-size", args.batch_size), ("--seq-len", args.seq_len)):
        if value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    if not args.timeout_s > 0:
        raise ValueError(f"--timeout-s must be > 0, got {args.timeout_s:g}")
    return WindowConfig(
        args.window_s,
        args.warmup_s,
        args.stability,
        args.stable_windows,
        args.max_windows,
        args.max_in_flight,
    )


def _check_batch_size(rows: int, spec: ModelSpec) -> None:
    """ValueError for ``--batch-size`` rows the model does not take in one request: more
    than its ``max_batch_size``, or more than 1 when it does not batch (its inputs have no
    batch dim: a request is one set of inputs)."""
    top = spec.max_batch_size
    if top > 0 and rows > top:
        raise ValueError(f"--batch-size {rows} is above {spec.name}'s max_batch_size ({top})")
    if top == 0 and rows != 1:
        raise ValueError(
            f"--batch-size {rows}: {spec.name} does not batch (max_batch_size 0), "
            "a request is one set of its inputs: give 1"
        )


def run_loadgen_cli(argv: Sequence[str] | None = None) -> int:
    args = loadgen_parser().parse_args(argv)
    kinds = [k.strip() for k in args.target.split(",") if k.strip()]
    bad = [k for k in kinds if k not in TARGET_KINDS]
    if bad or not kinds:
        print(f"error: unknown target(s) {bad}; choose from {TARGET_KINDS}", file=sys.stderr)
        return 2
    args.repository = args.repository or PlazaSettings().repository
    try:
        ensure_version_folder(args.repository, args.model)
        spec = ModelRepository(args.repository).spec(args.model)
        loads = _loads(args)
        cfg = _window_config(args)
        _check_batch_size(args.batch_size, spec)
        settings = kafka_settings(args) if "kafka" in kinds else None
        if args.out:
            prepare_out(args.out)
    except (PlazaError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.sequence_length < 1:
        print("error: --sequence-length must be at least 1", file=sys.stderr)
        return 2
    if spec.sequence.enabled and args.batch_size != 1:
        print(f"error: {args.model} is a stateful model: one row a request", file=sys.stderr)
        return 2
    # a stateful model's load is sequences: each concurrent client runs one at a time
    sequence_length = args.sequence_length if spec.sequence.enabled else 0
    pool = input_pool(spec, rows=args.batch_size, seq_len=args.seq_len, seed=args.seed)
    conns = int(max((ld.value for ld in loads), default=1)) if not args.request_rate else 1024
    targets: list[Target] = [
        make_target(
            k,
            args.model,
            pool,
            url=args.url,
            settings=settings,
            max_connections=max(1, min(conns, 1024)),
            timeout_s=args.timeout_s,
            sequence_length=sequence_length,
        )
        for k in kinds
    ]
    return _sweep_and_report(args, kinds, targets, loads, cfg)


def _sweep_and_report(
    args: argparse.Namespace,
    kinds: list[str],
    targets: list[Target],
    loads: list[Load],
    cfg: WindowConfig,
) -> int:
    """Measure, print the table and write the reports: those of the points measured before
    a failed one too, then the failure (exit status 1)."""
    total = len(loads) * len(targets) * cfg.max_windows
    failure: SweepError | None = None
    with WindowProgress(total, enabled=False if args.no_progress else None) as bar:
        try:
            points = run_load(run_sweep(targets, loads, cfg, bar), args.loop)
        except SweepError as exc:  # report and write what was measured before it
            points, failure = exc.points, exc
    if points or failure is None:
        print(format_table(points))
    if args.out:
        meta = {
            "model": args.model,
            "targets": kinds,
            "window": dataclasses.asdict(cfg),
            "rows_per_request": args.batch_size,
            "seq_len": args.seq_len,
            "failed": None if failure is None else str(failure),
        }
        for path in write_reports(points, args.out, meta, plot=not args.no_plot):
            print(f"wrote {path}")
    if failure is not None:
        return _sweep_failed(failure)
    empty = [f"{p.target} {p.load.label}" for p in points if p.completed == 0]
    if empty:
        print(f"error: no successful request at: {', '.join(empty)}", file=sys.stderr)
        return 1
    return 0


def _sweep_failed(failure: SweepError) -> int:
    """Say why the sweep stopped; the exit status: ``EXIT_RETRIABLE`` when a target did not
    start for a reason that may pass (Kafka or Redis not answering), else 1."""
    cause = failure.cause
    if failure.started:
        print(f"error: the sweep stopped at {failure}", file=sys.stderr)
        return 1
    message = cause.message if isinstance(cause, PlazaError) else f"{type(cause).__name__}: {cause}"
    print(f"error: {failure.label}: {message}", file=sys.stderr)
    return EXIT_RETRIABLE if isinstance(cause, PlazaError) and cause.retriable else 1


# -- profile --------------------------------------------------------------------------------


def run_profile_cli(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="plaza profile",
        description="Batch-latency curve of a model's backend, run directly, and the "
        "dynamic_batching settings it suggests for a latency budget.",
    )
    p.add_argument("model")
    p.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    p.add_argument("--latency-budget-ms", type=float)
    p.add_argument("--batch-sizes", type=_ints, help="default: 1, 2, 4, ... max_batch_size")
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window-s", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: as a worker)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--out", type=Path, help="default results/profile/MODEL")
    args = p.parse_args(argv)
    try:
        _check_profile_args(args)
        out = args.out or Path("results/profile") / args.model
        prepare_out(out)
        prof = profile_model(
            args.repository,
            args.model,
            budget_ms=args.latency_budget_ms,
            sizes=args.batch_sizes,
            threads=args.threads,
            device=args.device,
            seq_len=args.seq_len,
            rounds=args.rounds,
            window_s=args.window_s,
        )
    except PlazaError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_profile(prof))
    for path in write_profile(prof, out):
        print(f"wrote {path}")
    return 0


def _check_profile_args(args: argparse.Namespace) -> None:
    """ValueError for a flag that makes no sense, before any model is loaded (the batch
    sizes are checked against the model's max_batch_size by ``profile_model``)."""
    if args.rounds < 1 or args.seq_len < 1:
        raise ValueError("--rounds and --seq-len must be at least 1")
    if args.threads < 0 or not args.window_s >= 0:
        raise ValueError("--threads and --window-s must be >= 0")
    if args.latency_budget_ms is not None and not args.latency_budget_ms > 0:
        raise ValueError(f"--latency-budget-ms must be > 0, got {args.latency_budget_ms:g}")


# -- simulate -------------------------------------------------------------------------------


def simulate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="plaza simulate",
        description="Headless scheduling simulator: Plaza's DynamicBatcher on a simulated "
        "clock, with an arrival process and a batch latency model.",
    )
    p.add_argument("--model", help="take batching (and a*n+b of a plaza_simulated model) from it")
    p.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    p.add_argument("--profile", type=Path, help="latency from a `plaza profile` JSON")
    p.add_argument("--latency-a-us", type=float, help="per-row latency (with --latency-b-us)")
    p.add_argument("--latency-b-us", type=float, default=0.0, help="per-batch latency")
    p.add_argument("--max-batch-size", type=int)
    p.add_argument("--preferred-batch-sizes", type=_ints)
    p.add_argument("--max-queue-delay-us", type=int)
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate", help="requests/s, e.g. 500 or 100:1000:100")
    load.add_argument("--concurrency", help="closed-loop clients, e.g. 16 or 1:64:x2")
    p.add_argument("--distribution", choices=DISTRIBUTIONS, default="poisson")
    p.add_argument("--burst-size", type=int, default=16)
    p.add_argument(
        "--overhead-ms",
        type=float,
        default=0.0,
        help="round trip outside the worker (closed loop re-send delay)",
    )
    p.add_argument(
        "--instances",
        type=int,
        help="model instances (default: the model's instance_group count, which one worker "
        "runs: one batcher feeding them, shared routing); given, each is a worker process of "
        "its own unless --routing shared",
    )
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument(
        "--routing",
        choices=("partitioned", "shared"),
        help="partitioned: a batcher per instance, each owning some partitions; shared: one "
        "batcher for all (default: shared when the count is the model's instance_group, "
        "else partitioned)",
    )
    p.add_argument("--max-pending", type=int, default=1024)
    p.add_argument("--rows", type=int, default=1, help="rows per request")
    p.add_argument("--duration-s", type=float, default=30.0)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--max-events",
        type=int,
        default=MAX_EVENTS,
        help="stop a run after this many events (reported as truncated, exit status 1)",
    )
    p.add_argument("--out", type=Path, help="write OUT.json and OUT.png (one per load point)")
    p.add_argument("--no-plot", action="store_true")
    return p


def _sim_policy_and_latency(
    args: argparse.Namespace,
) -> tuple[BatchingPolicy, LatencyModel, int, Routing]:
    """The policy, latency model, instance count and routing a simulation runs with."""
    policy, instances = BatchingPolicy(max_batch_size=32), 1
    latency: LatencyModel | None = None
    if args.model:
        ensure_version_folder(args.repository, args.model)
        spec = ModelRepository(args.repository).spec(args.model)
        policy, instances = BatchingPolicy.from_spec(spec), spec.instance_count
        if args.profile is None and args.latency_a_us is None:
            latency = LinearLatency.from_spec(spec)
    overrides: dict[str, Any] = {
        "max_batch_size": args.max_batch_size,
        "preferred_batch_sizes": tuple(args.preferred_batch_sizes or ()) or None,
        "max_queue_delay_us": args.max_queue_delay_us,
    }
    policy = dataclasses.replace(policy, **{k: v for k, v in overrides.items() if v is not None})
    if args.profile is not None:
        latency = ProfileLatency.from_file(args.profile)
    elif args.latency_a_us is not None:
        latency = LinearLatency(args.latency_a_us, args.latency_b_us)
    if latency is None:
        raise ValueError("give --model (a plaza_simulated one), --profile or --latency-a-us")
    return policy, latency, *_sim_instances(args, instances)


def _sim_instances(args: argparse.Namespace, group_count: int) -> tuple[int, Routing]:
    """``--instances`` and ``--routing`` as given; without ``--instances``, the model's
    instance_group count (1 without a model), which one worker runs: one batcher feeding
    every instance, so shared routing unless ``--routing`` says otherwise."""
    if args.instances is not None:
        return args.instances, args.routing or "partitioned"
    return group_count, args.routing or ("shared" if args.model else "partitioned")


def sim_configs(args: argparse.Namespace) -> list[SimConfig]:
    policy, latency, instances, routing = _sim_policy_and_latency(args)
    common: dict[str, Any] = dict(
        policy=policy,
        latency=latency,
        instances=instances,
        partitions=args.partitions,
        routing=routing,
        max_pending=args.max_pending,
        rows_per_request=args.rows,
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        seed=args.seed,
        overhead_s=args.overhead_ms / 1e3,
        max_events=args.max_events,
    )
    if args.concurrency:
        return [SimConfig(concurrency=int(c), **common) for c in parse_range(args.concurrency)]
    return [
        SimConfig(
            arrivals=ArrivalProcess(r, args.distribution, args.burst_size, args.seed), **common
        )
        for r in parse_range(args.rate or "100")
    ]


def _sim_label(cfg: SimConfig) -> str:
    if cfg.arrivals is not None:
        return f"rate {cfg.arrivals.rate:g}/s {cfg.arrivals.distribution}"
    return f"concurrency {cfg.concurrency}"


def format_simulation(cfg: SimConfig, res: SimResult) -> str:
    lat = res.latency
    hist = " ".join(f"{k}:{v}" for k, v in res.batch_sizes.items())
    rate = "truncated" if res.truncated else f"{res.throughput:>9.1f}/s"
    return (
        f"{_sim_label(cfg):<26} {rate:>11}  p50 {lat.p50_ms:7.2f}  "
        f"p90 {lat.p90_ms:7.2f}  p99 {lat.p99_ms:7.2f} ms  batch {res.mean_batch:5.1f}  "
        f"depth mean {res.depth_mean:7.1f} max {res.depth_max:5d}  "
        f"util {', '.join(f'{u:.2f}' for u in res.utilization)}\n"
        f"    unfinished {res.unfinished}  batches {hist}"
    )


def truncation_warning(cfg: SimConfig, res: SimResult) -> str:
    """What a run stopped by the event limit did not simulate."""
    return (
        f"warning: {_sim_label(cfg)}: stopped at the event limit ({cfg.max_events} events) "
        f"at {res.simulated_s:.3f} s of {cfg.duration_s:g} s simulated, {res.unfinished} "
        "request(s) unfinished: no throughput reported (shorten --duration-s, lower the "
        "load or raise --max-events)"
    )


def run_simulate_cli(argv: Sequence[str] | None = None) -> int:
    args = simulate_parser().parse_args(argv)
    try:
        configs = sim_configs(args)
        if args.out:
            prepare_out(args.out)
    except (PlazaError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    first = configs[0]
    print(
        f"policy: max_batch_size {first.policy.max_batch_size}, preferred "
        f"{list(first.policy.preferred_batch_sizes)}, "
        f"max_queue_delay {first.policy.max_queue_delay_us} us; {first.latency.describe()}; "
        f"{first.instances} instance(s), {first.partitions} partitions, {first.routing}"
    )
    runs = []
    truncated = False
    for cfg in configs:
        res = simulate(cfg)
        print(format_simulation(cfg, res))
        if res.truncated:
            truncated = True
            print(truncation_warning(cfg, res), file=sys.stderr)
        runs.append({"load": _sim_label(cfg), **res.as_dict()})
        if args.out and not args.no_plot:
            try:
                _plot_simulation(cfg, res, args.out)
            except ImportError:
                print("note: matplotlib is not installed; no plot", file=sys.stderr)
                args.no_plot = True
    if args.out:
        path = args.out.with_suffix(".json")
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "latency": first.latency.describe(),
            "policy": dataclasses.asdict(first.policy),
            "instances": first.instances,
            "partitions": first.partitions,
        }
        path.write_text(report_json.dumps({"meta": meta, "runs": runs}) + "\n")
        print(f"wrote {path}")
    return 1 if truncated else 0


def _plot_simulation(cfg: SimConfig, res: SimResult, out: Path) -> None:
    from plaza.loadgen.plots import simulation

    label = _sim_label(cfg)
    slug = label.replace(" ", "-").replace("/", "")
    path = simulation(
        res.depth_series,
        res.batch_sizes,
        out.with_name(f"{out.name}-{slug}.png"),
        f"{label}: {'truncated' if res.truncated else f'{res.throughput:.0f}/s'}, "
        f"p99 {res.latency.p99_ms:.1f} ms",
    )
    print(f"wrote {path}")
